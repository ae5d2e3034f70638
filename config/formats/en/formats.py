"""English date formats for staff pages (Django's FORMAT_MODULE_PATH; the rest are Django's):
day-month-year with the seconds a transcript needs, never US-style month/day."""

DATETIME_FORMAT = "j M Y, H:i:s"
SHORT_DATETIME_FORMAT = "j M Y, H:i"

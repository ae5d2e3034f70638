"""Simplified Chinese date formats for staff pages (Django's FORMAT_MODULE_PATH; the rest are
Django's): year, month, day, then a 24-hour time with seconds."""

DATETIME_FORMAT = "Y年n月j日 H:i:s"
SHORT_DATETIME_FORMAT = "Y年n月j日 H:i"

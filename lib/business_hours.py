"""A store's opening hours (``KEFU_BUSINESS_HOURS``, docs/configuration.md#opening-hours): weekly
hours per weekday in the store's time zone, plus closed dates. Pure: no Django.

The setting is a JSON object::

    {"tz": "Europe/Berlin",                     # an IANA time zone (default UTC)
     "mon": ["09:00-12:30", "13:30-18:00"],     # ranges per weekday: mon tue wed thu fri sat sun;
     "sat": ["10:00-14:00"],                    # a weekday not given, or [], is closed all day;
     "closed": ["2026-12-25", "2027-01-01"]}    # whole days closed (holidays), in the store's zone

A range is ``HH:MM-HH:MM`` with the end after the start (``24:00`` ends at midnight). Unset or
``{}``: always open (:func:`parse` returns None).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
#: How far ahead :meth:`BusinessHours.next_open` looks (days): past a year of holidays.
HORIZON_DAYS = 400


@dataclass(frozen=True)
class BusinessHours:
    """Parsed opening hours: ``tz``; ``week[i]`` the (start, end) minute ranges of weekday ``i``
    (0 = Monday) since midnight; ``closed`` the whole days closed."""

    tz: ZoneInfo
    week: tuple[tuple[tuple[int, int], ...], ...]
    closed: frozenset[date]

    def _ranges(self, day: date) -> tuple[tuple[int, int], ...]:
        return () if day in self.closed else self.week[day.weekday()]

    def is_open(self, when: datetime) -> bool:
        """Whether the store is open at ``when`` (an aware datetime)."""
        local = when.astimezone(self.tz)
        minute = local.hour * 60 + local.minute
        return any(start <= minute < end for start, end in self._ranges(local.date()))

    def next_open(self, when: datetime) -> datetime | None:
        """When the store next opens after ``when`` (aware, in the store's zone); ``when`` itself
        while open. None when no day within ``HORIZON_DAYS`` has hours."""
        local = when.astimezone(self.tz)
        if self.is_open(local):
            return local
        minute = local.hour * 60 + local.minute
        for ahead in range(HORIZON_DAYS):
            day = local.date() + timedelta(days=ahead)
            for start, _end in self._ranges(day):
                if ahead > 0 or start > minute:
                    naive = datetime.combine(day, time(start // 60, start % 60))
                    return naive.replace(tzinfo=self.tz)
        return None


def _minutes(text: str) -> int:
    hours, _, minutes = text.partition(":")
    if not (hours.isdigit() and minutes.isdigit() and len(minutes) == 2):
        raise ValueError(f"{text!r} is not HH:MM")
    value = int(hours) * 60 + int(minutes)
    if int(minutes) > 59 or value > 24 * 60:
        raise ValueError(f"{text!r} is not a time of day")
    return value


def parse(config: dict[str, Any]) -> BusinessHours | None:
    """``config`` (the setting's JSON object, module docstring) as :class:`BusinessHours`; None
    when it is empty (always open). Raises ``ValueError`` naming the bad key or value."""
    if not config:
        return None
    unknown = set(config) - {*DAYS, "tz", "closed"}
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)}: use tz, closed and {', '.join(DAYS)}")
    try:
        tz = ZoneInfo(str(config.get("tz", "UTC")))
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"tz {config.get('tz')!r} is not an IANA time zone such as Europe/Berlin") from None
    week = []
    for day in DAYS:
        ranges = config.get(day, [])
        if not isinstance(ranges, list):
            raise ValueError(f'{day} must be a list of ranges such as ["09:00-17:00"]')
        parsed = []
        for item in ranges:
            start_s, sep, end_s = str(item).partition("-")
            if not sep:
                raise ValueError(f"{day}: {item!r} is not a range such as 09:00-17:00")
            start, end = _minutes(start_s.strip()), _minutes(end_s.strip())
            if end <= start:
                raise ValueError(f"{day}: {item!r} ends before it starts")
            parsed.append((start, end))
        week.append(tuple(sorted(parsed)))
    closed = config.get("closed", [])
    if not isinstance(closed, list):
        raise ValueError('closed must be a list of dates such as ["2026-12-25"]')
    try:
        days = frozenset(date.fromisoformat(str(d)) for d in closed)
    except ValueError as e:
        raise ValueError(f"closed: {e}") from None
    if not any(week):
        raise ValueError("no weekday has opening hours (leave the setting unset for always open)")
    return BusinessHours(tz=tz, week=tuple(week), closed=days)

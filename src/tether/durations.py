"""Ages typed on the command line: ``90s``, ``30min``, ``12h``, ``7d``, ``2w``, ``3mo``, or an ISO date.

One grammar for every option that takes a moment in the past (``audit --since``, ``gc
--older-than``), with no unit that reads two ways: ``m`` could be minutes or months (a user's
``gc --older-than 1m`` deleted the last minute's runs, not the last month's), so it is refused
with a suggestion.
"""

from __future__ import annotations

import datetime as dt
import re

from tether.errors import ConfigError

UNITS = {
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1),
    **dict.fromkeys(("min", "mins", "minute", "minutes"), 60),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3600),
    **dict.fromkeys(("d", "day", "days"), 86400),
    **dict.fromkeys(("w", "week", "weeks"), 7 * 86400),
    **dict.fromkeys(("mo", "month", "months"), 30 * 86400),
}
"""Seconds per unit; a month is 30 days."""
EXAMPLES = "90s, 30min, 12h, 7d, 2w, 3mo (30-day months) or an ISO date like 2025-01-31[T12:00]"
_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*$", re.IGNORECASE)


def age_seconds(text: str, *, option: str) -> float | None:
    """The seconds an age like ``30min`` spans; None when ``text`` is not an age (a date, say).

    Raises:
        ConfigError: for ``m``, which could be minutes or months.
    """
    age = _AGE.match(text)
    if age is None:
        return None
    number, unit = age.group(1), age.group(2).lower()
    if unit == "m":
        raise ConfigError(f"{option} {text!r} is ambiguous: write {number}min for minutes or {number}mo for months")
    return float(number) * UNITS[unit] if unit in UNITS else None


def parse_ago(text: str, *, now: float, option: str) -> float:
    """The Unix time ``text`` names: an age before ``now``, or a date-time (local without a zone).

    Raises:
        ConfigError: naming ``option``, what was typed and what it accepts.
    """
    seconds = age_seconds(text, option=option)
    if seconds is not None:
        try:
            dt.datetime.fromtimestamp(now - seconds)
        except (OverflowError, OSError, ValueError):
            raise ConfigError(f"{option} {text!r} reaches back before the year 1") from None
        return now - seconds
    try:
        return dt.datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise ConfigError(f"{option} {text!r}: expected an age like {EXAMPLES}") from None


__all__ = ["EXAMPLES", "UNITS", "age_seconds", "parse_ago"]

"""Cron schedules as a CronJob's ``spec.schedule`` writes them (pure: parsing, and the next time a schedule fires).

Theory of operation: :func:`parse_schedule` turns the text into a :class:`CronSchedule` (one set of allowed values
per field) or raises :class:`CronError` naming what is wrong; :meth:`CronSchedule.next_after` walks wall-clock time
in the schedule's time zone forward from an instant to the next minute every field allows. Time always comes in as
an argument.

Rules (the standard five-field grammar, as the cron library kube-controller-manager uses reads it):

1. Five fields separated by blanks: minute (0-59), hour (0-23), day of month (1-31), month (1-12 or ``jan``-``dec``)
   and day of week (0-6, Sunday 0, or ``sun``-``sat``); names in any case.
2. A field is a comma-separated list of terms; a term is ``*`` (or ``?``), a value ``a``, a range ``a-b``, each
   optionally followed by ``/step`` (step above 0). ``a/step`` means ``a``-to-the-field's-maximum by ``step``.
   Values outside the field's range, ``a`` above ``b``, and anything else are errors.
3. Descriptors stand for a whole schedule: ``@yearly`` and ``@annually`` (``0 0 1 1 *``), ``@monthly``
   (``0 0 1 * *``), ``@weekly`` (``0 0 * * 0``), ``@daily`` and ``@midnight`` (``0 0 * * *``), ``@hourly``
   (``0 * * * *``). ``@every`` is refused (kube documents only these descriptors).
4. A ``TZ=`` or ``CRON_TZ=`` prefix is refused: a CronJob names its zone in ``spec.timeZone`` (kube's rule).
5. Days: when either day field is unrestricted (it starts with ``*`` or ``?`` and has no step above 1) a day must
   match both fields; otherwise it must match either (cron's traditional OR of day of month and day of week).
6. Wall-clock minutes that do not exist in the zone (the hour skipped when clocks go forward) never fire; a minute
   that occurs twice (clocks go back) fires at its first occurrence. A schedule that matches no day within five
   years (``0 0 30 2 *``) has no next time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ambit.model.errors import CronError

SEARCH_YEARS = 5
"""How far ahead :meth:`CronSchedule.next_after` looks before it decides a schedule never fires."""

DESCRIPTORS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_MONTHS = {name: i + 1 for i, name in enumerate(_MONTH_NAMES)}
_DAYS = {name: i for i, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 6, _DAYS),
)
_TZ_PREFIX = re.compile(r"\s*(CRON_TZ|TZ)=", re.IGNORECASE)
_NUMBER = re.compile(r"[0-9]{1,9}")

__all__ = ["DESCRIPTORS", "CronError", "CronSchedule", "find_zone", "parse_schedule"]


@dataclass(frozen=True, slots=True)
class CronSchedule:
    """The allowed values of each field, and whether each day field is unrestricted (rule 5)."""

    minutes: frozenset[int]
    hours: frozenset[int]
    days_of_month: frozenset[int]
    months: frozenset[int]
    days_of_week: frozenset[int]
    any_day_of_month: bool
    any_day_of_week: bool

    def day_matches(self, day: datetime) -> bool:
        """Rule 5 for one calendar day (``day.weekday()`` is Monday 0; cron's Sunday is 0)."""
        by_month = day.day in self.days_of_month
        by_week = (day.weekday() + 1) % 7 in self.days_of_week
        if self.any_day_of_month or self.any_day_of_week:
            return by_month and by_week
        return by_month or by_week

    def next_after(self, instant: datetime, zone: tzinfo = UTC) -> datetime | None:
        """The first firing strictly after ``instant`` (aware), as an aware UTC time; None if none within
        :data:`SEARCH_YEARS` (rule 6)."""
        local = instant.astimezone(zone).replace(tzinfo=None, second=0, microsecond=0) + timedelta(minutes=1)
        limit = local.replace(year=local.year + SEARCH_YEARS, month=1, day=1, hour=0, minute=0)
        while local < limit:
            if local.month not in self.months:
                local = (local.replace(day=1) + timedelta(days=32)).replace(day=1, hour=0, minute=0)
                continue
            if not self.day_matches(local):
                local = (local + timedelta(days=1)).replace(hour=0, minute=0)
                continue
            if local.hour not in self.hours:
                local = (local + timedelta(hours=1)).replace(minute=0)
                continue
            if local.minute not in self.minutes:
                local += timedelta(minutes=1)
                continue
            fired = _existing(local, zone)
            if fired is not None and fired > instant:
                return fired
            local += timedelta(minutes=1)
        return None


def _existing(wall: datetime, zone: tzinfo) -> datetime | None:
    """``wall`` in ``zone`` as UTC, or None when the zone skips that minute."""
    aware = wall.replace(tzinfo=zone, fold=0)
    back = aware.astimezone(UTC).astimezone(zone).replace(tzinfo=None)
    return aware.astimezone(UTC) if back == wall else None


def parse_schedule(text: str) -> CronSchedule:
    """Rules 1-4: the schedule ``text`` means, or :class:`CronError`."""
    if not isinstance(text, str):
        raise CronError("must be a string")
    if _TZ_PREFIX.match(text):
        raise CronError("cannot use TZ or CRON_TZ in schedule, use timeZone field instead")
    spec = text.strip()
    if spec.startswith("@"):
        if spec.lower().startswith("@every"):
            raise CronError("@every is not supported: use a five-field schedule")
        if spec.lower() not in DESCRIPTORS:
            raise CronError(f"unrecognized descriptor: {spec}")
        spec = DESCRIPTORS[spec.lower()]
    fields = spec.split()
    if len(fields) != len(_FIELDS):
        raise CronError(f"expected exactly 5 fields, found {len(fields)}: {text}")
    parsed = [_field(value, *rule) for value, rule in zip(fields, _FIELDS, strict=True)]
    return CronSchedule(
        minutes=parsed[0][0],
        hours=parsed[1][0],
        days_of_month=parsed[2][0],
        months=parsed[3][0],
        days_of_week=parsed[4][0],
        any_day_of_month=parsed[2][1],
        any_day_of_week=parsed[4][1],
    )


def _field(text: str, what: str, low: int, high: int, names: dict[str, int]) -> tuple[frozenset[int], bool]:
    """Rule 2 for one field: its values, and whether it is unrestricted (rule 5)."""
    values: set[int] = set()
    unrestricted = False
    for term in text.split(","):
        span, slash, step_text = term.partition("/")
        if "/" in step_text:
            raise CronError(f"too many slashes in {what}: {term}")
        step = _number(step_text, f"step in {what}") if slash else 1
        if slash and step < 1:
            raise CronError(f"step in {what} must be a positive number: {term}")
        if span in ("*", "?"):
            start, end = low, high
            unrestricted = unrestricted or step == 1
        else:
            first, dash, last = span.partition("-")
            start = _value(first, what, low, high, names)
            end = _value(last, what, low, high, names) if dash else (high if slash else start)
            if start > end:
                raise CronError(f"beginning of range ({start}) beyond end of range ({end}) in {what}: {term}")
        values.update(range(start, end + 1, step))
    return frozenset(values), unrestricted


def _value(text: str, what: str, low: int, high: int, names: dict[str, int]) -> int:
    if text.lower() in names:
        return names[text.lower()]
    value = _number(text, what)
    if not low <= value <= high:
        raise CronError(f"{what} value {value} out of range [{low}, {high}]")
    return value


def _number(text: str, what: str) -> int:
    if not _NUMBER.fullmatch(text):
        raise CronError(f"invalid {what}: {text!r}")
    return int(text)


def find_zone(name: str) -> tzinfo:
    """The IANA time zone ``name`` names (``spec.timeZone``), or :class:`CronError`. Local names (``Local``, or a
    path) are refused, as kube refuses them: a schedule must not depend on the machine it runs on."""
    if not isinstance(name, str) or not name or name == "Local" or name.startswith(("/", ".")) or ".." in name:
        raise CronError(f"unknown time zone {name}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise CronError(f"unknown time zone {name}") from None

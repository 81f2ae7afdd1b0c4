"""Cron schedules (``ambit.model.cron``): the grammar's rules, the next firing time against a brute-force walk of
every minute, time zones, and that no text makes the parser raise anything but a CronError."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.model.cron import CronError, CronSchedule, find_zone, parse_schedule

START = datetime(2026, 12, 5, 1, 7, 30, tzinfo=UTC)  # a Saturday


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize(
    ("schedule", "after", "expected"),
    [
        ("* * * * *", "2026-12-05T01:07:30", "2026-12-05T01:08:00"),
        ("*/15 * * * *", "2026-12-05T01:07:30", "2026-12-05T01:15:00"),
        ("0 * * * *", "2026-12-05T01:00:00", "2026-12-05T02:00:00"),  # strictly after
        ("@hourly", "2026-12-05T01:07:30", "2026-12-05T02:00:00"),
        ("@daily", "2026-12-05T01:07:30", "2026-12-06T00:00:00"),
        ("@weekly", "2026-12-05T01:07:30", "2026-12-06T00:00:00"),  # Sunday
        ("@monthly", "2026-12-05T01:07:30", "2027-01-01T00:00:00"),
        ("@yearly", "2026-12-05T01:07:30", "2027-01-01T00:00:00"),
        ("30 9 * * mon-fri", "2026-12-05T01:07:30", "2026-12-07T09:30:00"),
        ("0 0 1,15 * *", "2026-12-05T01:07:30", "2026-12-15T00:00:00"),
        ("5/20 * * * *", "2026-12-05T01:07:30", "2026-12-05T01:25:00"),
        ("0 12 * feb *", "2026-12-05T01:07:30", "2027-02-01T12:00:00"),
        ("0 0 29 2 *", "2026-12-05T01:07:30", "2028-02-29T00:00:00"),
        # Both day fields restricted: either matches (the 13th, or a Friday).
        ("0 0 13 * 5", "2026-12-05T01:07:30", "2026-12-11T00:00:00"),
        # Day of week unrestricted: the day of month alone decides.
        ("0 0 13 * *", "2026-12-05T01:07:30", "2026-12-13T00:00:00"),
        ("0 0 13 * ?", "2026-12-05T01:07:30", "2026-12-13T00:00:00"),
    ],
)
def test_the_next_firing_follows_the_grammar(schedule: str, after: str, expected: str) -> None:
    assert parse_schedule(schedule).next_after(at(after)) == at(expected)


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ("CRON_TZ=UTC 0 * * * *", "cannot use TZ or CRON_TZ in schedule, use timeZone field instead"),
        ("TZ=Europe/Paris 0 * * * *", "cannot use TZ or CRON_TZ in schedule"),
        ("* * * *", "expected exactly 5 fields, found 4"),
        ("* * * * * *", "expected exactly 5 fields, found 6"),
        ("60 * * * *", "minute value 60 out of range [0, 59]"),
        ("* 24 * * *", "hour value 24 out of range [0, 23]"),
        ("* * 0 * *", "day of month value 0 out of range [1, 31]"),
        ("* * * 13 *", "month value 13 out of range [1, 12]"),
        ("* * * * 7", "day of week value 7 out of range [0, 6]"),
        ("5-1 * * * *", "beginning of range (5) beyond end of range (1)"),
        ("*/0 * * * *", "must be a positive number"),
        ("1/2/3 * * * *", "too many slashes"),
        ("x * * * *", "invalid minute"),
        ("@fortnightly", "unrecognized descriptor"),
        ("@every 1h", "@every is not supported"),
        ("", "expected exactly 5 fields, found 0"),
    ],
)
def test_a_malformed_schedule_says_what_is_wrong(schedule: str, message: str) -> None:
    with pytest.raises(CronError) as caught:
        parse_schedule(schedule)
    assert message in str(caught.value)


def test_a_schedule_that_never_fires_has_no_next_time() -> None:
    assert parse_schedule("0 0 30 2 *").next_after(START) is None


def test_a_time_zone_moves_the_wall_clock_and_a_skipped_minute_never_fires() -> None:
    paris = find_zone("Europe/Paris")
    assert parse_schedule("0 9 * * *").next_after(START, paris) == at("2026-12-05T08:00:00")
    # 2026-03-29 02:30 does not exist in Paris (clocks go from 02:00 to 03:00): the next is the day after.
    assert parse_schedule("30 2 * * *").next_after(at("2026-03-28T12:00:00"), paris) == at("2026-03-30T00:30:00")
    # 2026-10-25 02:30 happens twice: the first (summer time, UTC+2) fires.
    assert parse_schedule("30 2 25 10 *").next_after(at("2026-10-24T12:00:00"), paris) == at("2026-10-25T00:30:00")


@pytest.mark.parametrize("name", ["Mars/Olympus", "Local", "", "/etc/localtime", "../zoneinfo/UTC"])
def test_an_unknown_or_local_zone_is_refused(name: str) -> None:
    with pytest.raises(CronError, match="unknown time zone"):
        find_zone(name)


def fires_at(schedule: CronSchedule, minute: datetime) -> bool:
    return (
        minute.minute in schedule.minutes
        and minute.hour in schedule.hours
        and minute.month in schedule.months
        and schedule.day_matches(minute)
    )


def term(low: int, high: int) -> st.SearchStrategy[str]:
    value = st.integers(low, high)
    return st.one_of(
        st.just("*"),
        value.map(str),
        st.tuples(value, value).map(lambda p: f"{min(p)}-{max(p)}"),
        st.tuples(st.sampled_from(["*", str(low)]), st.integers(1, 7)).map(lambda p: f"{p[0]}/{p[1]}"),
    )


def field(low: int, high: int) -> st.SearchStrategy[str]:
    return st.lists(term(low, high), min_size=1, max_size=3).map(",".join)


SCHEDULES = st.tuples(field(0, 59), field(0, 23), field(1, 31), field(1, 12), field(0, 6)).map(" ".join)


@settings(max_examples=150, deadline=None)
@given(text=SCHEDULES, offset=st.integers(0, 60 * 24 * 400))
def test_the_next_firing_is_the_first_matching_minute_after_the_instant(text: str, offset: int) -> None:
    schedule = parse_schedule(text)
    instant = START + timedelta(minutes=offset, seconds=offset % 60)
    fired = schedule.next_after(instant)
    if fired is None:
        return
    assert fired > instant and fired.second == 0 and fires_at(schedule, fired)
    minute = instant.replace(second=0, microsecond=0) + timedelta(minutes=1)
    checked = 0
    while minute < fired and checked < 3000:  # no earlier minute fires (within the first two days)
        assert not fires_at(schedule, minute), (text, instant, minute)
        minute += timedelta(minutes=1)
        checked += 1


@settings(max_examples=500)
@given(text=st.text(max_size=40) | SCHEDULES.map(lambda s: s.replace("*", "?", 1)))
def test_no_text_makes_the_parser_raise_anything_but_a_cron_error(text: str) -> None:
    try:
        schedule = parse_schedule(text)
    except CronError:
        return
    schedule.next_after(START)

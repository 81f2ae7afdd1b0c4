"""The mirror's body tee (ambit.waypoint.mirror rule 1): what it keeps, when it gives up, and that every byte it
counted against the process's bound is given back however the request ends."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import pytest

from ambit.waypoint import mirror
from ambit.waypoint.http1 import BodyData, Event, MessageEnded, Signal
from ambit.waypoint.mirror import BodyTee


class Scripted:
    """A client side that yields the given events, then raises ``after`` (if any)."""

    def __init__(self, events: Iterable[Event], after: BaseException | None = None) -> None:
        self.events = list(events)
        self.after = after

    async def next_event(self, *, head: bool = False) -> Event:
        if not self.events:
            assert self.after is not None
            raise self.after
        return self.events.pop(0)

    async def continue_if_waited(self) -> None: ...
    async def start_response(
        self,
        status: int,
        headers: Iterable[tuple[str, str]],
        reason: str = "",
        *,
        body: bytes = b"",
        end: bool = False,
        trailers: Iterable[tuple[str, str]] = (),
    ) -> None: ...
    async def send_body(self, data: bytes) -> None: ...
    async def end_response(self, trailers: Iterable[tuple[str, str]] = ()) -> None: ...
    async def answer(self, status: int, headers: Iterable[tuple[str, str]], body: bytes) -> None: ...
    def abort(self) -> None: ...

    @property
    def response_started(self) -> bool:
        return False


async def drain(tee: BodyTee, count: int) -> None:
    for _ in range(count):
        await tee.next_event()


async def test_a_whole_body_is_kept_with_its_trailers_and_the_bound_given_back() -> None:
    tee = BodyTee(Scripted([BodyData(b"ab"), BodyData(b"cd"), MessageEnded((("x-t", "1"),))]))
    await drain(tee, 3)
    assert tee.body.result() == (b"abcd", (("x-t", "1"),))
    assert BodyTee.held == 0


async def test_a_body_over_the_bound_is_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mirror, "MAX_MIRROR_BODY", 3)
    tee = BodyTee(Scripted([BodyData(b"ab"), BodyData(b"cd"), MessageEnded()]))
    await drain(tee, 3)
    assert tee.body.result() is None and BodyTee.held == 0


async def test_the_process_bound_is_shared_by_every_tee(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mirror, "MAX_MIRROR_BODIES", 5)
    first = BodyTee(Scripted([BodyData(b"abcd"), MessageEnded()]))
    second = BodyTee(Scripted([BodyData(b"xy"), MessageEnded()]))
    await first.next_event()
    assert BodyTee.held == 4
    await drain(second, 2)
    assert second.body.result() is None  # 4 + 2 > 5
    await first.next_event()
    assert first.body.result() == (b"abcd", ()) and BodyTee.held == 0


@pytest.mark.parametrize("ending", ["signal", "error", "abandoned"])
async def test_a_body_that_breaks_off_gives_back_what_it_kept(ending: str) -> None:
    if ending == "signal":
        tee = BodyTee(Scripted([BodyData(b"ab"), Signal.CLOSED]))
        await drain(tee, 2)
    elif ending == "error":
        tee = BodyTee(Scripted([BodyData(b"ab")], after=ConnectionResetError()))
        await tee.next_event()
        with pytest.raises(ConnectionResetError):
            await tee.next_event()
    else:  # the real request stopped reading; the mirror's wait gives up for it
        tee = BodyTee(Scripted([BodyData(b"ab")]))
        await tee.next_event()
        assert BodyTee.held == 2
        tee.give_up()
    assert tee.body.result() is None and BodyTee.held == 0
    await asyncio.sleep(0)

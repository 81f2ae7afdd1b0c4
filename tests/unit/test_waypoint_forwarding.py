"""The replay buffer of a forwarded request (ambit.waypoint.forwarded_request.ReplayBuffer): a client's body is kept for
a retry while it fits the replay bound, and never more than that is held."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ambit.waypoint.forwarded_request import ReplayBuffer
from ambit.waypoint.retries import REPLAY_LIMIT


@given(st.lists(st.integers(min_value=1, max_value=40 * 1024), max_size=12))
def test_the_buffer_keeps_the_whole_body_while_it_fits_and_nothing_after(sizes: list[int]) -> None:
    buffer = ReplayBuffer()
    sent = b""
    for index, size in enumerate(sizes):
        chunk = bytes([index % 256]) * size
        buffer.add(chunk)
        sent += chunk
        assert sum(len(c) for c in buffer.chunks) <= REPLAY_LIMIT
        assert buffer.total == len(sent)
        if len(sent) <= REPLAY_LIMIT:
            assert buffer.replayable and b"".join(buffer.chunks) == sent
        else:
            assert not buffer.replayable and buffer.chunks == []


def test_a_body_of_exactly_the_bound_is_replayable_one_byte_more_is_not() -> None:
    buffer = ReplayBuffer()
    buffer.add(b"a" * REPLAY_LIMIT)
    assert buffer.replayable
    buffer.add(b"b")
    assert not buffer.replayable and not buffer.chunks
    buffer.add(b"c")  # the rest streams on; nothing is kept again
    assert not buffer.replayable and not buffer.chunks and buffer.total == REPLAY_LIMIT + 2


def test_release_drops_what_was_kept() -> None:
    buffer = ReplayBuffer()
    buffer.add(b"abc")
    buffer.release()
    assert not buffer.replayable and not buffer.chunks and buffer.total == 3

"""The socket TLS transport's write bookkeeping (:mod:`ambit.tls.write_backlog`), against a model OpenSSL that
takes some chunks and refuses others, in any order hypothesis finds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.tls.write_backlog import WriteBacklog


def test_a_refused_chunk_is_offered_again_as_it_was_before_anything_appended_later() -> None:
    backlog = WriteBacklog(high=1 << 20, chunk_size=64)
    backlog.append(b"a" * 10)
    backlog.append(b"b" * 10)
    first = backlog.next_chunk()
    assert first == b"a" * 10 + b"b" * 10
    backlog.append(b"c" * 10)  # arrives while OpenSSL holds the first chunk's records
    assert backlog.next_chunk() is first
    assert not backlog.sent(len(first))
    assert backlog.next_chunk() == b"c" * 10


def test_a_write_refused_with_nothing_buffered_leads_and_is_not_joined_with_what_follows() -> None:
    backlog = WriteBacklog(high=1 << 20, chunk_size=64)
    refused = b"r" * 5
    assert not backlog.refused(refused)
    backlog.append(b"s" * 5)
    assert backlog.next_chunk() is refused
    backlog.sent(5)
    assert backlog.next_chunk() == b"s" * 5


def test_a_refusal_with_bytes_already_buffered_is_a_bug_of_the_shell() -> None:
    backlog = WriteBacklog()
    backlog.append(b"x")
    with pytest.raises(ValueError, match="already buffered"):
        backlog.refused(b"y")


def test_crossing_high_pauses_once_and_coming_down_to_low_resumes_once() -> None:
    backlog = WriteBacklog(high=100, low=20, chunk_size=100)  # the first buffer is large: offered alone
    assert not backlog.append(b"x" * 100)  # at the mark is not above it
    assert backlog.append(b"x" * 1)
    assert not backlog.append(b"x" * 50)  # already paused: said once
    chunk = backlog.next_chunk()
    assert chunk is not None and len(chunk) == 100
    assert not backlog.sent(100)  # 51 left, above low
    chunk = backlog.next_chunk()
    assert chunk is not None
    assert backlog.sent(len(chunk))  # 0 left
    assert not backlog.paused and backlog.size == 0


def test_lowering_the_limits_below_what_is_buffered_pauses_at_once() -> None:
    backlog = WriteBacklog(high=1000)
    backlog.append(b"x" * 500)
    assert backlog.set_limits(high=100)
    assert backlog.low == 25


def test_limits_out_of_order_are_refused() -> None:
    with pytest.raises(ValueError):
        WriteBacklog().set_limits(high=10, low=20)


def test_sent_more_than_offered_is_refused() -> None:
    backlog = WriteBacklog()
    backlog.append(b"abc")
    backlog.next_chunk()
    with pytest.raises(ValueError):
        backlog.sent(4)


_steps = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 300)),
        st.tuples(st.just("take"), st.integers(0, 100)),  # OpenSSL takes this percentage of the chunk (0: refuses)
        st.tuples(st.just("limits"), st.integers(0, 400)),
        st.tuples(st.just("hold"), st.integers(0, 300)),  # the native record layer now holds this much ciphertext
    ),
    max_size=60,
)


@given(_steps, st.integers(1, 400), st.integers(1, 512))
def test_bytes_leave_in_order_and_pauses_alternate_with_resumes(
    steps: list[tuple[str, int]], high: int, chunk_size: int
) -> None:
    backlog = WriteBacklog(high=high, chunk_size=chunk_size)
    appended, left = bytearray(), bytearray()
    offered: bytes | None = None
    paused = False
    counter = held = 0
    for op, value in steps:
        if op == "append":
            data = bytes((counter + i) % 251 for i in range(value))
            counter += value
            appended += data
            if backlog.append(data):
                assert not paused
                paused = True
        elif op == "limits":
            if backlog.set_limits(high=value):
                assert not paused
                paused = True
        elif op == "hold":
            held = value
            if backlog.hold(value):
                assert not paused
                paused = True
            elif backlog.released():
                assert paused
                paused = False
        else:
            chunk = backlog.next_chunk()
            if chunk is None:
                assert backlog.size == held  # nothing but what is held outside
                continue
            if offered is not None:
                assert chunk is offered  # rule 1: a refused chunk comes back unchanged
            count = len(chunk) * value // 100
            if count == 0:
                offered = chunk
                continue
            offered = None
            left += chunk[:count]
            if backlog.sent(count):
                assert paused
                paused = False
        # Rule 4: everything appended is buffered or sent, once; and what is held outside counts.
        assert backlog.size == len(appended) - len(left) + held and backlog.held == held
        assert paused == backlog.paused
        if paused:
            assert backlog.size > 0  # a paused protocol always has bytes whose sending will resume it
    backlog.hold(0)
    backlog.released()
    while (chunk := backlog.next_chunk()) is not None:
        left += chunk
        backlog.sent(len(chunk))
    assert bytes(left) == bytes(appended)  # rule 2: in order, nothing lost, nothing twice
    assert backlog.size == 0 and not backlog.paused


def test_bytes_held_outside_count_towards_pausing_and_resuming() -> None:
    backlog = WriteBacklog(high=100, low=20)
    assert not backlog.hold(100)
    assert backlog.hold(150)  # above high: pause, once
    assert not backlog.hold(160) and not backlog.released()
    backlog.append(b"x" * 10)  # plaintext behind the held ciphertext
    assert backlog.size == 170 and backlog.plain == 10
    assert not backlog.hold(15) and not backlog.released()  # 25: still above low
    chunk = backlog.next_chunk()
    assert chunk == b"x" * 10
    assert backlog.sent(10, held=12)  # the chunk became 12 bytes of ciphertext: 12 <= low, resume
    assert backlog.size == 12 and backlog.plain == 0
    with pytest.raises(ValueError):
        backlog.hold(-1)
    backlog.clear()
    assert backlog.size == backlog.held == 0


def test_a_refusal_with_only_ciphertext_held_is_no_bug() -> None:
    backlog = WriteBacklog()
    backlog.hold(50)
    assert not backlog.refused(b"y" * 5)
    assert backlog.size == 55 and backlog.next_chunk() == b"y" * 5

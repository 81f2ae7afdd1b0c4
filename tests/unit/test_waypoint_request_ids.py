"""The waypoint's ``x-request-id`` source: text identical to ``uuid.UUID(bytes=b, version=4)`` of the same bytes."""

from __future__ import annotations

import os
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.waypoint import request_ids
from ambit.waypoint.request_ids import BATCH, RequestIds


def _ids_from(monkeypatch: pytest.MonkeyPatch, batches: list[bytes]) -> RequestIds:
    feed = iter(batches)
    monkeypatch.setattr(request_ids.os, "urandom", lambda n: next(feed)[:n])
    return RequestIds()


@given(st.lists(st.binary(min_size=16, max_size=16), min_size=1, max_size=8))
def test_each_id_is_the_version_4_uuid_of_its_sixteen_bytes(chunks: list[bytes]) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        ids = _ids_from(monkeypatch, [b"".join(chunks).ljust(16 * BATCH, b"\0")])
        for chunk in chunks:
            assert ids.next() == str(uuid.UUID(bytes=chunk, version=4))


def test_ids_parse_as_rfc_version_4_uuids() -> None:
    ids = RequestIds()
    for _ in range(300):
        parsed = uuid.UUID(ids.next())
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122


def test_a_new_batch_is_read_when_one_is_used_up_and_no_byte_serves_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = os.urandom(16 * BATCH), os.urandom(16 * BATCH)
    ids = _ids_from(monkeypatch, [first, second])
    made = [ids.next() for _ in range(BATCH + 1)]
    assert made[0] == str(uuid.UUID(bytes=first[:16], version=4))
    assert made[BATCH - 1] == str(uuid.UUID(bytes=first[-16:], version=4))
    assert made[BATCH] == str(uuid.UUID(bytes=second[:16], version=4))
    assert len(set(made)) == len(made)


def test_a_forked_child_does_not_reuse_the_parents_batch() -> None:
    ids = RequestIds()
    ids.next()
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(reader)
        os.write(writer, ids.next().encode())
        os._exit(0)
    os.close(writer)
    child = os.read(reader, 64).decode()
    os.close(reader)
    os.waitpid(pid, 0)
    assert child != ids.next()

"""Opening requests the xDS server reads at once (issue 22's restart: every node proxy reconnects naming ~110,000 held
versions, ~6.5 MB): an admitted stream does not ask gRPC for its opening request before one of ``openings`` slots is
free, gives the slot back once the request is decided (not when its answer is written), and a stream that takes too
long to send it is ended. Driven through the service's own stream handler with in-memory calls."""

from __future__ import annotations

import asyncio
import platform
import time
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest
from google.protobuf import any_pb2

from ambit.api import discovery_pb2 as dpb
from ambit.xds import service as xds_service
from ambit.xds.callers import Caller
from ambit.xds.convert import ADDRESS_TYPE_URL
from ambit.xds.opening import Reconnect, parse_request
from ambit.xds.resource_set import ResourceSet, XdsResource
from ambit.xds.server_trim import TrimPolicy, find_malloc_trim
from ambit.xds.service import XdsService

NAMES = [f"Kubernetes//Pod/ns/pod-{i:03d}" for i in range(50)]


class Call:
    """One stream as the handler sees it: requests are handed over by the test; writes can be held back."""

    def __init__(self, *, writes_block: bool = False) -> None:
        self.requests: asyncio.Queue[dpb.DeltaDiscoveryRequest] = asyncio.Queue()
        self.reading = False
        self.written: list[Any] = []
        self.aborted: tuple[Any, str] | None = None
        self._writes = asyncio.Event()
        if not writes_block:
            self._writes.set()

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", "Bearer node"),)

    async def read(self) -> dpb.DeltaDiscoveryRequest:
        self.reading = True
        try:
            return await self.requests.get()
        finally:
            self.reading = False

    async def write(self, response: Any) -> None:
        await self._writes.wait()
        self.written.append(response)

    async def abort(self, code: Any, details: str, trailing_metadata: Any = ()) -> None:
        self.aborted = (code, details)
        raise grpc.aio.AbortError()


class Source:
    """A fixed set of Addresses."""

    def __init__(self) -> None:
        self.current = ResourceSet.build(XdsResource.built(n, "v1", any_pb2.Any()) for n in NAMES)

    def add_listener(self, listener: object) -> None:
        pass

    def remove_listener(self, listener: object) -> None:
        pass


def _service(openings: int) -> XdsService:
    return XdsService(Source(), lambda metadata: Caller("node"), openings=openings)


def _answer(call: Call) -> dpb.DeltaDiscoveryResponse:
    (written,) = call.written
    return dpb.DeltaDiscoveryResponse.FromString(written.data())


def _reconnect() -> dpb.DeltaDiscoveryRequest:
    return dpb.DeltaDiscoveryRequest(type_url=ADDRESS_TYPE_URL, initial_resource_versions=dict.fromkeys(NAMES, "v1"))


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_only_openings_streams_read_their_opening_request_at_once() -> None:
    service = _service(openings=2)
    calls = [Call() for _ in range(5)]
    handlers = [asyncio.create_task(service._stream(None, call)) for call in calls]
    try:
        await _settle()
        assert sum(call.reading for call in calls) == 2  # the other three have not asked for a byte
        for answered in range(1, 6):
            reading = next(call for call in calls if call.reading and not call.written)
            reading.requests.put_nowait(_reconnect())
            await _settle()
            assert not _answer(reading).resources  # answered: in sync, nothing resent
            assert reading.reading  # and reading again (its ACK), without a slot
            assert sum(call.reading and not call.written for call in calls) == min(2, 5 - answered)
        assert all(len(call.written) == 1 for call in calls)
        assert service.stats.streams == 5
    finally:
        for handler in handlers:
            handler.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)


async def test_an_opening_whose_answer_is_slow_to_write_gives_its_slot_back_once_decided() -> None:
    service = _service(openings=1)
    slow, next_one = Call(writes_block=True), Call()
    handlers = [asyncio.create_task(service._stream(None, call)) for call in (slow, next_one)]
    try:
        await _settle()
        assert slow.reading and not next_one.reading
        slow.requests.put_nowait(dpb.DeltaDiscoveryRequest(type_url=ADDRESS_TYPE_URL))  # a new proxy: everything
        await _settle()
        assert not slow.written  # its answer is still being written ...
        assert next_one.reading  # ... and the next opening is read meanwhile
    finally:
        for handler in handlers:
            handler.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)


async def test_a_stream_that_holds_a_slot_without_sending_its_opening_is_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(xds_service, "OPENING_READ_TIMEOUT", 0.05)
    service = _service(openings=1)
    silent, honest = Call(), Call()
    first = asyncio.create_task(service._stream(None, silent))
    await _settle()
    second = asyncio.create_task(service._stream(None, honest))
    try:
        with pytest.raises(grpc.aio.AbortError):
            await asyncio.wait_for(first, 2.0)
        assert silent.aborted is not None and silent.aborted[0] == grpc.StatusCode.DEADLINE_EXCEEDED
        await _settle()
        assert honest.reading  # the slot came back
        honest.requests.put_nowait(_reconnect())
        await _settle()
        assert not _answer(honest).resources
        assert service.admission.held == 1  # the ended stream left admission too
    finally:
        second.cancel()
        await asyncio.gather(second, return_exceptions=True)


def _wire_reconnect() -> Reconnect:
    parsed = parse_request(_reconnect().SerializeToString())
    assert isinstance(parsed, Reconnect)
    return parsed


def test_a_trim_is_due_once_per_burst_of_opening_bytes_and_never_while_one_runs() -> None:
    policy = TrimPolicy(after_bytes=100)
    policy.read(60)
    assert not policy.idle()  # below the threshold: the bytes keep counting
    policy.read(60)
    assert policy.idle() and policy.running and policy.pending == 0
    policy.read(500)
    assert not policy.idle()  # one at a time
    policy.trimmed()
    assert policy.idle()  # what was read meanwhile counts towards the next
    policy.trimmed()
    assert not policy.idle()


async def test_free_memory_is_given_back_once_after_the_last_opening_of_a_burst() -> None:
    trims: list[int] = []
    size = len(_wire_reconnect().versions.data)

    def malloc_trim() -> int:
        trims.append(1)
        return 1

    service = XdsService(
        Source(),
        lambda metadata: Caller("node"),
        openings=2,
        trim=TrimPolicy(after_bytes=2 * size, quiet=0.02),
        malloc_trim=malloc_trim,
    )
    calls = [Call() for _ in range(4)]
    handlers = [asyncio.create_task(service._stream(None, call)) for call in calls]
    try:
        await _settle()
        for count in range(4):
            reading = next(call for call in calls if call.reading and not call.written)
            reading.requests.put_nowait(_wire_reconnect())  # type: ignore[arg-type]  # as the deserializer gives it
            await _settle()
            assert not _answer(reading).resources
            if count == 1:
                await asyncio.sleep(0.05)
            if count < 3:
                assert not trims  # openings still waiting or reading: not yet
        for _ in range(100):
            if service.stats.trims:
                break
            await asyncio.sleep(0.01)
        assert trims == [1] and service.stats.trims == 1  # once for the burst, on a worker thread
        late = Call()
        handlers.append(asyncio.create_task(service._stream(None, late)))
        await _settle()
        late.requests.put_nowait(_wire_reconnect())  # type: ignore[arg-type]
        await _settle()
        await asyncio.sleep(0.05)
        assert trims == [1]  # one more opening is not a burst
    finally:
        for handler in handlers:
            handler.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_this_process_finds_glibcs_malloc_trim() -> None:
    trim = find_malloc_trim()
    assert trim is not None and trim() in (0, 1)


async def test_openings_arriving_one_by_one_trim_once_they_have_stopped_for_the_quiet_time() -> None:
    trims: list[float] = []
    size = len(_wire_reconnect().versions.data)
    service = XdsService(
        Source(),
        lambda metadata: Caller("node"),
        trim=TrimPolicy(after_bytes=size, quiet=0.2),
        malloc_trim=lambda: trims.append(time.monotonic()) or 1,
    )
    handlers = []
    try:
        for _ in range(3):  # each decided before the next arrives: none in flight between them, but not for long
            call = Call()
            handlers.append(asyncio.create_task(service._stream(None, call)))
            await _settle()
            call.requests.put_nowait(_wire_reconnect())  # type: ignore[arg-type]
            await _settle()
            assert not _answer(call).resources
            await asyncio.sleep(0.1)
            assert not trims
        for _ in range(100):
            if service.stats.trims:
                break
            await asyncio.sleep(0.01)
        assert len(trims) == 1 and service.stats.trims == 1
    finally:
        for handler in handlers:
            handler.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)

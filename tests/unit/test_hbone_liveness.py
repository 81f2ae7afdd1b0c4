"""The liveness plan of an HBONE server connection (:mod:`ambit.hbone.liveness`), with time passed in; and the PING
the core sends and the ACK it reports."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.hbone import wire
from ambit.hbone.client import HboneClientConnection
from ambit.hbone.errors import HboneError
from ambit.hbone.events import PingAcknowledged
from ambit.hbone.liveness import (
    Expire,
    Expiry,
    LivenessSettings,
    LivenessSettingsError,
    LivenessTimer,
    SendPing,
)
from ambit.hbone.server import HboneServerConnection

SETTINGS = LivenessSettings(preface_timeout=10, idle_timeout=600, keepalive_interval=10, keepalive_timeout=20)


def at(timer: LivenessTimer, now: float, *, heard: bool = False, ready: bool = True, idle_since: float | None = None,
       draining: bool = False) -> SendPing | Expire | None:  # fmt: skip
    return timer.due(now, heard=heard, ready=ready, idle_since=idle_since, draining=draining)


def test_a_client_that_never_starts_http2_expires_at_the_preface_deadline() -> None:
    timer = LivenessTimer(SETTINGS, 100.0)
    assert timer.next_at == 110.0
    assert at(timer, 105.0, ready=False, heard=True) is None  # bytes, but not yet the preface and SETTINGS
    assert timer.next_at == 110.0
    assert at(timer, 110.0, ready=False) == Expire(Expiry.PREFACE)
    assert not Expire(Expiry.PREFACE).graceful


def test_a_connection_without_a_stream_expires_gracefully_after_the_idle_timeout() -> None:
    timer = LivenessTimer(LivenessSettings(idle_timeout=30, keepalive_interval=0), 0.0)
    assert at(timer, 1.0, idle_since=0.0) is None
    assert timer.next_at == 30.0
    action = at(timer, 30.0, idle_since=0.0)
    assert action == Expire(Expiry.IDLE) and action.graceful


def test_an_open_stream_keeps_the_idle_timer_off_however_long() -> None:
    timer = LivenessTimer(LivenessSettings(idle_timeout=30, keepalive_interval=0), 0.0)
    for now in (1.0, 31.0, 1000.0, 10_000.0):
        assert at(timer, now, idle_since=None) is None
        assert timer.next_at > now
    assert at(timer, 10_005.0, idle_since=10_000.0) is None  # its last stream ended at 10,000
    assert timer.next_at == 10_030.0
    assert at(timer, 10_030.0, idle_since=10_000.0) == Expire(Expiry.IDLE)


def test_a_draining_connection_is_not_timed_idle_again() -> None:
    timer = LivenessTimer(LivenessSettings(idle_timeout=30, keepalive_interval=0), 0.0)
    assert at(timer, 100.0, idle_since=0.0, draining=True) is None


def test_a_silent_peer_is_pinged_and_dropped_when_the_ack_does_not_come() -> None:
    timer = LivenessTimer(SETTINGS, 0.0)
    assert at(timer, 1.0, heard=True, idle_since=None) is None
    assert timer.next_at == 11.0
    ping = at(timer, 11.0, idle_since=None)
    assert isinstance(ping, SendPing) and len(ping.payload) == 8
    assert timer.next_at == 31.0
    assert at(timer, 31.0, idle_since=None) == Expire(Expiry.KEEPALIVE)


def test_bytes_while_a_ping_waits_count_as_its_answer() -> None:
    """Our shell stops reading while its output is backed up, so an ACK may sit unread behind the bytes of a peer
    that is alive (or the drain of our output says it took our bytes): either is the answer."""
    timer = LivenessTimer(SETTINGS, 0.0)
    assert isinstance(at(timer, 10.0, idle_since=None), SendPing)
    assert at(timer, 20.0, heard=True, idle_since=None) is None
    assert timer.next_at == 30.0  # silence since 20: a new PING, not the first one's expiry
    assert isinstance(at(timer, 30.0, idle_since=None), SendPing)
    assert at(timer, 50.0, idle_since=None) == Expire(Expiry.KEEPALIVE)


def test_an_answered_ping_keeps_the_connection_and_the_next_waits_for_silence() -> None:
    timer = LivenessTimer(SETTINGS, 0.0)
    first = at(timer, 10.0, idle_since=None)
    assert isinstance(first, SendPing)
    timer.acknowledged()
    assert at(timer, 12.0, heard=True, idle_since=None) is None  # the ACK's bytes
    assert timer.next_at == 22.0
    second = at(timer, 22.0, idle_since=None)
    assert isinstance(second, SendPing) and second.payload != first.payload


def test_a_peer_whose_bytes_keep_coming_is_never_pinged() -> None:
    timer = LivenessTimer(SETTINGS, 0.0)
    now = 0.0
    for _ in range(100):
        now = timer.next_at
        assert at(timer, now, heard=True, idle_since=None) is None
    assert now >= 1000.0


def test_the_idle_deadline_wins_when_it_comes_first_and_keepalive_still_runs_on_a_draining_connection() -> None:
    timer = LivenessTimer(LivenessSettings(idle_timeout=5, keepalive_interval=10, keepalive_timeout=20), 0.0)
    assert at(timer, 1.0, heard=True, idle_since=0.0) is None
    assert timer.next_at == 5.0
    assert at(timer, 5.0, idle_since=0.0) == Expire(Expiry.IDLE)
    assert isinstance(at(timer, 11.0, idle_since=None, draining=True), SendPing)
    assert at(timer, 31.0, idle_since=None, draining=True) == Expire(Expiry.KEEPALIVE)


@pytest.mark.parametrize(
    "values",
    [
        {"preface_timeout": 0},
        {"idle_timeout": -1},
        {"keepalive_interval": math.inf},
        {"keepalive_timeout": math.nan},
        {"keepalive_interval": 5, "keepalive_timeout": 0},
    ],
)
def test_deadlines_that_cannot_work_are_refused(values: dict[str, float]) -> None:
    with pytest.raises(LivenessSettingsError):
        LivenessSettings(**values)


@given(
    st.lists(
        st.tuples(st.floats(0, 50), st.booleans(), st.booleans(), st.one_of(st.none(), st.floats(0, 1)), st.booleans()),
        max_size=40,
    )
)
def test_the_timer_never_asks_to_be_called_in_the_past_and_expires_only_at_a_deadline(
    steps: list[tuple[float, bool, bool, float | None, bool]],
) -> None:
    settings = LivenessSettings(preface_timeout=3, idle_timeout=7, keepalive_interval=2, keepalive_timeout=4)
    timer = LivenessTimer(settings, 0.0)
    now = 0.0
    for step, heard, ready, idle_fraction, acked in steps:
        now += step
        idle_since = None if idle_fraction is None else now * idle_fraction
        action = at(timer, now, heard=heard, ready=ready, idle_since=idle_since)
        if isinstance(action, Expire):
            if action.expiry is Expiry.PREFACE:
                assert not ready and now >= settings.preface_timeout
            elif action.expiry is Expiry.IDLE:
                assert idle_since is not None and now - idle_since >= settings.idle_timeout
            return
        assert timer.next_at > now
        if acked:
            timer.acknowledged()


# --- the core's PING ---------------------------------------------------------------------------------------------


def connected_pair() -> tuple[HboneClientConnection, HboneServerConnection]:
    client, server = HboneClientConnection(), HboneServerConnection()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())
    return client, server


def test_the_server_knows_when_the_client_has_started_http2() -> None:
    client, server = HboneClientConnection(), HboneServerConnection()
    assert not server.peer_ready
    preface_and_settings = client.data_to_send()
    server.receive_data(preface_and_settings[: len(wire.PREFACE)])
    assert not server.peer_ready  # the preface alone is not enough: SETTINGS must follow
    server.receive_data(preface_and_settings[len(wire.PREFACE) :])
    assert server.peer_ready


def test_a_ping_s_ack_is_reported_once_and_unsolicited_or_stale_acks_are_dropped() -> None:
    client, server = connected_pair()
    server.ping(b"\0\0\0\0\0\0\0\1")
    client.receive_data(server.data_to_send())
    assert server.receive_data(client.data_to_send()) == [PingAcknowledged(b"\0\0\0\0\0\0\0\1")]
    unsolicited = wire.frame(wire.PING, wire.ACK, 0, b"12345678")
    assert server.receive_data(unsolicited) == []
    server.ping(b"\0\0\0\0\0\0\0\2")
    server.ping(b"\0\0\0\0\0\0\0\3")  # only the last one is awaited
    client.receive_data(server.data_to_send())
    assert server.receive_data(client.data_to_send()) == [PingAcknowledged(b"\0\0\0\0\0\0\0\3")]
    with pytest.raises(HboneError):
        server.ping(b"short")

"""The HBONE core's relay fast paths give the same wire and the same flow control as the general calls.

``send_data_now`` is ``send_data`` then ``data_to_send`` in one call: for any writes, windows and consumption in
between, the bytes it returns and the pending count are exactly those of the two calls on a twin connection.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ambit.hbone import DataReceived, HboneClientConnection, HboneServerConnection, HboneSettings

KiB = 1024
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Twin:
    """A client and a server joined in memory, with one open tunnel; the server consumes what it is told to."""

    def __init__(self, server_settings: HboneSettings) -> None:
        self.client = HboneClientConnection(HboneSettings())
        self.server = HboneServerConnection(server_settings)
        self.unconsumed: list[DataReceived] = []
        self.received = b""
        self.pump()
        self.stream_id = self.client.open_tunnel("198.18.200.7:8080")
        self.pump()
        self.server.respond(self.stream_id, 200)
        self.pump()

    def pump(self) -> None:
        while True:
            to_server, to_client = self.client.data_to_send(), self.server.data_to_send()
            if not to_server and not to_client:
                return
            self.deliver(to_server)
            if to_client:
                self.client.receive_data(to_client)

    def deliver(self, data: bytes) -> None:
        """Give the server ``data``; keep the payload it reports."""
        for event in self.server.receive_data(data) if data else []:
            if isinstance(event, DataReceived):
                self.unconsumed.append(event)
                self.received += bytes(event.data)

    def consume(self) -> None:
        for event in self.unconsumed:
            self.server.consumed(event.stream_id, event.flow_length)
        self.unconsumed.clear()
        self.pump()


writes = st.lists(
    st.one_of(
        st.integers(0, 300 * KiB).map(lambda n: ("write", n)),
        st.just(("consume", 0)),
        st.just(("flush", 0)),
    ),
    max_size=12,
)


@PROPERTY
@given(ops=writes, window=st.sampled_from([16 * KiB, 64 * KiB, 4 * 1024 * KiB]), view=st.booleans())
def test_send_data_now_writes_what_send_data_then_data_to_send_write(
    ops: list[tuple[str, int]], window: int, view: bool
) -> None:
    general, fused = Twin(HboneSettings(stream_window=window)), Twin(HboneSettings(stream_window=window))
    sent = b""
    for step, (op, n) in enumerate(ops):
        if op == "consume":
            general.consume()
            fused.consume()
            continue
        if op == "flush":  # the peer sees what is on the wire so far (and may queue WINDOW_UPDATEs)
            general.pump()
            fused.pump()
            continue
        payload = bytes([step % 251]) * n
        data = memoryview(payload) if view else payload
        pending = general.client.send_data(general.stream_id, data)
        expected = general.client.data_to_send()
        out, fused_pending = fused.client.send_data_now(fused.stream_id, data)
        assert (out, fused_pending) == (expected, pending)
        sent += payload
        general.deliver(expected)
        fused.deliver(out)
    for twin in (general, fused):  # what the windows held back is framed as they reopen
        while twin.unconsumed or twin.client.pending_bytes(twin.stream_id):
            twin.consume()
    assert fused.received == general.received == sent

"""Talking to a certificate authority: the errors every CA client raises, and how it retries a CA that is down.

Theory of operation: a CA client (the :class:`~ambit.identity.manager.CaClient` protocol) turns a SPIFFE id into
a :class:`~ambit.tls.workload.WorkloadCertificate`. Whatever goes wrong on the way (the CA refuses, is
unreachable, or answers with a chain that does not name the requested identity) surfaces as one
:class:`CaError` whose message says why, so the certificate manager can back off and retry without knowing the
transport.

:class:`Backoff` is that retry's policy, pure: a capped exponential delay with jitter. The cap is short (5 s) on
purpose: a workload certificate is renewed at half life, so a CA that was down for a while may come back when
certificates are about to expire (or have), and renewal must resume within seconds of its return, not after a
back-off that grew while it was away. Jitter spreads the retries of every node proxy in the cluster, so a CA that
comes back is not met by all of them at once. The channel to the CA (:class:`~ambit.xds.grpc_channel.GrpcChannel`)
has no reconnect back-off of its own: each retry dials again, so it follows this schedule (grpcio's default let its
reconnect back-off grow to 120 s, during which every call failed at once without trying the CA).
"""

from __future__ import annotations

from dataclasses import dataclass

from ambit.errors import AmbitError

MAX_EXPONENT = 64
"""Failures beyond this many do not grow the delay further (it is long capped by then): no float overflow."""


class CaError(AmbitError):
    """Fetching a workload certificate failed; the message says why."""


@dataclass(frozen=True, slots=True)
class Backoff:
    """Capped exponential back-off with jitter: after the ``n``-th failure in a row, wait
    ``min(cap, initial * multiplier ** (n - 1))`` less a random share of up to ``jitter`` of it."""

    initial: float = 0.5
    """Seconds before the first retry (before jitter)."""
    multiplier: float = 2.0
    cap: float = 5.0
    """The longest wait, whatever the number of failures."""
    jitter: float = 0.2
    """The share of each wait taken off at random (0: none; 0.2: a wait falls in ``[0.8 d, d]``)."""

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.cap:
            raise ValueError(f"back-off: need 0 < initial <= cap, got initial {self.initial}, cap {self.cap}")
        if not self.multiplier >= 1:
            raise ValueError(f"back-off: the multiplier must be at least 1, got {self.multiplier}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"back-off: jitter must be in [0, 1), got {self.jitter}")

    def delay(self, failures: int, draw: float) -> float:
        """Seconds to wait after ``failures`` (at least 1) failures in a row; ``draw`` is a uniform random number
        in ``[0, 1)`` (``random.random()``), which picks the jitter."""
        if failures < 1:
            raise ValueError(f"back-off: a delay follows at least one failure, got {failures}")
        if not 0 <= draw < 1:
            raise ValueError(f"back-off: the draw must be in [0, 1), got {draw}")
        base = min(self.cap, self.initial * self.multiplier ** min(failures - 1, MAX_EXPONENT))
        return base * (1 - self.jitter * draw)


CA_BACKOFF = Backoff()
"""How the node proxy and the waypoint retry their CA: from 0.5 s, doubling, at most 5 s, 20% jitter."""

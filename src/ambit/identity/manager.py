"""The node proxy's workload certificates: fetched from the CA, refreshed at half life, forgotten when unused.

Theory of operation (spec §5.2): the proxy holds one :class:`WorkloadCertificate` per SPIFFE id that has pods on
its node. :meth:`CertificateManager.track` is told that set whenever it changes; each new identity gets a
background refresher that fetches at once (low priority, a prefetch), then sleeps until the certificate's
half life and fetches again. A failed fetch is retried with a capped exponential back-off with jitter
(:class:`~ambit.identity.caclient.Backoff`: from 0.5 s up to 5 s) while the old certificate stays in use for as long
as it is valid; once it has expired, :meth:`CertificateManager.find` no longer returns it, so connections needing it
fail (closed: nothing is sent without mTLS) until the CA answers again, at most one back-off (5 s) after its return.
Identities that left the set are forgotten: refresher cancelled, certificate dropped.

A CA rotation reaches the proxy through these refreshes, as in ztunnel: the control plane does not push, and a
rotated plug-in CA signs only the certificates asked for after it (:mod:`ambit.controlplane.ca.cawatch`). So the
bound is: every identity on the node holds a certificate from the new CA at most half a lifetime (the node proxy's
``SECRET_TTL``: 24 h by default, 5 min in Istio's ambient tests, 2 min in the lab) after the control plane took the
new CA, plus the back-off of any failed fetch (at most the back-off's cap). Connections already open keep the
certificate they were made with; new ones use the new certificate and its trust bundle.

A connection that needs a certificate calls :meth:`CertificateManager.fetch`: a valid cached certificate comes
back at once; otherwise it starts (or joins) a fetch at high priority. CA requests run at most
:data:`MAX_CONCURRENT_CA_REQUESTS` at a time and a freed slot goes to the most urgent waiter, so a connection
never queues behind a burst of prefetches. A fetch already queued at low priority is promoted when a connection
joins it.

Invariants:

- At most one CA request per identity is in flight; every caller for that identity shares its outcome.
- Cancelling one caller never cancels the shared request (it is shielded).
- A certificate fetched on demand for an identity that is not tracked is cached but not refreshed, and is
  dropped by the next :meth:`~CertificateManager.track` whose set does not include it.
- Time is read only through the injected clock; waiting is ``asyncio.sleep``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ambit.identity.caclient import CA_BACKOFF, Backoff, CaError
from ambit.model.identity import SpiffeId

if TYPE_CHECKING:
    from ambit.tls.workload import WorkloadCertificate

log = logging.getLogger(__name__)

MAX_CONCURRENT_CA_REQUESTS = 8
"""How many certificate requests may be outstanding at the CA at once."""


class CaClient(Protocol):
    """Anything that turns a SPIFFE id into a fresh certificate (istiod over gRPC, a local CA, a test fake)."""

    async def fetch_certificate(self, identity: SpiffeId) -> WorkloadCertificate: ...


class Priority(enum.IntEnum):
    """Lower is more urgent."""

    HIGH = 0  # a connection is waiting
    LOW = 1  # a prefetch or a refresh


class CertificateManager:
    """Owns the node's workload certificates; see the module docstring."""

    def __init__(
        self,
        ca: CaClient,
        *,
        clock: Callable[[], float] = time.time,
        backoff: Backoff = CA_BACKOFF,
        draw: Callable[[], float] = random.random,
    ) -> None:
        """``backoff`` paces the retries of a failed fetch; ``draw`` picks their jitter (uniform in ``[0, 1)``)."""
        self._ca = ca
        self._clock = clock
        self._backoff = backoff
        self._draw = draw
        self._certs: dict[SpiffeId, WorkloadCertificate] = {}
        self._errors: dict[SpiffeId, str] = {}
        self._inflight: dict[SpiffeId, _Fetch] = {}
        self._tracked: frozenset[SpiffeId] = frozenset()
        self._refreshers: dict[SpiffeId, asyncio.Task[None]] = {}
        self._gate = _PriorityGate(MAX_CONCURRENT_CA_REQUESTS)
        self._closed = False

    def find(self, identity: SpiffeId) -> WorkloadCertificate | None:
        """The cached certificate for ``identity`` unless it has expired; never waits.

        A ``notBefore`` in the future (a CA clock ahead of ours) does not count against it: peers judge that.
        """
        cert = self._certs.get(identity)
        if cert is not None and self._clock() < cert.not_after:
            return cert
        return None

    async def fetch(self, identity: SpiffeId) -> WorkloadCertificate:
        """A valid certificate for ``identity``: the cached one, or one fetched now at high priority.

        Concurrent callers share one CA request. An untracked identity's certificate is cached but not refreshed.
        Raises :class:`CaError` when the CA request fails.
        """
        if (cert := self.find(identity)) is not None:
            return cert
        return await self._shared_fetch(identity, Priority.HIGH)

    def track(self, identities: Iterable[SpiffeId]) -> None:
        """Make ``identities`` the node's set: prefetch and refresh new ones, forget those no longer in it."""
        if self._closed:
            raise CaError("the certificate manager is closed")
        wanted = frozenset(identities)
        for identity in self._tracked - wanted:
            self._refreshers.pop(identity).cancel()
        for identity in [i for i in self._certs if i not in wanted]:
            del self._certs[identity]
        for identity in [i for i in self._errors if i not in wanted]:
            del self._errors[identity]
        for identity, pending in list(self._inflight.items()):
            if identity not in wanted and pending.ticket.priority is Priority.LOW:
                pending.task.cancel()
        for identity in sorted(wanted - self._tracked):  # sorted: a deterministic prefetch order
            self._refreshers[identity] = asyncio.create_task(
                self._refresh_loop(identity), name=f"identity refresh {identity}"
            )
        self._tracked = wanted

    def snapshot(self) -> list[dict[str, Any]]:
        """One ``/config_dump`` ``certificates`` entry per known identity, sorted by identity."""
        now = self._clock()
        entries = []
        for identity in sorted(self._tracked | self._certs.keys() | self._inflight.keys()):
            cert = self._certs.get(identity)
            if cert is not None:
                entry = cert.to_dump(now)
            else:
                entry = {"identity": str(identity), "state": "Initializing", "certChain": [], "rootCerts": []}
            if entry["state"] != "Available" and (error := self._errors.get(identity)):
                entry["state"] = f"Unavailable: {error}"
            entries.append(entry)
        return entries

    async def aclose(self) -> None:
        """Stop every refresher and in-flight request; later fetches fail with :class:`CaError`."""
        self._closed = True
        tasks: list[asyncio.Task[Any]] = [*self._refreshers.values(), *(p.task for p in self._inflight.values())]
        self._refreshers.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _shared_fetch(self, identity: SpiffeId, priority: Priority) -> WorkloadCertificate:
        if self._closed:
            raise CaError("the certificate manager is closed")
        pending = self._inflight.get(identity)
        if pending is None:
            ticket = _Ticket(priority)
            task = asyncio.create_task(self._run_fetch(identity, ticket), name=f"identity fetch {identity}")
            task.add_done_callback(_consume_outcome)
            pending = self._inflight[identity] = _Fetch(ticket, task)
        elif priority < pending.ticket.priority:
            pending.ticket.priority = priority
        return await asyncio.shield(pending.task)

    async def _run_fetch(self, identity: SpiffeId, ticket: _Ticket) -> WorkloadCertificate:
        try:
            async with self._gate.slot(ticket):
                try:
                    cert = await self._ca.fetch_certificate(identity)
                except CaError:
                    raise
                except Exception as exc:
                    raise CaError(f"fetching a certificate for {identity} failed: {exc!r}") from exc
            if cert.identity != identity:
                raise CaError(f"asked the CA for {identity} but got a certificate for {cert.identity}")
        except CaError as exc:
            if identity in self._tracked or ticket.priority is Priority.HIGH:
                self._errors[identity] = str(exc)
            raise
        finally:
            if (pending := self._inflight.get(identity)) is not None and pending.ticket is ticket:
                del self._inflight[identity]
        if identity in self._tracked or ticket.priority is Priority.HIGH:
            self._certs[identity] = cert
            self._errors.pop(identity, None)
        return cert

    async def _refresh_loop(self, identity: SpiffeId) -> None:
        failures = 0
        cert = self.find(identity)
        delay = self._refresh_delay(cert) if cert is not None else 0.0
        while True:
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                cert = await self._shared_fetch(identity, Priority.LOW)
            except CaError as exc:
                failures += 1
                delay = self._backoff.delay(failures, self._draw())
                log.warning("certificate fetch for %s failed, retrying in %.1fs: %s", identity, delay, exc)
                continue
            if failures:
                log.info("certificate for %s fetched after %d failed attempts", identity, failures)
            failures = 0
            delay = self._refresh_delay(cert)

    def _refresh_delay(self, cert: WorkloadCertificate) -> float:
        now = self._clock()
        if cert.refresh_at > now:
            return cert.refresh_at - now
        # Half life already past (a short TTL under a back-dated notBefore): halve what is left, but never spin.
        return max((cert.not_after - now) / 2, self._backoff.initial)


@dataclass(slots=True)
class _Ticket:
    """A place in the CA queue; its priority may be raised while it waits."""

    priority: Priority
    granted: asyncio.Future[None] | None = None


@dataclass(frozen=True, slots=True)
class _Fetch:
    ticket: _Ticket
    task: asyncio.Task[WorkloadCertificate]


class _PriorityGate:
    """A semaphore whose freed slots go to the most urgent waiter, first come first served within a priority."""

    def __init__(self, limit: int) -> None:
        self._free = limit
        self._waiters: list[_Ticket] = []

    @contextlib.asynccontextmanager
    async def slot(self, ticket: _Ticket) -> AsyncIterator[None]:
        await self._acquire(ticket)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, ticket: _Ticket) -> None:
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return
        ticket.granted = asyncio.get_running_loop().create_future()
        self._waiters.append(ticket)
        try:
            await ticket.granted
        except asyncio.CancelledError:
            if ticket in self._waiters:
                self._waiters.remove(ticket)
            elif ticket.granted.done() and not ticket.granted.cancelled():
                self._release()  # handed a slot in the same tick we were cancelled: pass it on
            raise

    def _release(self) -> None:
        if self._waiters:
            # min() keeps the first of equals, so ties go to the oldest waiter.
            ticket = min(self._waiters, key=lambda t: t.priority)
            self._waiters.remove(ticket)
            assert ticket.granted is not None
            ticket.granted.set_result(None)
        else:
            self._free += 1


def _consume_outcome(task: asyncio.Task[WorkloadCertificate]) -> None:
    # Every caller may have been cancelled; reading the outcome keeps asyncio from reporting it as lost.
    if not task.cancelled():
        task.exception()

"""``IstioCertificateService/CreateCertificate``: the mesh CA's gRPC service (spec §5.1, §5.3).

Theory of operation: one request is handled in four steps, any of which may refuse it:

0. **Bound the cost.** A CSR longer than ``max_csr_bytes`` (64 KiB) is refused before anything else is done with
   it (:mod:`~ambit.controlplane.ca.limits`); a request message above :data:`MAX_RECEIVE_MESSAGE_BYTES` is never
   parsed: a server of its own refuses it in gRPC (:data:`GRPC_SERVER_OPTIONS`), and on the control plane's
   shared port, whose gRPC limit is the xDS stream's larger one (:data:`ambit.xds.server.MAX_REQUEST_BYTES`: a
   reconnecting node proxy names every resource it holds), the method's own reader refuses it with
   ``RESOURCE_EXHAUSTED`` before parsing.
1. **Authenticate** the caller from the gRPC metadata (``authorization: Bearer``, ``clusterid``) with the
   injected :class:`Authenticator` (TokenReview, :mod:`~ambit.controlplane.ca.authn`), then charge the caller
   (its service account and bound pod) one request of its token bucket (10/s, burst 50): beyond it,
   ``RESOURCE_EXHAUSTED``.
2. **Choose the identity.** Without ``ImpersonatedIdentity`` in the request's Struct metadata it is the caller's
   own; with it, the injected node authorizer must grant it (:mod:`~ambit.controlplane.ca.nodeauth`). A CA built
   without a node authorizer refuses every impersonation.
3. **Sign** the CSR for that identity. The CSR's one SPIFFE URI SAN must be exactly that identity; the CSR is
   never trusted to choose it. TTL: the requested ``validity_duration``, or 24 h when it is not positive, capped
   at 90 days (:func:`effective_ttl`; spec §5.3 says capped: istiod's own ``Sign`` refuses a longer request with
   ``INVALID_ARGUMENT``, and either way no certificate outlives the cap).
4. **Answer** with the chain flattened to one PEM certificate per element, each ending in a newline, and the
   trust bundle (one root, or the old and new roots during a root rotation) as the last element
   (:func:`flatten_chain`). The CA signing is whatever :class:`RootSigner` holds at that moment (a plug-in CA is
   swapped there when its files change: :mod:`~ambit.controlplane.ca.cawatch`).

:meth:`CaService.create_certificate` is those steps with errors as :class:`CaServerError`; the gRPC method
:meth:`CaService.CreateCertificate` only translates them into statuses: authentication and authorization
failures are ``UNAUTHENTICATED`` with an opaque message (the detail goes to the log), a bad or oversized CSR is
``INVALID_ARGUMENT``, a caller over its rate ``RESOURCE_EXHAUSTED``, anything unexpected ``INTERNAL``. One
request's failure never affects another.

Metrics: an injected :class:`CaObserver` (the control plane's monitoring) is told of every request as it arrives,
of each authentication or impersonation failure, of each CSR that could not be signed for being malformed, too
large or naming another identity, and of each certificate issued (istiod's ``citadel_server_*`` counters).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc  # type: ignore[import-untyped]
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from google.protobuf import struct_pb2

from ambit.api import ca_pb2
from ambit.controlplane.ca.authn import Caller, Metadata
from ambit.controlplane.ca.errors import (
    AuthenticationError,
    AuthorizationError,
    CaServerError,
    CsrError,
    RateLimitedError,
)
from ambit.controlplane.ca.limits import MAX_CSR_BYTES, CallerRateLimiter, RateLimit, check_csr_size
from ambit.controlplane.ca.rootca import RootCa
from ambit.model.identity import DEFAULT_TRUST_DOMAIN, SpiffeId
from ambit.tls.certs import CertificateError
from ambit.tls.issuance import sign_csr
from ambit.xds.keepalive import DEFAULT_KEEPALIVE

log = logging.getLogger(__name__)

SERVICE_NAME = "istio.v1.auth.IstioCertificateService"
METHOD_PATH = f"/{SERVICE_NAME}/CreateCertificate"
IMPERSONATED_IDENTITY = "ImpersonatedIdentity"
DEFAULT_WORKLOAD_CERT_TTL = 24 * 3600
MAX_WORKLOAD_CERT_TTL = 90 * 24 * 3600
MAX_RECEIVE_MESSAGE_BYTES = 1024 * 1024
"""The largest request message the CA's gRPC server reads (gRPC's own default is 4 MiB)."""
GRPC_SERVER_OPTIONS = (
    ("grpc.max_receive_message_length", MAX_RECEIVE_MESSAGE_BYTES),
    *DEFAULT_KEEPALIVE.server_options(),
)
"""Options for a ``grpc.aio.server`` that carries the CA (:class:`ambit.xds.server.XdsServer` takes them): the
message size cap, and keepalive enforcement that lets ztunnel ping every 30 s, also between CA calls."""


@dataclass(frozen=True, slots=True)
class CaSettings:
    """Policy of the CA service."""

    trust_domain: str = DEFAULT_TRUST_DOMAIN
    """The trust domain of every identity this CA signs."""
    default_ttl: int = DEFAULT_WORKLOAD_CERT_TTL
    """Seconds a certificate lives when the request asks for no (or a non-positive) validity."""
    max_ttl: int = MAX_WORKLOAD_CERT_TTL
    """Longest validity granted, whatever the request asks (istiod's ``MAX_WORKLOAD_CERT_TTL``)."""
    rate_limit: RateLimit = field(default_factory=RateLimit)
    """Requests a second, and the burst, each authenticated caller is allowed."""
    max_csr_bytes: int = MAX_CSR_BYTES
    """Longest CSR read; longer ones are refused before parsing."""


class CaObserver(Protocol):
    """What the CA reports for metrics (see the module docstring)."""

    def csr_received(self) -> None: ...
    def authentication_failed(self) -> None: ...
    def csr_malformed(self) -> None: ...
    def certificate_issued(self) -> None: ...


class _NoObserver:
    def csr_received(self) -> None:
        pass

    def authentication_failed(self) -> None:
        pass

    def csr_malformed(self) -> None:
        pass

    def certificate_issued(self) -> None:
        pass


class Authenticator(Protocol):
    async def authenticate(self, metadata: Metadata) -> Caller: ...


class ImpersonationAuthorizer(Protocol):
    async def authorize(self, caller: Caller, requested: str) -> SpiffeId: ...


class Signer(Protocol):
    def sign(self, csr_pem: bytes, identity: SpiffeId, ttl_seconds: int) -> list[bytes]:
        """The PEM chain ``[leaf, ..., root]`` for ``identity``, else :class:`CsrError`."""
        ...


def effective_ttl(requested: int, *, default: int, maximum: int) -> int:
    """The validity granted for a requested ``validity_duration`` (istiod's rule)."""
    ttl = default if requested <= 0 else requested
    return min(ttl, maximum)


def impersonated_identity(metadata: struct_pb2.Struct) -> str | None:
    """The ``ImpersonatedIdentity`` string of the request metadata, if present and non-empty."""
    if IMPERSONATED_IDENTITY not in metadata.fields:
        return None
    value = metadata.fields[IMPERSONATED_IDENTITY]
    if value.WhichOneof("kind") != "string_value":
        raise AuthorizationError(f"{IMPERSONATED_IDENTITY} is not a string")
    return value.string_value or None


def flatten_chain(chain: Sequence[bytes]) -> list[str]:
    """One PEM certificate per element (each ending in a newline), in order, except the last: the trust bundle,
    kept as one element (istiod's answer; a client tells the roots from the chain by position)."""
    flat: list[str] = []
    for index, element in enumerate(chain):
        try:
            certs = x509.load_pem_x509_certificates(element)
        except ValueError as exc:
            raise CaServerError(f"malformed certificate in the signed chain: {exc}") from None
        pems = [cert.public_bytes(serialization.Encoding.PEM).decode("ascii") for cert in certs]
        if index == len(chain) - 1 and index > 0:
            flat.append("".join(pems))
        else:
            flat.extend(pems)
    return flat


class RootSigner:
    """Signs workload CSRs with the mesh CA and ends each chain with the trust bundle.

    :meth:`set_root` swaps the CA (a reload of the plug-in CA): a request signs with the CA in use when it is
    signed, whole (the swap is one reference assignment, so a request never mixes two CAs' parts).
    """

    def __init__(self, root: RootCa, *, clock: Callable[[], float] = time.time) -> None:
        self._root = root
        self._clock = clock

    @property
    def root(self) -> RootCa:
        return self._root

    def set_root(self, root: RootCa) -> None:
        self._root = root

    def sign(self, csr_pem: bytes, identity: SpiffeId, ttl_seconds: int) -> list[bytes]:
        root = self._root
        try:
            chain = sign_csr(root.signer, csr_pem, now=self._clock(), ttl_seconds=ttl_seconds, identity=identity)
        except CertificateError as exc:
            raise CsrError(str(exc)) from None
        roots = _ders(root.root_pem)
        while len(chain) > 1 and _der(chain[-1]) in roots:
            chain.pop()
        chain.append(root.root_pem)
        return chain


class CaService:
    """The CreateCertificate servicer; register it on a ``grpc.aio`` server with :meth:`add_to_server`."""

    def __init__(
        self,
        authenticator: Authenticator,
        node_authorizer: ImpersonationAuthorizer | None,
        signer: Signer,
        settings: CaSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        observer: CaObserver | None = None,
    ) -> None:
        self._authenticator = authenticator
        self._observer: CaObserver = observer or _NoObserver()
        self._authorizer = node_authorizer
        self._signer = signer
        self.settings = settings or CaSettings()
        self._clock = clock
        self.limiter = CallerRateLimiter(self.settings.rate_limit)

    async def create_certificate(
        self, request: ca_pb2.IstioCertificateRequest, metadata: Metadata
    ) -> ca_pb2.IstioCertificateResponse:
        """Steps 0-4 of the module docstring; refusals raise :class:`CaServerError` subclasses."""
        check_csr_size(request.csr, self.settings.max_csr_bytes)
        caller = await self._authenticator.authenticate(metadata)
        if not self.limiter.admit(f"{caller.namespace}/{caller.service_account}/{caller.pod_uid or ''}", self._clock()):
            raise RateLimitedError(f"caller {caller} is over its rate of {self.settings.rate_limit.rate}/s")
        requested = impersonated_identity(request.metadata)
        if requested is None:
            identity = caller.identity(self.settings.trust_domain)
        elif self._authorizer is None:
            raise AuthorizationError(f"caller {caller} asked to impersonate {requested}, but no node authorizer is set")
        else:
            identity = await self._authorizer.authorize(caller, requested)
        ttl = effective_ttl(request.validity_duration, default=self.settings.default_ttl, maximum=self.settings.max_ttl)
        csr_pem = request.csr.encode("utf-8", errors="replace")
        chain = await asyncio.to_thread(self._signer.sign, csr_pem, identity, ttl)
        log.info("issued a certificate for %s to %s, valid %d s", identity, caller, ttl)
        return ca_pb2.IstioCertificateResponse(cert_chain=flatten_chain(chain))

    async def CreateCertificate(  # the gRPC method's name
        self, request: ca_pb2.IstioCertificateRequest | OversizedRequest, context: Any
    ) -> ca_pb2.IstioCertificateResponse:
        self._observer.csr_received()
        if isinstance(request, OversizedRequest):
            log.warning("CreateCertificate from %s refused: a request of %d bytes", context.peer(), request.size)
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"request of {request.size} bytes is over the limit of {MAX_RECEIVE_MESSAGE_BYTES}",
            )
            raise AssertionError("unreachable: abort raises")
        try:
            response = await self.create_certificate(request, context.invocation_metadata() or ())
        except (AuthenticationError, AuthorizationError) as exc:
            self._observer.authentication_failed()
            log.warning("CreateCertificate from %s refused: %s", context.peer(), exc)
            code, message = grpc.StatusCode[exc.status], exc.wire_message()
        except CsrError as exc:
            self._observer.csr_malformed()
            log.warning("CreateCertificate from %s refused: %s", context.peer(), exc)
            code, message = grpc.StatusCode[exc.status], exc.wire_message()
        except CaServerError as exc:
            log.warning("CreateCertificate from %s refused: %s", context.peer(), exc)
            code, message = grpc.StatusCode[exc.status], exc.wire_message()
        except Exception:
            log.exception("CreateCertificate from %s failed", context.peer())
            code, message = grpc.StatusCode.INTERNAL, "internal error"
        else:
            self._observer.certificate_issued()
            return response
        await context.abort(code, message)
        raise AssertionError("unreachable: abort raises")

    def add_to_server(self, server: Any) -> None:
        """Serve this CA's one method on ``server`` (a ``grpc.aio.Server``)."""
        handler = grpc.unary_unary_rpc_method_handler(
            self.CreateCertificate,
            request_deserializer=read_request,
            response_serializer=ca_pb2.IstioCertificateResponse.SerializeToString,
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE_NAME, {"CreateCertificate": handler}),)
        )


@dataclass(frozen=True, slots=True)
class OversizedRequest:
    """A request message over :data:`MAX_RECEIVE_MESSAGE_BYTES`, left unparsed (step 0)."""

    size: int


def read_request(data: bytes) -> ca_pb2.IstioCertificateRequest | OversizedRequest:
    """The method's request reader: a message over the CA's own limit is not parsed (step 0)."""
    if len(data) > MAX_RECEIVE_MESSAGE_BYTES:
        return OversizedRequest(len(data))
    return ca_pb2.IstioCertificateRequest.FromString(data)


def _der(pem: bytes) -> bytes:
    try:
        return x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)
    except ValueError:
        return pem


def _ders(pem: bytes) -> frozenset[bytes]:
    try:
        return frozenset(c.public_bytes(serialization.Encoding.DER) for c in x509.load_pem_x509_certificates(pem))
    except ValueError:
        return frozenset({pem})

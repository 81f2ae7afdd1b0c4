"""The node proxy's CA client for istiod: ``IstioCertificateService/CreateCertificate`` over gRPC + TLS (spec §5.2).

Theory of operation: each :meth:`IstiodCaClient.fetch_certificate` makes a fresh ECDSA P-256 key and a CSR whose
one URI SAN is the wanted SPIFFE id (in a worker thread: key generation must not stall the event loop), and sends
it with ``validity_duration`` = the configured TTL. In shared (node proxy) mode the request's Struct metadata
carries ``ImpersonatedIdentity``; the call's gRPC metadata carries ``authorization: Bearer <token>`` and
``clusterid``. The token file is read on every call, because the kubelet (or the lab) rotates it in place. The
answer's first element must be a leaf naming exactly the requested identity
(:meth:`~ambit.tls.workload.WorkloadCertificate.from_chain` checks it); its last is the root.

The TLS channel trusts only the root in ``root_cert_path``. The file is read on every call too, and the channel is
rebuilt when its content changes (a root rotation), so a long-lived client follows the file as ztunnel does. It
sends keepalive pings like the xDS client (:mod:`ambit.xds.keepalive`), so a dead CA connection is dropped rather
than waited on. The channel comes from ``channel_factory``: by default
:class:`~ambit.xds.grpc_channel.GrpcChannel` (our HTTP/2 engine, no grpcio); its connection is dialled again by
the next call after a failure, so a CA that went away is reached again on the certificate manager's retry schedule
(:data:`~ambit.identity.caclient.CA_BACKOFF`: at most 5 s apart). Answers are bounded by gRPC's default 4 MiB.

Every failure (unreadable token or root, CA unreachable, refusal, a wrong or malformed chain) is a
:class:`~ambit.identity.caclient.CaError` naming the identity, so the certificate manager backs off and retries.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from google.protobuf import struct_pb2
from google.protobuf.message import DecodeError

from ambit.api import ca_pb2
from ambit.identity.caclient import CaError
from ambit.model.identity import SpiffeId
from ambit.tls.errors import CertificateError
from ambit.xds.errors import GrpcCallError
from ambit.xds.grpc_channel import Channel, ChannelFactory, ChannelSettings, GrpcChannel
from ambit.xds.keepalive import DEFAULT_KEEPALIVE, KeepaliveSettings

METHOD_PATH = "/istio.v1.auth.IstioCertificateService/CreateCertificate"
IMPERSONATED_IDENTITY = "ImpersonatedIdentity"
DEFAULT_TIMEOUT = 10.0

if TYPE_CHECKING:
    from ambit.tls.workload import WorkloadCertificate


class IstiodCaClient:
    """A :class:`~ambit.identity.manager.CaClient` that asks istiod (or Ambit's control plane) for certificates."""

    def __init__(
        self,
        address: str,
        root_cert_path: Path,
        token_path: Path,
        *,
        cluster_id: str = "Kubernetes",
        ttl_seconds: int = 86400,
        impersonate: bool = True,
        server_name: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        keepalive: KeepaliveSettings = DEFAULT_KEEPALIVE,
        channel_factory: ChannelFactory = GrpcChannel,
    ) -> None:
        """``address`` is ``host:port``; ``server_name`` overrides the name the server certificate must carry."""
        if ttl_seconds <= 0:
            raise CaError(f"certificate TTL must be positive, not {ttl_seconds}")
        self.address = address
        self._root_cert_path = Path(root_cert_path)
        self._token_path = Path(token_path)
        self._cluster_id = cluster_id
        self._ttl_seconds = ttl_seconds
        self._impersonate = impersonate
        self._server_name = server_name
        self._timeout = timeout
        self._keepalive = keepalive
        self._channel_factory = channel_factory
        self._channel: Channel | None = None
        self._channel_root: bytes | None = None
        self._lock = asyncio.Lock()

    async def fetch_certificate(self, identity: SpiffeId) -> WorkloadCertificate:
        """A fresh certificate for ``identity`` from the CA; :class:`CaError` on any failure."""
        token = self._read(self._token_path, "token").decode("utf-8", errors="replace").strip()
        if not token:
            raise CaError(f"token file {self._token_path} is empty")
        channel = await self._channel_for(self._read(self._root_cert_path, "root certificate"))
        csr_pem, key_pem = await asyncio.to_thread(_make_csr, identity)
        request = ca_pb2.IstioCertificateRequest(csr=csr_pem.decode("ascii"), validity_duration=self._ttl_seconds)
        if self._impersonate:
            request.metadata.CopyFrom(struct_pb2.Struct(fields={IMPERSONATED_IDENTITY: _string(str(identity))}))
        metadata = (("authorization", f"Bearer {token}"), ("clusterid", self._cluster_id))
        try:
            answer = await channel.unary(
                METHOD_PATH, request.SerializeToString(), metadata=metadata, time_limit=self._timeout
            )
            response = ca_pb2.IstioCertificateResponse.FromString(answer)
        except GrpcCallError as exc:
            raise CaError(f"CA {self.address} refused a certificate for {identity}: {exc}") from None
        except DecodeError as exc:
            raise CaError(f"CA {self.address} sent an undecodable answer for {identity}: {exc}") from None
        chain = [pem.encode("ascii", errors="replace") for pem in response.cert_chain]
        from ambit.tls.workload import WorkloadCertificate  # loaded by _make_csr already

        try:
            return WorkloadCertificate.from_chain(identity, chain, key_pem)
        except CertificateError as exc:
            raise CaError(f"CA {self.address}: {exc}") from None

    async def aclose(self) -> None:
        async with self._lock:
            channel, self._channel, self._channel_root = self._channel, None, None
        if channel is not None:
            await channel.aclose()

    async def __aenter__(self) -> IstiodCaClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _channel_for(self, root_pem: bytes) -> Channel:
        async with self._lock:
            if self._channel is not None and self._channel_root == root_pem:
                return self._channel
            old, self._channel = self._channel, None
            settings = ChannelSettings(
                self.address, root_pem, server_name=self._server_name or None, keepalive=self._keepalive
            )
            try:
                channel = self._channel = self._channel_factory(settings)
            except GrpcCallError as exc:
                raise CaError(f"root certificate {self._root_cert_path} is unusable: {exc.details}") from None
            self._channel_root = root_pem
        if old is not None:
            await old.aclose(grace=1.0)  # in-flight calls on the old root get a moment to finish
        return channel

    def _read(self, path: Path, what: str) -> bytes:
        try:
            return path.read_bytes()
        except OSError as exc:
            raise CaError(f"cannot read the {what} file {path}: {exc}") from None


def _string(value: str) -> struct_pb2.Value:
    return struct_pb2.Value(string_value=value)


def _make_csr(identity: SpiffeId) -> tuple[bytes, bytes]:
    """:func:`~ambit.tls.spiffe.make_csr` in the worker thread, which also imports, on the first certificate, the
    TLS modules the answer needs (off the event loop)."""
    from ambit.tls import workload  # noqa: F401 (imported here, off the loop)
    from ambit.tls.spiffe import make_csr

    return make_csr(identity)

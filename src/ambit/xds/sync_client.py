"""Read one control plane's sync status over its xDS port: a one-request debug stream (``istio.io/debug/syncz``).

Theory of operation: :func:`fetch_sync_document` dials the control plane with TLS (verified against the mesh root,
with the control plane's server name), authenticates with a bearer service-account token (audience ``istio-ca``),
sends one ``DeltaDiscoveryRequest`` of the debug type and reads one response, whose single resource holds the JSON
document as a ``google.protobuf.StringValue`` (:mod:`ambit.xds.sync`). It does not subscribe to anything, so the
control plane keeps no record of it. gRPC failures become :class:`SyncReadError` with one line saying what the
control plane answered (refused token, not allowed, unreachable); a malformed answer too.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc  # type: ignore[import-untyped]
from google.protobuf import wrappers_pb2
from google.protobuf.message import DecodeError

from ambit.api import discovery_pb2 as dpb
from ambit.xds.errors import XdsError
from ambit.xds.session import METHOD, SERVICE_NAME
from ambit.xds.sync import SYNCZ_TYPE_URL

__all__ = ["MAX_DOCUMENT_BYTES", "SyncReadError", "fetch_sync_document"]

MAX_DOCUMENT_BYTES = 64 * 1024 * 1024
"""The largest answer accepted (about 100 k connected proxies)."""
DEBUG_NODE_ID = "debug~0.0.0.0~ambit-proxy-status~cluster.local"

_EXPLAIN = {
    grpc.StatusCode.UNAUTHENTICATED: "the control plane refused the token",
    grpc.StatusCode.PERMISSION_DENIED: "the token's account may not read the sync status",
    grpc.StatusCode.UNAVAILABLE: "the control plane is unreachable",
    grpc.StatusCode.DEADLINE_EXCEEDED: "the control plane did not answer in time",
}


class SyncReadError(XdsError):
    """The sync status could not be read from a control plane."""


async def fetch_sync_document(
    address: str,
    *,
    root_pem: bytes,
    token: str,
    server_name: str = "istiod.istio-system.svc",
    cluster_id: str = "Kubernetes",
    timeout: float = 10.0,  # noqa: ASYNC109 (also the gRPC call's deadline)
) -> dict[str, Any]:
    """The sync document of the control plane at ``address`` (HOST:PORT)."""
    credentials = grpc.ssl_channel_credentials(root_certificates=root_pem)
    options = [
        ("grpc.ssl_target_name_override", server_name),
        ("grpc.max_receive_message_length", MAX_DOCUMENT_BYTES),
    ]
    metadata = (("authorization", f"Bearer {token}"), ("clusterid", cluster_id))
    request = dpb.DeltaDiscoveryRequest(type_url=SYNCZ_TYPE_URL, node=dpb.Node(id=DEBUG_NODE_ID, cluster=cluster_id))
    try:
        async with grpc.aio.secure_channel(address, credentials, options) as channel:
            call = channel.stream_stream(
                f"/{SERVICE_NAME}/{METHOD}",
                request_serializer=dpb.DeltaDiscoveryRequest.SerializeToString,
                response_deserializer=dpb.DeltaDiscoveryResponse.FromString,
            )(metadata=metadata, timeout=timeout)
            async with asyncio.timeout(timeout):
                await call.write(request)
                response = await call.read()
            call.cancel()
    except grpc.aio.AioRpcError as exc:
        why = _EXPLAIN.get(exc.code(), exc.code().name)
        raise SyncReadError(f"{address}: {why} ({exc.details() or exc.code().name})") from None
    except TimeoutError:
        raise SyncReadError(f"{address}: the control plane did not answer in {timeout:.0f} s") from None
    if response is grpc.aio.EOF:
        raise SyncReadError(f"{address}: the control plane closed the stream without an answer")
    return _document(address, response)


def _document(address: str, response: dpb.DeltaDiscoveryResponse) -> dict[str, Any]:
    if response.type_url != SYNCZ_TYPE_URL or len(response.resources) != 1:
        raise SyncReadError(f"{address}: the answer is not one {SYNCZ_TYPE_URL} resource")
    text = wrappers_pb2.StringValue()
    try:
        if not response.resources[0].resource.Unpack(text):
            raise SyncReadError(f"{address}: the {SYNCZ_TYPE_URL} resource is not a StringValue")
    except DecodeError:
        raise SyncReadError(f"{address}: the {SYNCZ_TYPE_URL} resource does not decode") from None
    try:
        document = json.loads(text.value)
    except ValueError as exc:
        raise SyncReadError(f"{address}: the sync document is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise SyncReadError(f"{address}: the sync document is not a JSON object")
    return document

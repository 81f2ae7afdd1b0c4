"""The lab's ``ext-authz`` app: an external authorizer that behaves as Istio's ``samples/extauthz`` server, so a
user can run Istio's "External Authorization" task against a lab (``python3 -m ambit.lab.apps ext-authz``).

Theory of operation: :func:`decide` is the sample's rule (pure); :func:`http_answer` and :func:`grpc_answer` turn
it into the HTTP answer of an ``envoyExtAuthzHttp`` check and the ``CheckResponse`` of an ``envoyExtAuthzGrpc``
one; :func:`serve` runs both servers (HTTP/1.1 on one port, gRPC on another: the sample's 8000 and 9000).

Rules (the sample's):

1. A check is allowed when the request carries ``x-ext-authz: allow``; a gRPC check also when no such header is
   present and the source principal is the service account ``--allow-service-account`` (``.../sa/<name>``;
   default ``a``).
2. Either way the answer carries ``x-ext-authz-check-result`` (``allowed`` or ``denied``),
   ``x-ext-authz-check-received`` (what was checked) and ``x-ext-authz-additional-header-override`` (the value
   the check request had for it); a denial is 403 with a body naming the header.
3. The HTTP server reads heads of at most 64 KiB and bodies of at most 1 MiB (more closes the connection).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from ambit.waypoint.ext_authz_wire import (
    CheckAnswer,
    ExtAuthzWireError,
    decode_check_request,
    encode_check_response,
    options,
)

__all__ = ["CHECK_HEADER", "DENY_BODY", "decide", "grpc_answer", "http_answer", "serve"]

CHECK_HEADER = "x-ext-authz"
RESULT_HEADER = "x-ext-authz-check-result"
RECEIVED_HEADER = "x-ext-authz-check-received"
OVERRIDE_HEADER = "x-ext-authz-additional-header-override"
DENY_BODY = f"denied by ext_authz for not found header `{CHECK_HEADER}: allow` in the request"
PERMISSION_DENIED = 7
MAX_HEAD = 64 * 1024
MAX_BODY = 1024 * 1024


def decide(headers: Mapping[str, str], principal: str = "", allowed_account: str = "") -> bool:
    """Rule 1 (``headers`` with lower-case names)."""
    value = headers.get(CHECK_HEADER)
    if value is not None:
        return value == "allow"
    return bool(allowed_account) and principal.endswith(f"/sa/{allowed_account}")


def http_answer(
    method: str, host: str, target: str, headers: Mapping[str, str]
) -> tuple[int, list[tuple[str, str]], bytes]:
    """Rule 2 for an HTTP check: status, headers, body."""
    allowed = decide(headers)
    fields = [
        (RESULT_HEADER, "allowed" if allowed else "denied"),
        (OVERRIDE_HEADER, headers.get(OVERRIDE_HEADER, "")),
        (RECEIVED_HEADER, f"{method} {host}{target}"[:1024]),
    ]
    return (200, fields, b"") if allowed else (403, fields, DENY_BODY.encode())


def grpc_answer(request: bytes, allowed_account: str = "a") -> bytes:
    """Rules 1-2 for a gRPC check: the encoded ``CheckResponse`` of an encoded ``CheckRequest``."""
    attributes = decode_check_request(request)
    headers = dict(attributes.headers)
    allowed = decide(headers, attributes.source_principal, allowed_account)
    received = f"{attributes.method} {attributes.host}{attributes.path}"[:1024]
    fields = (
        (RESULT_HEADER, "allowed" if allowed else "denied"),
        (RECEIVED_HEADER, received),
        (OVERRIDE_HEADER, headers.get(OVERRIDE_HEADER, "")),
    )
    if allowed:
        return encode_check_response(CheckAnswer(0, ok_headers=options(fields)))
    return encode_check_response(
        CheckAnswer(PERMISSION_DENIED, denied_status=403, denied_headers=options(fields), denied_body=DENY_BODY)
    )


async def _serve_http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, target, _ = [*lines[0].split(" "), "", ""][:3]
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
            length = headers.get("content-length", "0")
            if not length.isdigit() or int(length) > MAX_BODY:
                return
            await reader.readexactly(int(length))
            status, fields, body = http_answer(method, headers.get("host", ""), target, headers)
            reason = "OK" if status == 200 else "Forbidden"
            lines_out = [f"HTTP/1.1 {status} {reason}", *(f"{n}: {v}" for n, v in fields)]
            lines_out += ["content-type: text/plain", f"content-length: {len(body)}"]
            writer.write(("\r\n".join(lines_out) + "\r\n\r\n").encode("latin-1", "replace") + body)
            await writer.drain()
            if headers.get("connection", "").lower() == "close":
                return
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
        pass
    finally:
        writer.close()


def _grpc_server(host: str, port: int, allowed_account: str) -> tuple[Any, int]:
    import grpc  # type: ignore[import-untyped] # only the gRPC side needs it
    import grpc.aio  # type: ignore[import-untyped]

    async def check(request: bytes, context: Any) -> bytes:
        try:
            return grpc_answer(request, allowed_account)
        except ExtAuthzWireError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))  # raises: the call ends here
            raise

    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(check)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("envoy.service.auth.v3.Authorization", {"Check": handler}),)
    )
    bound = server.add_insecure_port(f"{host}:{port}")
    return server, bound


async def serve(
    http_port: int, grpc_port: int, *, host: str = "0.0.0.0", allowed_account: str = "a", started: Any = None
) -> None:
    """Both servers until cancelled; ``started`` (an asyncio.Future), when given, gets the bound (http, grpc)
    ports."""
    http = await asyncio.start_server(_serve_http, host, http_port, limit=MAX_HEAD)
    grpc_server, bound = _grpc_server(host, grpc_port, allowed_account)
    await grpc_server.start()
    ports = (http.sockets[0].getsockname()[1], bound)
    print(f"ext-authz listening: http :{ports[0]}, grpc :{ports[1]}", flush=True)
    if started is not None:
        started.set_result(ports)
    try:
        async with http:
            await http.serve_forever()
    finally:
        await grpc_server.stop(0)

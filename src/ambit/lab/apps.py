"""Example workloads for lab pods (there are no images here: pods run commands from this machine).

``python3 -m ambit.lab.apps <app> [options]`` (the lab puts the project's interpreter first on the pods' PATH):

- ``http-echo --port P``: answers every HTTP request with who it is and who called (method, path, the client's
  address as the server saw it, headers), so a caller can see where its request landed and with what source.
  On SIGTERM it keeps serving until a second has passed without a request, then exits, as Istio's echo app does:
  a pod being deleted may still get requests until every proxy has heard its endpoint is gone.
  It also speaks h2c (a connection opening with the HTTP/2 preface), as Istio's echo app does on its HTTP ports;
  ``proto`` in the answer tells which (``HTTP/1.1``, ``HTTP/2.0``).
- ``https-echo --port P --hostname H``: ``http-echo`` over TLS, with a certificate for ``H`` it makes itself at
  start (from a CA of its own, in memory once loaded), for clients that check that TLS reached it untouched
  (``curl -k``, then the certificate's subject). It offers ALPN ``http/1.1`` and reports what was negotiated as
  ``alpn`` (``null`` when the client offered none it speaks), as Istio's echo server does for ``check.Alpn``.
- ``grpc-echo --port P``: a gRPC server (grpcio, raw bytes, no protobuf) with ``/echo.Echo/Say``: answers
  ``<pod>:<request>``, and for the request ``fail`` the status NOT_FOUND with trailing metadata ``x-pod: <pod>``
  (so a caller can see trailers cross the mesh).
- ``grpc-echo --port P``'s server also answers ``/echo.Echo/Who`` with JSON: who it is, the client's address as it
  saw it, and the request's metadata (``x-request-id`` shows that a waypoint carried the call at L7).
- ``tcp-echo --port P``: echoes bytes back on every connection.
- ``server-first --port P``: speaks first on each connection (a banner, as SMTP or MySQL servers do), then echoes;
  proxies that wait for the client's first bytes before connecting break it.
- ``multi-echo --listen KIND:PORT[@BIND] ... [--hostname H]``: one process serving many ports, as Istio's echo
  app serves its common ports: KIND is ``http``, ``https`` (certificate for ``H``), ``grpc``, ``tcp`` or
  ``server-first``; BIND is an address (``127.0.0.1``), or ``pod`` for the pod's own IP only. Its TCP listeners
  answer a read of exactly ``whoami\\n`` with a JSON line naming the pod and the client's address.
- ``ext-authz --http P --grpc P [--allow-service-account A]``: an external authorizer as Istio's
  ``samples/extauthz`` (:mod:`ambit.lab.ext_authz_app`): allows a check that carries ``x-ext-authz: allow``,
  denies 403 with a body naming the header otherwise; HTTP on one port (8000), gRPC ``Authorization/Check`` on the
  other (9000), for Istio's External Authorization task.
- ``client --url URL | --tcp HOST:PORT [--server-first] --interval S [--count N]``: calls a target in a loop
  and prints one line per attempt (ok + a summary of the answer, or the error), for logs and tests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import ssl
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any

from ambit.hbone.events import ConnectionTerminated, DataReceived, RequestReceived, StreamEnded
from ambit.hbone.messages import Http2ServerConnection
from ambit.hbone.wire import PREFACE

IDENTITY = {
    "pod": os.environ.get("POD_NAME", socket.gethostname()),
    "namespace": os.environ.get("POD_NAMESPACE", ""),
    "node": os.environ.get("NODE_NAME", ""),
}


def _self_signed_context(hostname: str) -> ssl.SSLContext:
    """A server context with a fresh certificate for ``hostname`` (ssl loads certificates from files only)."""
    from ambit.tls.certs import issue_server_cert, new_ca

    ca = new_ca(f"{hostname} CA", now=time.time())
    pair = issue_server_cert(ca, common_name=hostname, dns_names=[hostname], ip_addresses=[], now=time.time())
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with tempfile.TemporaryDirectory(prefix="https-echo-") as folder:  # gone once loaded: no key left on disk
        chain, key = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
        with open(chain, "wb") as f:
            f.write(pair.cert_pem + ca.cert_pem)
        with open(key, "wb") as f:
            f.write(pair.key_pem)
        context.load_cert_chain(chain, key)
    context.set_alpn_protocols(["http/1.1"])  # the only protocol it speaks; a client offering only h2 gets none
    return context


DRAIN_QUIET = 1.0
"""Seconds without a request after which a terminating http-echo exits."""


class _Drain:
    """When the last request came, and whether SIGTERM has come (then :meth:`wait` returns once the server has been
    quiet for :data:`DRAIN_QUIET` seconds)."""

    def __init__(self) -> None:
        self.last_request = time.monotonic()
        self.terminating = asyncio.Event()

    def handle_sigterm(self) -> None:
        self.last_request = max(self.last_request, time.monotonic())
        self.terminating.set()

    async def wait(self) -> None:
        await self.terminating.wait()
        while (quiet := time.monotonic() - self.last_request) < DRAIN_QUIET:  # noqa: ASYNC110 (a moving deadline)
            await asyncio.sleep(DRAIN_QUIET - quiet)


def _http_handler(drain: _Drain) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    """The connection handler of ``http-echo``: HTTP/1.1 with keep-alive, or h2c when the connection opens with
    the HTTP/2 preface (prior knowledge, as Istio's echo app accepts on its HTTP ports); each request is answered
    with who saw what (:func:`_answer`)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        tls_object = writer.get_extra_info("ssl_object")
        seen = {"client": f"{peer[0]}:{peer[1]}"}
        if tls_object is not None:
            seen["alpn"] = tls_object.selected_alpn_protocol()
        try:
            first = await _read_preface(reader)
            if first == PREFACE:
                await _serve_h2c(reader, writer, first, drain, seen)
            else:
                await _serve_http1(reader, writer, bytearray(first), drain, seen)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            writer.close()

    return handle


async def _read_preface(reader: asyncio.StreamReader) -> bytes:
    """The connection's first bytes: the HTTP/2 preface, or as soon as they cannot be it, what has come so far."""
    first = b""
    while len(first) < len(PREFACE) and PREFACE.startswith(first):
        data = await reader.read(len(PREFACE) - len(first))
        if not data:
            break
        first += data
    return first


def _answer(method: str, path: str, proto: str, headers: dict[str, str], seen: dict[str, Any]) -> bytes:
    return json.dumps({**IDENTITY, "method": method, "path": path, "proto": proto, "headers": headers, **seen}).encode()


async def _serve_http1(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, buffer: bytearray, drain: _Drain, seen: dict[str, Any]
) -> None:
    while True:
        while (end := buffer.find(b"\r\n\r\n")) < 0:
            if len(buffer) > 65536:
                raise ValueError("request head too long")
            if not (data := await reader.read(65536)):
                return
            buffer += data
        head = bytes(buffer[: end + 4])
        del buffer[: end + 4]
        drain.last_request = time.monotonic()
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = ([*lines[0].split(" "), "", ""])[:3]
        headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
        length = int(headers.get("Content-Length", headers.get("content-length", "0")) or 0)
        while len(buffer) < length:
            if not (data := await reader.read(65536)):
                return
            buffer += data
        del buffer[:length]
        body = _answer(method, path, "HTTP/1.1", headers, seen)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        if headers.get("Connection", headers.get("connection", "")).lower() == "close":
            return


async def _serve_h2c(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, first: bytes, drain: _Drain, seen: dict[str, Any]
) -> None:
    """HTTP/2 without TLS (the preface already read as ``first``): every stream is answered once its request
    ended, with the request's fields as headers (``:authority`` as ``host``)."""
    connection = Http2ServerConnection()
    requests: dict[int, RequestReceived] = {}
    data = first
    while data:
        for event in connection.receive_data(data):
            if isinstance(event, RequestReceived):
                requests[event.stream_id] = event
                drain.last_request = time.monotonic()
            elif isinstance(event, DataReceived):
                connection.consumed(event.stream_id, event.flow_length)
            elif isinstance(event, StreamEnded) and (request := requests.pop(event.stream_id, None)) is not None:
                headers = {"host": request.authority, **dict(request.headers)}
                body = _answer(request.method, request.path, "HTTP/2.0", headers, seen)
                connection.respond(event.stream_id, 200, [("content-type", "application/json")])
                connection.send_data(event.stream_id, body)
                connection.end_stream(event.stream_id)
            elif isinstance(event, ConnectionTerminated):
                writer.write(connection.data_to_send())
                return
        writer.write(connection.data_to_send())
        await writer.drain()
        data = await reader.read(65536)


async def _http_echo(port: int, tls: ssl.SSLContext | None = None) -> None:
    drain = _Drain()
    server = await asyncio.start_server(_http_handler(drain), "0.0.0.0", port, ssl=tls)
    server6 = await _ipv6_server(_http_handler(drain), port, tls)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, drain.handle_sigterm)
    print(f"{'https' if tls else 'http'}-echo {IDENTITY['pod']} listening on :{port}", flush=True)
    try:
        await drain.wait()
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        server.close()  # not wait_closed(): it would wait for idle keep-alive connections; asyncio.run ends them
        if server6 is not None:
            server6.close()
    print(f"{'https' if tls else 'http'}-echo {IDENTITY['pod']} terminated after a quiet second", flush=True)


async def _ipv6_server(handler: Any, port: int, tls: ssl.SSLContext | None) -> asyncio.Server | None:
    """The same app on ``[::]`` (IPv6 only, beside the IPv4 socket) for a dual-stack pod; None where the pod's
    network has no IPv6."""
    try:
        return await asyncio.start_server(handler, "::", port, ssl=tls, family=socket.AF_INET6)
    except OSError:
        return None


def _grpc_server(ports: list[tuple[str, int]]) -> Any:
    """A grpcio server (not started) with ``/echo.Echo/Say`` and ``/echo.Echo/Who`` on every ``(host, port)``."""
    import grpc  # type: ignore[import-untyped] # only the gRPC apps need it
    import grpc.aio  # type: ignore[import-untyped]

    pod = IDENTITY["pod"]

    async def say(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        if request == b"fail":
            context.set_trailing_metadata((("x-pod", pod),))
            await context.abort(grpc.StatusCode.NOT_FOUND, f"{pod} was asked to fail")
        return pod.encode() + b":" + request

    async def who(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        return json.dumps({**IDENTITY, "client": _grpc_peer(context.peer()), "headers": _metadata(context)}).encode()

    server = grpc.aio.server()
    methods = {"Say": grpc.unary_unary_rpc_method_handler(say), "Who": grpc.unary_unary_rpc_method_handler(who)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("echo.Echo", methods),))
    for host, port in ports:
        server.add_insecure_port(f"{host}:{port}")
    return server


def _grpc_peer(peer: str) -> str:
    """``ipv4:10.0.0.1:5000`` (grpcio's form) as ``10.0.0.1:5000``; ``ipv6:[::1]:5000`` as ``::1:5000``."""
    kind, _, address = peer.partition(":")
    if kind == "ipv6":
        host, _, port = address.rpartition(":")
        return f"{host.strip('[]')}:{port}"
    return address if kind == "ipv4" else peer


def _metadata(context: Any) -> dict[str, str]:
    return {str(k): v if isinstance(v, str) else v.decode("latin-1") for k, v in context.invocation_metadata() or ()}


async def _grpc_echo(port: int) -> None:
    server = _grpc_server([("0.0.0.0", port)])
    await server.start()
    print(f"grpc-echo {IDENTITY['pod']} listening on :{port}", flush=True)
    await server.wait_for_termination()


def _tcp_handler(banner: bool, report: bool) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    """Echoes bytes back (after a banner when ``banner``); with ``report``, a read of exactly ``whoami\\n`` is
    answered with a JSON line of who it is and the client's address as the server saw it."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        try:
            if banner:
                writer.write(f"HELLO from {IDENTITY['pod']}\n".encode())
                await writer.drain()
            while data := await reader.read(65536):
                if report and data == b"whoami\n":
                    data = json.dumps({**IDENTITY, "client": f"{peer[0]}:{peer[1]}"}).encode() + b"\n"
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    return handle


async def _tcp_echo(port: int, banner: bool) -> None:
    server = await asyncio.start_server(_tcp_handler(banner, report=False), "0.0.0.0", port)
    name = "server-first" if banner else "tcp-echo"
    print(f"{name} {IDENTITY['pod']} listening on :{port}", flush=True)
    async with server:
        await server.serve_forever()


MULTI_KINDS = ("http", "https", "grpc", "tcp", "server-first")


def parse_listener(spec: str, pod_ip: str) -> tuple[str, str, int]:
    """``KIND:PORT[@BIND]`` as ``(kind, host, port)``: ``BIND`` is an address, or ``pod`` for the pod's own IP
    (``pod_ip``); without it the port is bound on every address."""
    kind, _, rest = spec.partition(":")
    port_text, _, bind = rest.partition("@")
    if kind not in MULTI_KINDS:
        raise ValueError(f"listener {spec!r}: kind {kind!r} is not one of {', '.join(MULTI_KINDS)}")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"listener {spec!r}: {port_text!r} is not a port number")
    if bind == "pod":
        if not pod_ip:
            raise ValueError(f"listener {spec!r}: the pod's IP is unknown (POD_IP is not set)")
        bind = pod_ip
    return kind, bind or "0.0.0.0", int(port_text)


async def _multi_echo(listeners: list[tuple[str, str, int]], hostname: str) -> None:
    """Every listener in one process: HTTP and HTTPS echo, gRPC, TCP echo and server-first TCP, each on its port
    and address (Istio's echo app with its common ports). Exits as ``http-echo`` does on SIGTERM."""
    drain = _Drain()
    servers: list[asyncio.Server] = []
    grpc_ports = [(host, port) for kind, host, port in listeners if kind == "grpc"]
    tls = _self_signed_context(hostname) if any(kind == "https" for kind, _, _ in listeners) else None
    for kind, host, port in listeners:
        if kind in ("http", "https"):
            servers.append(
                await asyncio.start_server(_http_handler(drain), host, port, ssl=tls if kind == "https" else None)
            )
        elif kind in ("tcp", "server-first"):
            servers.append(await asyncio.start_server(_tcp_handler(kind == "server-first", report=True), host, port))
    grpc_server = _grpc_server(grpc_ports) if grpc_ports else None
    if grpc_server is not None:
        await grpc_server.start()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, drain.handle_sigterm)
    described = " ".join(f"{kind}:{host}:{port}" for kind, host, port in listeners)
    print(f"multi-echo {IDENTITY['pod']} listening on {described}", flush=True)
    try:
        await drain.wait()
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        for server in servers:
            server.close()
        if grpc_server is not None:
            await grpc_server.stop(0)
    print(f"multi-echo {IDENTITY['pod']} terminated after a quiet second", flush=True)


def _call_http(url: str, timeout: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        answer = json.loads(response.read())
    return f"ok {answer.get('pod')} node={answer.get('node')} saw-client={answer.get('client')}"


def _call_tcp(target: str, server_first: bool, timeout: float) -> str:
    host, _, port = target.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as conn:
        if server_first:
            banner = conn.recv(1024).decode().strip()
            return f"ok banner={banner!r}"
        conn.sendall(b"ping\n")
        return f"ok echo={conn.recv(1024).decode().strip()!r}"


def _client(args: argparse.Namespace) -> int:
    attempts = 0
    while args.count == 0 or attempts < args.count:
        attempts += 1
        try:
            line = (
                _call_http(args.url, args.timeout) if args.url else _call_tcp(args.tcp, args.server_first, args.timeout)
            )
        except (OSError, urllib.error.URLError, ValueError) as exc:
            line = f"error {type(exc).__name__}: {exc}"
        print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)
        time.sleep(args.interval)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m ambit.lab.apps", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="app", required=True)
    for name in ("http-echo", "grpc-echo", "tcp-echo", "server-first"):
        p = sub.add_parser(name)
        p.add_argument("--port", type=int, default=8080)
    m = sub.add_parser("multi-echo")
    m.add_argument("--listen", action="append", required=True, metavar="KIND:PORT[@BIND]")
    m.add_argument("--hostname", default="localhost", help="the name in the HTTPS listeners' certificate")
    h = sub.add_parser("https-echo")
    h.add_argument("--port", type=int, default=8443)
    h.add_argument("--hostname", required=True)
    e = sub.add_parser("ext-authz")
    e.add_argument("--http", type=int, default=8000, help="the HTTP check port")
    e.add_argument("--grpc", type=int, default=9000, help="the gRPC check port")
    e.add_argument("--allow-service-account", default="a", help="a gRPC check from it is allowed without the header")
    c = sub.add_parser("client")
    target = c.add_mutually_exclusive_group(required=True)
    target.add_argument("--url")
    target.add_argument("--tcp", metavar="HOST:PORT")
    c.add_argument("--server-first", action="store_true")
    c.add_argument("--interval", type=float, default=1.0)
    c.add_argument("--count", type=int, default=0, help="attempts (0: forever)")
    c.add_argument("--timeout", type=float, default=2.0)
    args = parser.parse_args(argv)
    if args.app == "multi-echo":
        try:
            listeners = [parse_listener(spec, os.environ.get("POD_IP", "")) for spec in args.listen]
        except ValueError as exc:
            parser.error(str(exc))
    try:
        if args.app == "http-echo":
            asyncio.run(_http_echo(args.port))
        elif args.app == "https-echo":
            asyncio.run(_http_echo(args.port, _self_signed_context(args.hostname)))
        elif args.app == "multi-echo":
            asyncio.run(_multi_echo(listeners, args.hostname))
        elif args.app == "grpc-echo":
            asyncio.run(_grpc_echo(args.port))
        elif args.app == "ext-authz":
            from ambit.lab.ext_authz_app import serve

            asyncio.run(serve(args.http, args.grpc, allowed_account=args.allow_service_account))
        elif args.app in ("tcp-echo", "server-first"):
            asyncio.run(_tcp_echo(args.port, banner=args.app == "server-first"))
        else:
            return _client(args)
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())

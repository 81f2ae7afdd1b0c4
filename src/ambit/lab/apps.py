"""Example workloads for lab pods (there are no images here: pods run commands from this machine).

``python3 -m ambit.lab.apps <app> [options]`` (the lab puts the project's interpreter first on the pods' PATH):

- ``http-echo --port P``: answers every HTTP request with who it is and who called (method, path, the client's
  address as the server saw it, headers), so a caller can see where its request landed and with what source.
  On SIGTERM it keeps serving until a second has passed without a request, then exits, as Istio's echo app does:
  a pod being deleted may still get requests until every proxy has heard its endpoint is gone.
- ``https-echo --port P --hostname H``: ``http-echo`` over TLS, with a certificate for ``H`` it makes itself at
  start (from a CA of its own, in memory once loaded), for clients that check that TLS reached it untouched
  (``curl -k``, then the certificate's subject). It offers ALPN ``http/1.1`` and reports what was negotiated as
  ``alpn`` (``null`` when the client offered none it speaks), as Istio's echo server does for ``check.Alpn``.
- ``grpc-echo --port P``: a gRPC server (grpcio, raw bytes, no protobuf) with ``/echo.Echo/Say``: answers
  ``<pod>:<request>``, and for the request ``fail`` the status NOT_FOUND with trailing metadata ``x-pod: <pod>``
  (so a caller can see trailers cross the mesh).
- ``tcp-echo --port P``: echoes bytes back on every connection.
- ``server-first --port P``: speaks first on each connection (a banner, as SMTP or MySQL servers do), then echoes;
  proxies that wait for the client's first bytes before connecting break it.
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


async def _http_echo(port: int, tls: ssl.SSLContext | None = None) -> None:
    drain = _Drain()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        tls_object = writer.get_extra_info("ssl_object")
        negotiated = {"alpn": tls_object.selected_alpn_protocol()} if tls_object is not None else {}
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                drain.last_request = time.monotonic()
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = ([*lines[0].split(" "), "", ""])[:3]
                headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
                length = int(headers.get("Content-Length", headers.get("content-length", "0")) or 0)
                if length:
                    await reader.readexactly(length)
                body = json.dumps(
                    {
                        **IDENTITY,
                        "method": method,
                        "path": path,
                        "client": f"{peer[0]}:{peer[1]}",
                        "headers": headers,
                        **negotiated,
                    }
                ).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
                if headers.get("Connection", headers.get("connection", "")).lower() == "close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "0.0.0.0", port, ssl=tls)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, drain.handle_sigterm)
    print(f"{'https' if tls else 'http'}-echo {IDENTITY['pod']} listening on :{port}", flush=True)
    try:
        await drain.wait()
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        server.close()  # not wait_closed(): it would wait for idle keep-alive connections; asyncio.run ends them
    print(f"{'https' if tls else 'http'}-echo {IDENTITY['pod']} terminated after a quiet second", flush=True)


async def _grpc_echo(port: int) -> None:
    import grpc  # type: ignore[import-untyped] # only this app needs it
    import grpc.aio  # type: ignore[import-untyped]

    pod = IDENTITY["pod"]

    async def say(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        if request == b"fail":
            context.set_trailing_metadata((("x-pod", pod),))
            await context.abort(grpc.StatusCode.NOT_FOUND, f"{pod} was asked to fail")
        return pod.encode() + b":" + request

    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler("echo.Echo", {"Say": grpc.unary_unary_rpc_method_handler(say)})
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"0.0.0.0:{port}")
    await server.start()
    print(f"grpc-echo {pod} listening on :{port}", flush=True)
    await server.wait_for_termination()


async def _tcp_echo(port: int, banner: bool) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if banner:
                writer.write(f"HELLO from {IDENTITY['pod']}\n".encode())
                await writer.drain()
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "0.0.0.0", port)
    name = "server-first" if banner else "tcp-echo"
    print(f"{name} {IDENTITY['pod']} listening on :{port}", flush=True)
    async with server:
        await server.serve_forever()


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
    h = sub.add_parser("https-echo")
    h.add_argument("--port", type=int, default=8443)
    h.add_argument("--hostname", required=True)
    c = sub.add_parser("client")
    target = c.add_mutually_exclusive_group(required=True)
    target.add_argument("--url")
    target.add_argument("--tcp", metavar="HOST:PORT")
    c.add_argument("--server-first", action="store_true")
    c.add_argument("--interval", type=float, default=1.0)
    c.add_argument("--count", type=int, default=0, help="attempts (0: forever)")
    c.add_argument("--timeout", type=float, default=2.0)
    args = parser.parse_args(argv)
    try:
        if args.app == "http-echo":
            asyncio.run(_http_echo(args.port))
        elif args.app == "https-echo":
            asyncio.run(_http_echo(args.port, _self_signed_context(args.hostname)))
        elif args.app == "grpc-echo":
            asyncio.run(_grpc_echo(args.port))
        elif args.app in ("tcp-echo", "server-first"):
            asyncio.run(_tcp_echo(args.port, banner=args.app == "server-first"))
        else:
            return _client(args)
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())

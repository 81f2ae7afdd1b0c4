"""The reference point for the API server: the least an HTTPS + JSON server in Python does for the same requests.

``python -m bench.bare_server --cert C --key K --token T --listen 127.0.0.1:PORT`` serves, with aiohttp and TLS:

- ``POST /api/v1/namespaces/NS/pods``: checks the bearer token, decodes the JSON body, stamps a resourceVersion,
  encodes it again and answers 201 with it; and sends it once as an ``ADDED`` event line to every open watch;
- ``GET /api/v1/pods?watch=true``: a chunked stream of JSON event lines, one queue per watcher.

There is no validation, no defaulting, no storage and no selector: the difference to ``ambit apiserver`` is what
those cost. No kube-apiserver or etcd is available on this machine to compare against.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import ssl
from pathlib import Path

import msgspec
from aiohttp import web

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


class BareServer:
    """Echoes creates and fans them out to watchers; holds nothing."""

    def __init__(self, token: str) -> None:
        self._auth = f"Bearer {token}"
        self._rv = 0
        self._watchers: set[asyncio.Queue[bytes]] = set()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/api/v1/namespaces/{namespace}/pods", self._create)
        app.router.add_get("/api/v1/pods", self._watch)
        return app

    async def _create(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != self._auth:
            raise web.HTTPUnauthorized()
        obj = _decode(await request.read())
        self._rv += 1
        meta = obj["metadata"]
        meta["namespace"] = request.match_info["namespace"]
        meta["resourceVersion"] = str(self._rv)
        body = _encode(obj)
        line = b'{"type":"ADDED","object":' + body + b"}\n"
        for queue in self._watchers:
            queue.put_nowait(line)
        return web.Response(status=201, body=body, content_type="application/json")

    async def _watch(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != self._auth:
            raise web.HTTPUnauthorized()
        if request.query.get("watch") not in ("true", "1"):
            raise web.HTTPBadRequest(text="only watches are served here")
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        self._watchers.add(queue)
        try:
            while True:
                await response.write(await queue.get())
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self._watchers.discard(queue)
        return response


async def serve(host: str, port: int, context: ssl.SSLContext, token: str) -> None:
    runner = web.AppRunner(BareServer(token).app(), handle_signals=False, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=context, reuse_address=True).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"bare server ready at https://{host}:{port}", flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bare_server", description=__doc__.splitlines()[0])
    parser.add_argument("--cert", type=Path, required=True, help="PEM certificate chain")
    parser.add_argument("--key", type=Path, required=True, help="PEM private key")
    parser.add_argument("--token", required=True, help="the bearer token clients must send")
    parser.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(args.cert, args.key)
    asyncio.run(serve(host, int(port), context, args.token))


if __name__ == "__main__":
    main()

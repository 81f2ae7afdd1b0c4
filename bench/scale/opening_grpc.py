"""``python -m bench.scale.opening_grpc``: the xDS server process's CPU per exact reconnect opening received through
gRPC (TLS on loopback), by what the server does with it (issue 22). A server process with one stream method
reads each stream's one request, and answers it empty; a client process opens ``--openings`` streams one after
the other, each sending the same opening request naming every one of ``--resources`` Addresses at the server's
versions (~6.7 MB at 110,000). The server's CPU time over them (``time.process_time``) divided by their number is
printed per mode:

- ``bytes``: gRPC's receive alone (TLS, HTTP/2, the message as bytes);
- ``map``: the request parsed as the declared map (``DeltaDiscoveryRequest.FromString``);
- ``entries``: parsed with its held versions left encoded (:func:`ambit.xds.opening.parse_request`);
- ``map+answer`` and ``entries+answer``: the same, then the session's answer against the set (the whole opening).

Modes other than ``bytes`` and ``map`` need the code of this branch; ``--rounds`` alternates the modes."""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]

from ambit.api import discovery_pb2 as dpb
from bench.scale.reconnect import SERVER_NAME, _resources, opening_request

MODES = ("bytes", "map", "entries", "map+answer", "entries+answer")


async def _serve(mode: str, directory: Path, resources: int) -> None:
    from ambit.xds.session import ServerSession
    from ambit.xds.table import AddressTable

    parse: Any = None
    if mode.startswith("map"):
        parse = dpb.DeltaDiscoveryRequest.FromString
    elif mode.startswith("entries"):
        from ambit.xds.opening import parse_request

        parse = parse_request
    current = AddressTable(_resources(resources)).current
    answer = mode.endswith("+answer")
    if answer:  # made once per set, before the clients: not a cost per opening
        current.versions_request()
        if mode.startswith("entries"):
            current.versions_digest()
    count = [0]

    async def handler(_requests: Any, context: Any) -> None:
        request = await context.read()
        if answer:
            output = ServerSession().receive(request, current)
            assert not output.deltas[0].resources and not output.deltas[0].removed
        del request
        count[0] += 1
        await context.write(b"")

    method = grpc.stream_stream_rpc_method_handler(handler, request_deserializer=parse, response_serializer=bytes)
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 16 << 20), ("grpc.http2.bdp_probe", 0)])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Opening", {"Open": method}),))
    key, chain = (directory / "key.pem").read_bytes(), (directory / "chain.pem").read_bytes()
    port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(key, chain)]))
    await server.start()
    print(json.dumps({"port": port}), flush=True)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    await reader.readline()  # the clients' warm-up is done
    cpu, seen = time.process_time(), count[0]
    await reader.readline()  # the measured openings are done
    print(json.dumps({"ms": (time.process_time() - cpu) / max(1, count[0] - seen) * 1e3}), flush=True)
    await server.stop(0)


async def _open(port: int, directory: Path, resources: int, openings: int) -> None:
    data = opening_request(resources)
    credentials = grpc.ssl_channel_credentials(root_certificates=(directory / "root.pem").read_bytes())
    options = [("grpc.ssl_target_name_override", SERVER_NAME)]
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials, options) as channel:
        open_stream = channel.stream_stream("/bench.Opening/Open", request_serializer=bytes)
        for _ in range(openings):
            call = open_stream()
            await call.write(data)
            await call.read()
            call.cancel()


def _measure(mode: str, directory: Path, args: argparse.Namespace) -> float:
    me = [sys.executable, "-m", "bench.scale.opening_grpc", "--dir", str(directory), "--resources", str(args.resources)]
    server = subprocess.Popen([*me, "--serve", mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert server.stdin is not None and server.stdout is not None
    try:
        port = json.loads(server.stdout.readline())["port"]
        subprocess.run([*me, "--port", str(port), "--openings", "3"], check=True)
        server.stdin.write("go\n")
        server.stdin.flush()
        subprocess.run([*me, "--port", str(port), "--openings", str(args.openings)], check=True)
        server.stdin.write("done\n")
        server.stdin.flush()
        return float(json.loads(server.stdout.readline())["ms"])
    finally:
        server.kill()
        server.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scale.opening_grpc", description=__doc__.splitlines()[0])
    parser.add_argument("--resources", type=int, default=110_000)
    parser.add_argument("--openings", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--serve", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        asyncio.run(_serve(args.serve, args.dir, args.resources))
        return
    if args.port:
        asyncio.run(_open(args.port, args.dir, args.resources, args.openings))
        return
    from ambit.tls.certs import issue_server_cert, new_ca

    with tempfile.TemporaryDirectory() as tmp:
        directory, now = Path(tmp), time.time()
        ca = new_ca("opening root", now=now)
        cert = issue_server_cert(ca, common_name="istiod", dns_names=[SERVER_NAME], ip_addresses=[], now=now)
        (directory / "root.pem").write_bytes(ca.cert_pem)
        (directory / "chain.pem").write_bytes(cert.cert_pem + ca.cert_pem)
        (directory / "key.pem").write_bytes(cert.key_pem)
        for round_ in range(args.rounds):
            for mode in args.modes.split(","):
                print(
                    json.dumps(
                        {"round": round_, "mode": mode, "ms_per_opening": round(_measure(mode, directory, args), 2)}
                    ),
                    flush=True,
                )


if __name__ == "__main__":
    main()

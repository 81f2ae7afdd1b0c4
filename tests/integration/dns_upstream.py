"""A scripted DNS server on loopback (UDP and TCP on one port), the upstream of on-demand resolution tests.

Each name in ``script`` says how it is answered: a list of addresses (with ``ttl``), ``"nxdomain"``, ``"silent"``
(never answered), ``"garbage"`` (bytes that are no DNS message), ``"huge"`` (500 A records: truncated over UDP,
whole over TCP), ``"cname:<target>"`` (an alias, then the target's answer in the same message). Every query is
counted in ``asked`` by (name, type).
"""

from __future__ import annotations

import asyncio
import ipaddress
import struct
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset

HOST = "127.0.0.1"
Behaviour = list[str] | str


@dataclass
class ScriptedDns:
    script: dict[str, Behaviour]
    ttl: int = 60
    port: int = 0
    asked: Counter[tuple[str, str]] = field(default_factory=Counter)

    def answer(self, wire: bytes, *, tcp: bool) -> bytes | None:
        query = dns.message.from_wire(wire)
        question = query.question[0]
        name = question.name.to_text(omit_final_dot=True).lower()
        self.asked[(name, dns.rdatatype.to_text(question.rdtype))] += 1
        behaviour = self.script.get(name, "nxdomain")
        if behaviour == "silent":
            return None
        if behaviour == "garbage":
            return b"\x00\x01not dns at all"
        response = dns.message.make_response(query)
        if behaviour == "nxdomain":
            response.set_rcode(dns.rcode.NXDOMAIN)
            return response.to_wire()
        owner = question.name
        if isinstance(behaviour, str) and behaviour.startswith("cname:"):
            target = behaviour.removeprefix("cname:")
            response.answer.append(dns.rrset.from_text(owner, self.ttl, "IN", "CNAME", target + "."))
            owner = dns.name.from_text(target)
            behaviour = self.script.get(target, [])
        if behaviour == "huge":
            behaviour = [str(ipaddress.ip_address("198.18.100.0") + i) for i in range(500)]
        assert isinstance(behaviour, list)
        version = 4 if question.rdtype == dns.rdatatype.A else 6
        wanted = [a for a in behaviour if ipaddress.ip_address(a).version == version]
        if wanted:
            rdtype = "A" if version == 4 else "AAAA"
            response.answer.append(dns.rrset.from_text_list(owner, self.ttl, "IN", rdtype, wanted))
        wire_out = response.to_wire()
        if not tcp and len(wire_out) > 512:
            response.answer.clear()
            response.flags |= dns.flags.TC
            wire_out = response.to_wire()
        return wire_out


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, server: ScriptedDns) -> None:
        self.server = server
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a datagram transport, not of that class

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        out = self.server.answer(data, tcp=False)
        if out is not None and self.transport is not None:
            self.transport.sendto(out, addr)


@asynccontextmanager
async def scripted_dns(script: dict[str, Behaviour], *, ttl: int = 60) -> AsyncIterator[ScriptedDns]:
    """The server, listening on a free loopback port (TCP first, then UDP on the same number)."""
    server = ScriptedDns(script, ttl)

    async def serve_tcp(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            (length,) = struct.unpack("!H", await reader.readexactly(2))
            out = server.answer(await reader.readexactly(length), tcp=True)
            if out is not None:
                writer.write(struct.pack("!H", len(out)) + out)
                await writer.drain()
            else:
                await asyncio.sleep(30)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    tcp = await asyncio.start_server(serve_tcp, HOST, 0)
    server.port = tcp.sockets[0].getsockname()[1]
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(lambda: _Udp(server), local_addr=(HOST, server.port))
    try:
        yield server
    finally:
        transport.close()
        tcp.close()
        await tcp.wait_closed()

"""A ``resolution: NONE`` ServiceEntry at the node proxy (ztunnel's PASSTHROUGH rule, spec §6.3 step 4), from the API
objects: a connection to its address that finds no endpoint goes to the address the pod asked for. The "external"
host is a TCP echo server listening on the entry's address itself (a loopback address here, as a ClusterIP outside
the mesh is upstream)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.integration.proxy_rig import until
from tests.integration.translated_proxy import tcp_echo, translated_proxy

from ambit.model.workload import LoadBalancingMode, Service

pytestmark = pytest.mark.timeout(30)

EXTERNAL_IP = "127.0.0.77"


def entry(port: int, resolution: str | None) -> dict[str, list[dict[str, Any]]]:
    spec: dict[str, Any] = {
        "hosts": ["fake-passthrough.example.com"],
        "ports": [{"name": "tcp", "number": port, "protocol": "TCP"}],
        "location": "MESH_EXTERNAL",
        "addresses": [EXTERNAL_IP],
    }
    if resolution is not None:
        spec["resolution"] = resolution
    obj = {"kind": "ServiceEntry", "metadata": {"name": "external", "namespace": "apps"}, "spec": spec}
    return {"service_entries": [obj]}


@pytest.mark.parametrize("resolution", ["NONE", None])
async def test_a_resolution_none_entry_without_endpoints_is_passed_through_to_the_address_asked_for(
    tmp_path: Path, resolution: str | None
) -> None:
    async with tcp_echo(EXTERNAL_IP, b"external:") as (port, seen), translated_proxy(tmp_path) as proxy:
        items = proxy.apply(entry(port, resolution))
        (service,) = [i for i in items if isinstance(i, Service)]
        assert service.load_balancing_mode is LoadBalancingMode.PASSTHROUGH
        assert await proxy.call((EXTERNAL_IP, port), b"hi") == b"external:hi"
        await until(lambda: not proxy.ctx.connections)
        assert len(seen) == 1


async def test_a_static_entry_without_endpoints_is_refused_and_nothing_is_dialled(tmp_path: Path) -> None:
    async with tcp_echo(EXTERNAL_IP, b"external:") as (port, seen), translated_proxy(tmp_path) as proxy:
        proxy.apply(entry(port, "STATIC"))
        assert await proxy.call((EXTERNAL_IP, port), b"hi") == b""
        await until(lambda: not proxy.ctx.connections)
        assert seen == []


async def test_any_address_in_a_cidr_address_is_the_entry_at_the_node_proxy(tmp_path: Path) -> None:
    """``addresses: [127.0.0.64/26]``: a connection to 127.0.0.77 is the entry's. Resolution NONE passes it through
    to 127.0.0.77; STATIC (no endpoints) refuses it, where an address outside any entry would pass through."""
    async with tcp_echo(EXTERNAL_IP, b"external:") as (port, seen), translated_proxy(tmp_path) as proxy:
        objects = entry(port, "NONE")
        objects["service_entries"][0]["spec"]["addresses"] = ["127.0.0.64/26"]
        (service,) = [i for i in proxy.apply(objects) if isinstance(i, Service)]
        assert [str(v) for v in service.vips] == ["/127.0.0.64/26"]
        assert await proxy.call((EXTERNAL_IP, port), b"hi") == b"external:hi"
        objects["service_entries"][0]["spec"]["resolution"] = "STATIC"
        proxy.apply(objects)
        assert await proxy.call((EXTERNAL_IP, port), b"hi") == b""
        await until(lambda: not proxy.ctx.connections)
        assert len(seen) == 1

"""``ambit waypoint proxy --dns-upstream`` (where the waypoint resolves hostname endpoints: DNS ServiceEntries) and
``--tls-transport`` (HBONE's TLS transport, both legs), as :func:`ambit.cli.l7_proxy.l7_settings` takes them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ambit.cli.argv_flags import UsageError
from ambit.cli.l7_proxy import l7_settings


def settings_with(**overrides: Any) -> Any:
    flags: dict[str, Any] = {
        "namespace": "egress",
        "gateway_name": "egress-gateway",
        "service_account": "egress-gateway",
        "pod_name": "egress-gateway-0",
        "instance_ip": "198.18.0.10",
        "node_name": "node-1",
        "xds_address": None,
        "ca_address": None,
        "root_cert": None,
        "token": None,
        "server_name": "istiod.istio-system.svc",
        "cluster_id": "Kubernetes",
        "trust_domain": "cluster.local",
        "config": Path("mesh.yaml"),
        "local_ca": Path("ca"),
        "admin_port": 15000,
        "stats_port": 15020,
        "readiness_port": 15021,
        "log_json": False,
        **overrides,
    }
    return l7_settings("waypoint", **flags)


def test_without_the_flag_the_waypoint_reads_its_resolv_conf() -> None:
    settings = settings_with()
    assert settings.dns_nameservers == () and settings.resolv_conf == Path("/etc/resolv.conf")


def test_dns_upstreams_are_kept_in_order() -> None:
    settings = settings_with(dns_upstreams=("10.96.0.10", "fd00::a"))
    assert settings.dns_nameservers == ("10.96.0.10", "fd00::a")


@pytest.mark.parametrize("bad", ["dns.example.com", "10.0.0.1:53", "", "10.0.0.256"])
def test_a_dns_upstream_that_is_not_an_ip_address_is_a_clear_error(bad: str) -> None:
    with pytest.raises(UsageError, match="not an IP address") as caught:
        settings_with(dns_upstreams=(bad,))
    assert caught.value.flag == "--dns-upstream"


@pytest.mark.parametrize("transport", ["loop", "socket"])
def test_the_tls_transport_flag_reaches_the_settings_of_both_hbone_legs(transport: str) -> None:
    assert settings_with(tls_transport=transport).tls_transport == transport


def test_the_default_tls_transport_is_the_socket_one() -> None:
    # The loop's TLS answers a peer's KeyUpdate requests without bound (tests/security/test_tls_key_update.py).
    assert settings_with().tls_transport == "socket"

"""The certificate lifetime a node proxy asks for (``--secret-ttl``, else ztunnel's ``SECRET_TTL``), and a waypoint
or gateway (``SECRET_TTL``, as istio-agent reads it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ambit.cli.argv_flags import UsageError
from ambit.cli.l7_proxy import l7_settings
from ambit.inpod.settings import DEFAULT_SECRET_TTL, NodeProxySettingsError, parse_secret_ttl


@pytest.mark.parametrize(
    ("flag", "environ", "seconds"),
    [
        (None, {}, DEFAULT_SECRET_TTL),  # ztunnel's 24 h
        (None, {"SECRET_TTL": "5m"}, 300),  # Istio's ambient test suite
        ("90s", {"SECRET_TTL": "5m"}, 90),  # the flag wins
        (None, {"SECRET_TTL": "3600"}, 3600),
        (None, {"SECRET_TTL": "1h"}, 3600),
        (None, {"SECRET_TTL": "1.5s"}, 1),  # whole seconds on the wire
    ],
)
def test_the_secret_ttl_follows_ztunnels_order(flag: str | None, environ: dict[str, str], seconds: int) -> None:
    assert parse_secret_ttl(flag, environ) == seconds


@pytest.mark.parametrize(
    ("flag", "environ", "message"),
    [
        (None, {"SECRET_TTL": "0"}, "at least 1 second"),
        (None, {"SECRET_TTL": "500ms"}, "at least 1 second"),
        (None, {"SECRET_TTL": "-5m"}, "0 seconds or more"),
        (None, {"SECRET_TTL": "soon"}, "expected seconds"),
        ("5 days", {}, "--secret-ttl"),
    ],
)
def test_a_bad_secret_ttl_is_one_clear_line(flag: str | None, environ: dict[str, str], message: str) -> None:
    with pytest.raises(NodeProxySettingsError, match=message):
        parse_secret_ttl(flag, environ)


def _waypoint() -> int:
    settings = l7_settings(
        "waypoint",
        namespace="shop",
        gateway_name="waypoint",
        service_account="waypoint",
        pod_name="waypoint-0",
        instance_ip=None,
        node_name="node-1",
        xds_address=None,
        ca_address="istiod.istio-system.svc:15012",
        root_cert=Path("root-cert.pem"),
        token=Path("token"),
        server_name="istiod.istio-system.svc",
        cluster_id="Kubernetes",
        trust_domain="cluster.local",
        config=None,
        local_ca=None,
        admin_port=15000,
        stats_port=15020,
        readiness_port=15021,
        log_json=False,
    )
    return settings.secret_ttl


def test_a_waypoint_asks_for_secret_ttl_as_istio_agent_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SECRET_TTL", raising=False)
    assert _waypoint() == DEFAULT_SECRET_TTL
    monkeypatch.setenv("SECRET_TTL", "5m")
    assert _waypoint() == 300
    monkeypatch.setenv("SECRET_TTL", "never")
    with pytest.raises(UsageError, match="SECRET_TTL"):
        _waypoint()

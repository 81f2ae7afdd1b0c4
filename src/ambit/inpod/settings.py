"""Settings of the node proxy (``ambit nodeproxy``), parsed once at start-up and passed down."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ambit.model.identity import DEFAULT_TRUST_DOMAIN


@dataclass(frozen=True, slots=True)
class NodeProxySettings:
    node: str
    """The node this proxy serves (workloads with this ``node`` are local)."""
    zds_socket: Path
    """The node agent's ZDS socket (spec §3)."""
    config_file: Path | None = None
    """Workloads and services from a local YAML file (ztunnel's local mode), reloaded when it changes."""
    local_ca_dir: Path | None = None
    """Sign workload certificates with a root kept in this directory (until the control plane's CA exists)."""
    xds_address: str | None = None
    """The control plane's ``HOST:PORT`` for the workload API (delta xDS); replaces ``config_file``."""
    ca_address: str | None = None
    """The control plane's ``HOST:PORT`` for workload certificates; replaces ``local_ca_dir``."""
    root_cert_file: Path | None = None
    """The mesh root (PEM) that the control plane's serving certificate must chain to."""
    token_file: Path | None = None
    """The proxy's service-account token (audience ``istio-ca``), re-read on every use."""
    xds_server_name: str = "istiod.istio-system.svc"
    """The name the control plane's certificate is verified against."""
    cluster_id: str = "Kubernetes"
    trust_domain: str = DEFAULT_TRUST_DOMAIN
    """The mesh's trust domain: peers from another one are refused."""
    network: str = ""
    """The network this node is on (addresses are looked up as ``network/IP``)."""
    admin_port: int = 15000
    """Admin (``/config_dump``, ``/quitquitquit``) on 127.0.0.1 of the proxy's own netns."""
    stats_port: int = 15020
    """Prometheus metrics (``/metrics``, ``/stats/prometheus``)."""
    readiness_port: int = 15021
    """``/healthz/ready``."""
    log_json: bool = False
    """Access log lines as JSON instead of ``key=value``."""
    event_loop: str = "uvloop"
    """The event loop the proxy runs on: ``uvloop`` or ``asyncio`` (see :mod:`ambit.inpod.eventloop`). uvloop is
    the default since the connection-churn soak test (``tests/integration/test_uvloop_churn.py``) passes under it."""

"""``ambit waypoint proxy`` and ``ambit gateway`` as their pods run them: argparse reads their flags
(:mod:`ambit.cli.l7_proxy_flags`), which are judged and turned into the L7 process's
:class:`~ambit.waypoint.settings.WaypointSettings`, and the process runs with a clean error instead of a traceback.

Both are the same L7 engine in a pod that knows itself from its environment (POD_NAMESPACE, GATEWAY_NAME, ...);
only what they serve differs (HBONE from node proxies, or the Gateway's listeners). Their certificate lifetime is
``$SECRET_TTL`` (as istio-agent reads it; default 24 h); INSTANCE_IPS lists a dual-stack pod's addresses.

``ambit``'s entry point hands ``ambit waypoint proxy ...`` to :func:`waypoint_main` and ``ambit gateway ...`` to
:func:`gateway_main` before it imports typer, so this module imports no command-line library but argparse. The typer
declarations of the same commands (:mod:`ambit.cli.waypoint_proxy`, :mod:`ambit.cli.gateway`) call
:func:`start_waypoint` and :func:`start_gateway` too. Exit statuses follow :mod:`ambit.cli.argv_flags`'s rule 5: 2
for a bad flag or environment variable (one line naming it), 1 when the process fails (``<command>: <error>``)."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ambit.cli.argv_flags import CommandFailed, UsageError, build_parser, run_command
from ambit.cli.l7_proxy_flags import GATEWAY_FLAGS, GATEWAY_PROG, WAYPOINT_FLAGS, WAYPOINT_PROG

if TYPE_CHECKING:
    from ambit.waypoint.settings import WaypointSettings

__all__ = [
    "GATEWAY_DESCRIPTION",
    "WAYPOINT_DESCRIPTION",
    "gateway_main",
    "l7_settings",
    "run_l7",
    "start_gateway",
    "start_waypoint",
    "waypoint_main",
]

WAYPOINT_DESCRIPTION = (
    "Run a waypoint: HBONE in on 15008, HTTP routed per request, metrics on 15020, readiness on 15021."
)

GATEWAY_DESCRIPTION = """\
Run an ingress gateway: its Gateway's HTTP and HTTPS listeners, routed by HTTPRoutes to mesh Services over
HBONE; metrics on 15020, readiness on 15021."""


def waypoint_main(argv: Sequence[str]) -> int:
    """Parse ``argv`` (the arguments after ``waypoint proxy``), run the waypoint, and return the exit status."""
    return run_command(
        build_parser(WAYPOINT_PROG, WAYPOINT_DESCRIPTION, WAYPOINT_FLAGS), start_waypoint, argv, WAYPOINT_PROG
    )


def gateway_main(argv: Sequence[str]) -> int:
    """Parse ``argv`` (the arguments after ``gateway``), run the ingress gateway, and return the exit status."""
    return run_command(
        build_parser(GATEWAY_PROG, GATEWAY_DESCRIPTION, GATEWAY_FLAGS), start_gateway, argv, GATEWAY_PROG
    )


def l7_settings(
    role: str,
    *,
    namespace: str,
    gateway_name: str,
    service_account: str,
    pod_name: str,
    instance_ip: str | None,
    node_name: str,
    xds_address: str | None,
    ca_address: str | None,
    root_cert: Path | None,
    token: Path | None,
    server_name: str,
    cluster_id: str,
    trust_domain: str,
    config: Path | None,
    local_ca: Path | None,
    admin_port: int,
    stats_port: int,
    readiness_port: int,
    log_json: bool,
    hbone_port: int = 15008,
    dns_upstreams: tuple[str, ...] = (),
    tls_transport: str = "socket",
) -> WaypointSettings:
    """The settings of a ``role`` ("waypoint" or "gateway") process; a bad flag is a :class:`UsageError` naming it."""
    from ambit.inpod.settings import NodeProxySettingsError, parse_secret_ttl
    from ambit.model.identity import IdentityError, SpiffeId, check_trust_domain
    from ambit.waypoint.errors import WaypointSettingsError
    from ambit.waypoint.settings import WaypointSettings, accepts_http10

    for flag, check in (
        ("--trust-domain", lambda: check_trust_domain(trust_domain)),
        ("--namespace", lambda: SpiffeId(trust_domain, namespace, "default")),
        ("--service-account", lambda: SpiffeId(trust_domain, namespace, service_account or "default")),
    ):
        try:
            check()
        except IdentityError as exc:
            raise UsageError(str(exc), flag) from None
    if instance_ip:
        try:
            ipaddress.ip_address(instance_ip)
        except ValueError:
            raise UsageError(f"not an IP address: {instance_ip!r}", "--instance-ip") from None
    instance_ips = tuple(ip.strip() for ip in os.environ.get("INSTANCE_IPS", "").split(",") if ip.strip())
    for ip in instance_ips:
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            raise UsageError(f"not an IP address: {ip!r}", "INSTANCE_IPS") from None
    if tls_transport not in ("loop", "socket"):
        raise UsageError(f"unknown TLS transport {tls_transport!r}: loop or socket", "--tls-transport")
    if (xds_address or ca_address) and (root_cert is None or token is None):
        raise UsageError("--xds-address and --ca-address need --root-cert and --token")
    if not (ca_address or local_ca):
        raise UsageError("give --ca-address (with --root-cert and --token) or --local-ca")
    if not gateway_name:
        raise UsageError(f"the {role} needs its Gateway name (--gateway-name or GATEWAY_NAME)", "--gateway-name")
    try:
        secret_ttl = parse_secret_ttl(None, os.environ)
    except NodeProxySettingsError as exc:
        raise UsageError(str(exc)) from None  # the message names $SECRET_TTL
    try:
        accept_http10 = accepts_http10(os.environ)
    except WaypointSettingsError as exc:
        raise UsageError(str(exc)) from None  # the message names $PILOT_HTTP10
    for upstream in dns_upstreams:
        try:
            ipaddress.ip_address(upstream)
        except ValueError:
            raise UsageError(f"not an IP address: {upstream!r}", "--dns-upstream") from None
    return WaypointSettings(
        namespace=namespace,
        gateway_name=gateway_name,
        service_account=service_account,
        pod_name=pod_name,
        instance_ip=instance_ip or None,
        instance_ips=instance_ips,
        node_name=node_name,
        trust_domain=trust_domain,
        cluster_id=cluster_id,
        xds_address=xds_address,
        ca_address=ca_address,
        root_cert_file=root_cert,
        token_file=token,
        xds_server_name=server_name,
        secret_ttl=secret_ttl,
        config_file=None if xds_address else config,
        local_ca_dir=None if ca_address else local_ca,
        hbone_port=hbone_port,
        admin_port=admin_port,
        stats_port=stats_port,
        readiness_port=readiness_port,
        log_json=log_json,
        dns_nameservers=dns_upstreams,
        tls_transport="socket" if tls_transport == "socket" else "loop",
        accept_http10=accept_http10,
    )


def start_waypoint(
    *,
    namespace: str,
    gateway_name: str,
    service_account: str = "default",
    pod_name: str = "",
    instance_ip: str | None = None,
    node_name: str = "",
    xds_address: str | None = None,
    ca_address: str | None = None,
    root_cert: Path | None = None,
    token: Path | None = None,
    server_name: str = "istiod.istio-system.svc",
    cluster_id: str = "Kubernetes",
    trust_domain: str = "cluster.local",
    config: Path | None = None,
    local_ca: Path | None = None,
    hbone_port: int = 15008,
    tls_transport: str = "socket",
    admin_port: int = 15000,
    stats_port: int = 15020,
    readiness_port: int = 15021,
    admin_token_file: Path | None = None,
    log_json: bool = False,
    dns_upstream: list[str] | None = None,
) -> None:
    """Check the flags (:class:`UsageError`) before anything takes effect, then run the waypoint until it ends
    (:class:`CommandFailed` if it fails)."""
    settings = l7_settings(
        "waypoint",
        namespace=namespace,
        gateway_name=gateway_name,
        service_account=service_account,
        pod_name=pod_name,
        instance_ip=instance_ip,
        node_name=node_name,
        xds_address=xds_address,
        ca_address=ca_address,
        root_cert=root_cert,
        token=token,
        server_name=server_name,
        cluster_id=cluster_id,
        trust_domain=trust_domain,
        config=config,
        local_ca=local_ca,
        admin_port=admin_port,
        stats_port=stats_port,
        readiness_port=readiness_port,
        log_json=log_json,
        hbone_port=hbone_port,
        dns_upstreams=tuple(dns_upstream or ()),
        tls_transport=tls_transport,
    )
    from ambit.waypoint.process import run_waypoint  # the data path's imports: only once the arguments are good

    run_l7(lambda: run_waypoint(settings, admin_token_file=admin_token_file), "uvloop")


def start_gateway(
    *,
    namespace: str,
    gateway_name: str,
    service_account: str = "default",
    pod_name: str = "",
    instance_ip: str | None = None,
    node_name: str = "",
    xds_address: str | None = None,
    ca_address: str | None = None,
    root_cert: Path | None = None,
    token: Path | None = None,
    server_name: str = "istiod.istio-system.svc",
    cluster_id: str = "Kubernetes",
    trust_domain: str = "cluster.local",
    config: Path | None = None,
    local_ca: Path | None = None,
    tls_transport: str = "socket",
    admin_port: int = 15000,
    stats_port: int = 15020,
    readiness_port: int = 15021,
    admin_token_file: Path | None = None,
    log_json: bool = False,
) -> None:
    """Check the flags (:class:`UsageError`) before anything takes effect, then run the ingress gateway until it
    ends (:class:`CommandFailed` if it fails)."""
    settings = l7_settings(
        "gateway",
        namespace=namespace,
        gateway_name=gateway_name,
        service_account=service_account,
        pod_name=pod_name,
        instance_ip=instance_ip,
        node_name=node_name,
        xds_address=xds_address,
        ca_address=ca_address,
        root_cert=root_cert,
        token=token,
        server_name=server_name,
        cluster_id=cluster_id,
        trust_domain=trust_domain,
        config=config,
        local_ca=local_ca,
        admin_port=admin_port,
        stats_port=stats_port,
        readiness_port=readiness_port,
        log_json=log_json,
        tls_transport=tls_transport,
    )
    from ambit.waypoint.ingress import run_gateway  # the data path's imports: only once the arguments are good

    run_l7(lambda: run_gateway(settings, admin_token_file=admin_token_file), "asyncio")


def run_l7(main: Callable[[], Coroutine[Any, Any, None]], loop: str) -> None:
    """Run ``main`` on event loop ``loop``; an :class:`~ambit.errors.AmbitError` or OS error is a
    :class:`CommandFailed` (the command's entry point prints ``<command>: <error>``, exit status 1)."""
    from ambit import native
    from ambit.cli.process_logging import configure_logging
    from ambit.errors import AmbitError
    from ambit.heap import tune_collector
    from ambit.inpod import eventloop

    try:
        native.selection()  # once, at start-up: AMBIT_NATIVE=1 without a usable extension stops here
    except native.NativeError as exc:
        raise CommandFailed(str(exc)) from None
    configure_logging()
    tune_collector()  # as the node proxy: a request's young objects die by reference counting
    try:
        eventloop.run(main, loop)
    except (AmbitError, OSError) as exc:
        raise CommandFailed(str(exc)) from None

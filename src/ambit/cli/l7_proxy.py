"""What ``ambit waypoint proxy`` and ``ambit gateway`` share: their flags judged and turned into the L7 process's
:class:`~ambit.waypoint.settings.WaypointSettings`, and the run with a clean error instead of a traceback.

Both are the same L7 engine in a pod that knows itself from its environment (POD_NAMESPACE, GATEWAY_NAME, ...);
only what they serve differs (HBONE from node proxies, or the Gateway's listeners). Their certificate lifetime is
``$SECRET_TTL`` (as istio-agent reads it; default 24 h)."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import typer

from ambit.waypoint.settings import WaypointSettings

__all__ = ["l7_settings", "run_l7"]


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
) -> WaypointSettings:
    """The settings of a ``role`` ("waypoint" or "gateway") process; a bad flag is a :class:`typer.BadParameter`."""
    from ambit.inpod.settings import NodeProxySettingsError, parse_secret_ttl
    from ambit.model.identity import IdentityError, SpiffeId, check_trust_domain

    try:
        check_trust_domain(trust_domain)
        SpiffeId(trust_domain, namespace, service_account or "default")
    except IdentityError as exc:
        raise typer.BadParameter(str(exc)) from None
    if instance_ip:
        try:
            ipaddress.ip_address(instance_ip)
        except ValueError:
            raise typer.BadParameter(f"not an IP address: {instance_ip!r}", param_hint="--instance-ip") from None
    instance_ips = tuple(ip.strip() for ip in os.environ.get("INSTANCE_IPS", "").split(",") if ip.strip())
    for ip in instance_ips:
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            raise typer.BadParameter(f"not an IP address: {ip!r}", param_hint="INSTANCE_IPS") from None
    if (xds_address or ca_address) and (root_cert is None or token is None):
        raise typer.BadParameter("--xds-address and --ca-address need --root-cert and --token")
    if not (ca_address or local_ca):
        raise typer.BadParameter("give --ca-address (with --root-cert and --token) or --local-ca")
    if not gateway_name:
        raise typer.BadParameter(f"the {role} needs its Gateway name (--gateway-name or GATEWAY_NAME)")
    try:
        secret_ttl = parse_secret_ttl(None, os.environ)
    except NodeProxySettingsError as exc:
        raise typer.BadParameter(str(exc)) from None
    for upstream in dns_upstreams:
        try:
            ipaddress.ip_address(upstream)
        except ValueError:
            raise typer.BadParameter(f"not an IP address: {upstream!r}", param_hint="--dns-upstream") from None
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
    )


def run_l7(command: str, main: Callable[[], Coroutine[Any, Any, None]], loop: str) -> None:
    """Run ``main`` on event loop ``loop``; an :class:`~ambit.errors.AmbitError` or OS error ends ``command`` with
    its message and exit status 1."""
    from ambit.cli.process_logging import configure_logging
    from ambit.errors import AmbitError
    from ambit.inpod import eventloop

    configure_logging()
    try:
        eventloop.run(main, loop)
    except (AmbitError, OSError) as exc:
        typer.echo(f"{command}: {exc}", err=True)
        raise typer.Exit(1) from None

"""``ambit nodeproxy``: a node's proxy (ztunnel's role), started from a command line argparse reads.

Theory of operation. ``ambit``'s entry point (:func:`ambit.cli.main.main`) hands ``ambit nodeproxy ...`` to
:func:`main` before it imports typer, so the process holds only the standard library's argparse, this module and,
once the arguments are good, the data path (:mod:`ambit.inpod.daemon`). The flags are :data:`FLAGS
<ambit.cli.nodeproxy_flags.FLAGS>`; :func:`start` checks them and runs the proxy, and is also the body of the typer
declaration of the same command (``ambit.cli.mesh``), which the tests hold to the same flags.

Exit statuses, as under typer (:mod:`ambit.cli.argv_flags`'s rule 5): 0 when the proxy ends, 2 for a usage error
(a bad or missing flag, a check of :func:`start`'s), 1 for a failure (no lab in ``--lab-dir``) or Ctrl-C before the
proxy handles signals. Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ambit.cli.argv_flags import CommandFailed, UsageError, build_parser, run_command
from ambit.cli.nodeproxy_flags import FLAGS, PROG

if TYPE_CHECKING:
    from ambit.lab.network.topology import Topology

__all__ = ["ZDS_DIR", "CommandFailed", "UsageError", "main", "start"]

ZDS_DIR = Path("/var/run/ztunnel")
"""Where the node agent serves ZDS and the node proxy connects, as a hostPath both pods mount (Istio's path)."""

DESCRIPTION = """\
Run a lab node's proxy: in-pod listeners for the pods the node agent hands over (ZDS), and the data path.

Workloads come from the control plane (--xds-address) or a local file (--config); certificates from the control
plane's CA (--ca-address) or a local CA directory (--local-ca)."""


def main(argv: Sequence[str]) -> int:
    """Parse ``argv`` (the arguments after ``nodeproxy``), run the node proxy, and return the exit status."""
    return run_command(build_parser(PROG, DESCRIPTION, FLAGS), start, argv, "ambit")


def _lab_node(directory: Path, node: str) -> Topology:
    from ambit.lab.network.topology import Topology

    topology = Topology.load(directory.resolve())
    if topology is None:
        raise CommandFailed(f"no lab in {directory}")
    if topology.node_named(node) is None:
        raise UsageError(f"no node {node!r} in this lab")
    return topology


def _open_files_limit() -> int | None:
    """The process's soft descriptor limit, or None when unlimited."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def dns_upstreams(values: Sequence[str]) -> list[str]:
    """``--dns-upstream`` values, each a numeric IP address."""
    import ipaddress

    out = []
    for value in values:
        try:
            out.append(str(ipaddress.ip_address(value)))
        except ValueError:
            raise UsageError(f"{value!r} is not an IP address", "--dns-upstream") from None
    return out


def start(
    *,
    node: str,
    directory: Path | None = None,
    config: Path | None = None,
    local_ca: Path | None = None,
    xds_address: str | None = None,
    ca_address: str | None = None,
    root_cert: Path | None = None,
    token: Path | None = None,
    server_name: str = "istiod.istio-system.svc",
    cluster_id: str = "Kubernetes",
    trust_domain: str = "cluster.local",
    event_loop: str = "uvloop",
    admin_token_file: Path | None = None,
    pool_max_streams: str | None = None,
    dns_upstream: list[str] | None = None,
    dns_proxy: bool = True,
    xds_on_demand: bool = False,
    flow_log_size: int = 4096,
    crl_path: Path | None = None,
    pool_idle_timeout: str | None = None,
    drain_deadline: str | None = None,
    drain_max: str | None = None,
    secret_ttl: str | None = None,
    tls_transport: str = "socket",
    notify_fd: int | None = None,
    workers: str | None = None,
) -> None:
    """Check the flags (:class:`UsageError`, :class:`CommandFailed`) before anything takes effect, then run the
    node proxy until it ends."""
    from ambit.inpod import eventloop
    from ambit.inpod.settings import (
        NodeProxySettings,
        NodeProxySettingsError,
        own_pod_from_environment,
        parse_connection_bounds,
        parse_drain_deadline,
        parse_drain_max,
        parse_ipv6_enabled,
        parse_pool_limits,
        parse_secret_ttl,
        parse_workers,
    )
    from ambit.model.identity import IdentityError, check_trust_domain
    from ambit.zds import ZDS_SOCKET

    try:
        check_trust_domain(trust_domain)
    except IdentityError as exc:
        raise UsageError(str(exc), "--trust-domain") from None
    try:
        eventloop.loop_factory(event_loop)
    except eventloop.EventLoopError as exc:
        raise UsageError(str(exc), "--event-loop") from None
    if tls_transport not in ("loop", "socket"):
        raise UsageError(f"unknown TLS transport {tls_transport!r}: loop or socket", "--tls-transport")
    try:
        max_streams, idle_timeout = parse_pool_limits(pool_max_streams, pool_idle_timeout, os.environ)
        deadline = parse_drain_deadline(drain_deadline, os.environ)
        longest = parse_drain_max(drain_max, os.environ, deadline)
        ttl = parse_secret_ttl(secret_ttl, os.environ)
        bounds = parse_connection_bounds(os.environ, _open_files_limit())
        ipv6 = parse_ipv6_enabled(os.environ)
        processes = parse_workers(workers, os.environ)
    except NodeProxySettingsError as exc:
        raise UsageError(str(exc)) from None
    if notify_fd is not None:
        try:
            os.fstat(notify_fd)
        except OSError:
            raise UsageError(f"file descriptor {notify_fd} is not open", "--notify-fd") from None
    dns_nameservers = tuple(dns_upstreams(dns_upstream or []))
    if (xds_address or ca_address) and (root_cert is None or token is None):
        raise UsageError("--xds-address and --ca-address need --root-cert and --token")
    default_config: Path | None
    default_ca: Path | None
    own_pod, own_address = None, None
    if directory is not None:  # a host process of a lab: the lab's paths and, without a control plane, its files
        topology = _lab_node(directory, node)
        zds_socket = topology.node_dir(node) / "run" / ZDS_SOCKET
        default_config, default_ca = topology.mesh_config_file, topology.mesh_ca_dir
    else:  # in a pod (the ztunnel DaemonSet): the standard paths, and a control plane or explicit files
        zds_socket = ZDS_DIR / ZDS_SOCKET
        default_config = default_ca = None
        own_pod, own_address = own_pod_from_environment(os.environ)  # the self-proxy listener's pod
        if not (xds_address or config) or not (ca_address or local_ca):
            raise UsageError(
                "in a pod (no --lab-dir), give --xds-address (or --config) and --ca-address (or --local-ca)"
            )
    if xds_on_demand and dns_proxy:
        raise UsageError(
            "--xds-on-demand needs --no-dns-proxy: the DNS proxy answers from every workload", "--xds-on-demand"
        )
    if xds_on_demand and not xds_address:
        raise UsageError("--xds-on-demand asks a control plane: give --xds-address", "--xds-on-demand")
    settings = NodeProxySettings(
        node=node,
        zds_socket=zds_socket,
        config_file=None if xds_address else (config or default_config),
        local_ca_dir=None if ca_address else (local_ca or default_ca),
        xds_address=xds_address,
        ca_address=ca_address,
        root_cert_file=root_cert,
        token_file=token,
        xds_server_name=server_name,
        cluster_id=cluster_id,
        trust_domain=trust_domain,
        pool_max_streams=max_streams,
        pool_idle_timeout=idle_timeout,
        event_loop=event_loop,
        tls_transport="socket" if tls_transport == "socket" else "loop",
        admin_token_file=admin_token_file,
        dns_proxy=dns_proxy,
        xds_on_demand=xds_on_demand,
        dns_nameservers=dns_nameservers,
        flow_log_size=flow_log_size,
        crl_path=None if crl_path is None or str(crl_path) in ("", ".") else crl_path,
        drain_deadline=deadline,
        drain_max=longest,
        secret_ttl=ttl,
        connection_bounds=bounds,
        ipv6=ipv6,
        notify_fd=notify_fd,
        own_pod=own_pod,
        own_address=own_address,
        workers=processes,
    )
    from ambit import native

    try:
        data_path = native.selection()  # once, at start-up: AMBIT_NATIVE=1 without a usable extension stops here
    except native.NativeError as exc:
        raise CommandFailed(str(exc)) from None
    from ambit.cli.process_logging import configure_logging
    from ambit.heap import tune_collector
    from ambit.inpod.allocator import tune_allocator
    from ambit.inpod.daemon import run_node_proxy  # the data path's imports: only once the arguments are good

    configure_logging()
    records = data_path.describe() if settings.tls_transport == "socket" else "the loop's"
    logging.getLogger("ambit.nodeproxy").info(
        "HBONE TLS transport %s, TLS records: %s", settings.tls_transport, records
    )
    tune_allocator()
    tune_collector()
    eventloop.run(lambda: run_node_proxy(settings), settings.event_loop)

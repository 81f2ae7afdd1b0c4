"""The command lines of ``ambit waypoint proxy`` and ``ambit gateway``: one table of flags each, read by
:mod:`ambit.cli.argv_flags`'s parser.

Both are the long-running process of a pod, so ``ambit``'s entry point hands them to argparse
(:func:`ambit.cli.l7_proxy.waypoint_main`, :func:`~ambit.cli.l7_proxy.gateway_main`) and typer, click and rich stay
out of their memory. ``ambit.cli.waypoint_proxy`` and ``ambit.cli.gateway`` declare the same commands for typer (so
``ambit --help`` lists them); ``tests/unit/test_cli_l7_proxy.py`` holds each declaration to its table: flags, help,
defaults, environment variables and parsed values.

The pod tells the process who it is through the variables Istio's waypoint and gateway pods get (POD_NAMESPACE,
GATEWAY_NAME, SERVICE_ACCOUNT, POD_NAME, INSTANCE_IP, NODE_NAME); the controller's rendering
(:mod:`ambit.controlplane.gateway.render`) gives the rest as flags.

To add a flag: a :class:`~ambit.cli.argv_flags.Flag` in the command's table (its ``dest`` is the keyword
:func:`ambit.cli.l7_proxy.start_waypoint` or ``start_gateway`` receives), the same option on the typer declaration,
and its use in the ``start_*`` function.
"""

from __future__ import annotations

from pathlib import Path

from ambit.cli.argv_flags import Flag

__all__ = ["GATEWAY_FLAGS", "GATEWAY_PROG", "WAYPOINT_FLAGS", "WAYPOINT_PROG"]

WAYPOINT_PROG = "ambit waypoint proxy"
GATEWAY_PROG = "ambit gateway"


def _identity(namespace_help: str, name_help: str, ip_help: str) -> tuple[Flag, ...]:
    """Who the pod is: its namespace, Gateway, service account, pod, addresses and node, from its environment."""
    return (
        Flag("--namespace", "namespace", namespace_help, required=True, envvar="POD_NAMESPACE"),
        Flag("--gateway-name", "gateway_name", name_help, required=True, envvar="GATEWAY_NAME"),
        Flag(
            "--service-account",
            "service_account",
            "The pod's service account.",
            default="default",
            envvar="SERVICE_ACCOUNT",
        ),
        Flag("--pod-name", "pod_name", "The pod's name.", default="", envvar="POD_NAME"),
        Flag("--instance-ip", "instance_ip", ip_help, envvar="INSTANCE_IP"),
        Flag("--node-name", "node_name", "The node's name.", default="", envvar="NODE_NAME"),
    )


def _control_plane(certificate_of: str) -> tuple[Flag, ...]:
    """Where configuration and the certificate of ``certificate_of`` ("the waypoint's") come from."""
    return (
        Flag("--xds-address", "xds_address", "Control plane HOST:PORT for the workload API (delta xDS)."),
        Flag("--ca-address", "ca_address", f"Control plane HOST:PORT for {certificate_of} certificate."),
        Flag("--root-cert", "root_cert", "The mesh root (PEM) the control plane is verified with.", Path),
        Flag("--token", "token", "Service-account token (audience istio-ca), re-read on use.", Path),
        Flag(
            "--xds-server-name",
            "server_name",
            "The name the control plane's certificate is checked against.",
            default="istiod.istio-system.svc",
        ),
        Flag("--cluster-id", "cluster_id", "This cluster's id.", default="Kubernetes"),
        Flag("--trust-domain", "trust_domain", "The mesh's trust domain.", default="cluster.local"),
        Flag("--config", "config", "Workloads and services from this YAML file instead of xDS.", Path),
        Flag("--local-ca", "local_ca", f"Sign {certificate_of} certificate with the CA in this directory.", Path),
    )


_PORTS = (
    Flag("--admin-port", "admin_port", "Admin port (127.0.0.1).", int, default=15000),
    Flag("--stats-port", "stats_port", "Prometheus metrics port.", int, default=15020),
    Flag("--readiness-port", "readiness_port", "Readiness port.", int, default=15021),
)

_TLS_TRANSPORT = Flag(
    "--tls-transport",
    "tls_transport",
    "HBONE's TLS transport: socket (TLS on the socket itself, the default) or loop (the event loop's, memory "
    "BIOs; answers a peer's TLS KeyUpdate requests without bound, so kept for comparison only).",
    default="socket",
    envvar="HBONE_TLS_TRANSPORT",
)

_OUTPUT = (
    Flag("--admin-token-file", "admin_token_file", "Write the admin POSTs' token here (mode 0600).", Path),
    Flag("--log-json", "log_json", "Access log lines as JSON.", bool, default=False, negatable=False),
)

WAYPOINT_FLAGS: tuple[Flag, ...] = (
    *_identity("The waypoint's namespace.", "The waypoint's Gateway name.", "The pod's IP (HBONE listens there)."),
    *_control_plane("the waypoint's"),
    Flag("--hbone-port", "hbone_port", "HBONE listener port.", int, default=15008),
    _TLS_TRANSPORT,
    *_PORTS,
    *_OUTPUT,
    Flag(
        "--dns-upstream",
        "dns_upstream",
        "Nameserver IP for hostname endpoints (DNS ServiceEntries); repeatable. Default: /etc/resolv.conf.",
        repeatable=True,
    ),
)
"""Every flag of ``ambit waypoint proxy``, in the order ``--help`` lists them."""

GATEWAY_FLAGS: tuple[Flag, ...] = (
    *_identity("The Gateway's namespace.", "The Gateway's name.", "The pod's IP (listeners bind there)."),
    *_control_plane("the gateway's"),
    _TLS_TRANSPORT,
    *_PORTS,
    *_OUTPUT,
)
"""Every flag of ``ambit gateway``, in the order ``--help`` lists them."""

"""The node proxy's command line: one table of its flags, read by :mod:`ambit.cli.argv_flags`'s parser.

``ambit nodeproxy`` is the process every node runs and restarts on each hand-over, so its command line is parsed
with the standard library's argparse (:mod:`ambit.cli.nodeproxy`), not typer: typer, click, rich and the other
commands' modules stay out of its memory. ``ambit.cli.mesh`` declares the same command for typer (hidden, never
dispatched to by ``ambit``'s entry point); ``tests/unit/test_cli_nodeproxy.py`` holds the two to the same flags,
help, defaults, environment variables and parsed values.

To add a flag: a :class:`~ambit.cli.argv_flags.Flag` in :data:`FLAGS` (its ``dest`` is the keyword
:func:`ambit.cli.nodeproxy.start` receives), the same option on ``ambit.cli.mesh.nodeproxy``'s typer declaration,
and its use in ``start``.
"""

from __future__ import annotations

from pathlib import Path

from ambit.cli.argv_flags import Flag

__all__ = ["FLAGS", "PROG"]

PROG = "ambit nodeproxy"

_IN_LAB = "[default: <lab>/{}]"

FLAGS: tuple[Flag, ...] = (
    Flag("--node", "node", "The node's name.", required=True),
    Flag(
        "--lab-dir",
        "directory",
        "Run as a host process of this lab [default: in a pod, with the standard paths].",
        Path,
    ),
    Flag(
        "--config",
        "config",
        f"Workloads and services from this YAML file {_IN_LAB.format('mesh/workloads.yaml')}.",
        Path,
    ),
    Flag(
        "--local-ca",
        "local_ca",
        f"Sign workload certificates with the CA in this directory {_IN_LAB.format('mesh/ca')}.",
        Path,
    ),
    Flag("--xds-address", "xds_address", "Control plane HOST:PORT for the workload API (delta xDS)."),
    Flag("--ca-address", "ca_address", "Control plane HOST:PORT for workload certificates."),
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
    Flag("--event-loop", "event_loop", "The event loop to run on: uvloop or asyncio.", default="uvloop"),
    Flag(
        "--admin-token-file",
        "admin_token_file",
        "Write the token the admin POSTs (/quitquitquit, /logging) need here, mode 0600 "
        f"{_IN_LAB.format('nodes/<node>/run/admin-token')}.",
        Path,
    ),
    Flag(
        "--pool-max-streams",
        "pool_max_streams",
        "Tunnels per pooled HBONE connection (else $POOL_MAX_STREAMS_PER_CONNECTION, else 100).",
        metavar="N",
    ),
    Flag(
        "--dns-upstream",
        "dns_upstream",
        "Forward the pods' unanswered DNS queries to this resolver (repeatable) "
        "[default: each pod's own resolv.conf nameservers].",
        metavar="IP",
        repeatable=True,
    ),
    Flag("--dns-proxy", "dns_proxy", "Answer DNS on 15053 in each pod.", bool, default=True),
    Flag(
        "--xds-on-demand",
        "xds_on_demand",
        "Ask the control plane for each address when a connection needs it instead of holding every workload "
        "(large meshes; needs --no-dns-proxy).",
        bool,
        default=False,
        envvar="XDS_ON_DEMAND",
    ),
    Flag(
        "--flow-log-size",
        "flow_log_size",
        "Connections kept for admin GET /flows (`ambit flows`); 0: no flow log.",
        int,
        default=4096,
        minimum=0,
        maximum=1_000_000,
    ),
    Flag(
        "--crl-path",
        "crl_path",
        "Check peers' certificate chains against this CRL bundle (PEM), watched for changes; a missing "
        "file means no checks until it appears [default: no CRL checks].",
        Path,
        envvar="CRL_PATH",
    ),
    Flag(
        "--pool-idle-timeout",
        "pool_idle_timeout",
        "Seconds a pooled connection without tunnels is kept, 0: closed when its last tunnel ends "
        "(else $POOL_UNUSED_RELEASE_TIMEOUT, else 300).",
        metavar="SECONDS",
    ),
    Flag(
        "--drain-deadline",
        "drain_deadline",
        "On SIGTERM or /quitquitquit with no successor, seconds the connections already open may run "
        "before they are closed (else $CONNECTION_TERMINATION_DEADLINE, else $TERMINATION_GRACE_PERIOD_SECONDS "
        "less 5, else 5).",
        metavar="SECONDS",
    ),
    Flag(
        "--drain-max",
        "drain_max",
        "On SIGTERM or /quitquitquit once the node agent said a successor took over every pod, seconds "
        "the connections already open may run before they are closed (else $DRAIN_MAX, else 1h; at most "
        "$TERMINATION_GRACE_PERIOD_SECONDS less 5, at least the --drain-deadline).",
        metavar="SECONDS",
    ),
    Flag(
        "--secret-ttl",
        "secret_ttl",
        "Validity asked of the CA for each workload certificate, refreshed at half life, e.g. 5m "
        "(else $SECRET_TTL, else 24h).",
        metavar="DURATION",
    ),
    Flag(
        "--tls-transport",
        "tls_transport",
        "HBONE's TLS transport: socket (TLS on the socket itself, the default) or loop (the event loop's, memory "
        "BIOs; answers a peer's TLS KeyUpdate requests without bound, so kept for comparison only).",
        default="socket",
        envvar="HBONE_TLS_TRANSPORT",
    ),
    Flag(
        "--notify-fd",
        "notify_fd",
        "Write READY=1 to this inherited file descriptor once ready (a supervisor's hand-over waits for it).",
        int,
        metavar="FD",
        minimum=3,
    ),
    Flag(
        "--workers",
        "workers",
        "Processes serving the node's pods, each on a core of its own: this one and N-1 workers "
        "(else $ZTUNNEL_WORKER_THREADS, else 1; at most 32).",
        metavar="N",
    ),
)
"""Every flag of ``ambit nodeproxy``, in the order ``--help`` lists them."""

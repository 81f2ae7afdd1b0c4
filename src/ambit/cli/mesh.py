"""``ambit nodeagent`` and ``ambit nodeproxy``: the mesh's per-node processes, as ``ambit lab up --mesh`` runs them."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from typing import Annotated, Any

import typer

from ambit.cli.app import TlsTransportOption, app, run_argv_command
from ambit.cli.nodeproxy import ZDS_DIR, start
from ambit.cli.process_logging import configure_logging
from ambit.lab.network.topology import Topology
from ambit.zds import ZDS_SOCKET

NodeOption = Annotated[str, typer.Option("--node", help="The node's name.")]
InClusterLabDir = Annotated[
    Path | None,
    typer.Option("--lab-dir", help="Run as a host process of this lab [default: in a pod, with the standard paths]."),
]


def _lab_node(directory: Path, node: str) -> Topology:
    topology = Topology.load(directory.resolve())
    if topology is None:
        typer.echo(f"ambit: no lab in {directory}", err=True)
        raise typer.Exit(1)
    if topology.node_named(node) is None:
        raise typer.BadParameter(f"no node {node!r} in this lab")
    return topology


@app.command(hidden=True)
def nodeagent(
    node: NodeOption,
    directory: Annotated[
        Path | None,
        typer.Option(
            "--lab-dir", help="Run as a host process of this lab [default: in a pod, with the standard paths]."
        ),
    ] = None,
    uninstall: Annotated[bool, typer.Option(help="Remove the CNI plugin on exit.")] = False,
    kubeconfig: Annotated[
        Path | None,
        typer.Option(
            "--kubeconfig", help="The API server and credentials [default: the lab's admin kubeconfig, or in-cluster]."
        ),
    ] = None,
    cni_conf_dir: Annotated[
        Path, typer.Option("--cni-conf-dir", help="In a pod: the host's CNI configuration, mounted here.")
    ] = Path("/host/etc/cni/net.d"),
    cni_bin_dir: Annotated[
        Path, typer.Option("--cni-bin-dir", help="In a pod: the host's CNI plugin directory, mounted here.")
    ] = Path("/host/opt/cni/bin"),
    run_dir: Annotated[
        Path,
        typer.Option(
            "--run-dir", envvar="CNI_AGENT_RUN_DIR", help="In a pod: the plugin's socket and kubeconfig (a hostPath)."
        ),
    ] = Path("/var/run/istio-cni"),
    host_run_dir: Annotated[
        Path | None,
        typer.Option(
            "--host-run-dir",
            help="In a pod: where the node sees --run-dir, for the plugin's configuration [default: the same path].",
        ),
    ] = None,
    host_proc: Annotated[
        Path, typer.Option("--host-proc", help="In a pod: the host's /proc, to find running pods' namespaces.")
    ] = Path("/host/proc"),
    ready_port: Annotated[
        int, typer.Option("--ready-port", help="In a pod: /healthz and /readyz over HTTP on this port (0: none).")
    ] = 8000,
    daemonset: Annotated[
        str,
        typer.Option(
            "--daemonset",
            envvar="CNI_DAEMONSET",
            help="In a pod: its DaemonSet, in the pod's namespace (POD_NAMESPACE); at a stop, the plugin is removed "
            "when it is gone or being deleted, and stays for an upgrade ('': always stays).",
        ),
    ] = "istio-cni-node",
    exclude_namespaces: Annotated[
        str,
        typer.Option(
            "--exclude-namespaces",
            envvar="EXCLUDE_NAMESPACES",
            help="Comma-separated namespaces whose pods are never enrolled (istio-cni's excludeNamespaces).",
        ),
    ] = "kube-system",
) -> None:
    """Run a node's agent: the ambit-cni plugin, ZDS and pod enrolment (a lab's host process with --lab-dir, else
    the istio-cni-node DaemonSet's container)."""
    from ambit.cni.daemon import run_node_agent
    from ambit.cni.procscan import find_pod_netns
    from ambit.cni.selection import split_namespaces
    from ambit.errors import AmbitError

    configure_logging()
    excluded = split_namespaces(exclude_namespaces)
    if directory is not None:
        topology = _lab_node(directory, node)

        def netns_for(pod: dict[str, Any]) -> str | None:
            uid = str((pod.get("metadata") or {}).get("uid", ""))
            path = Path(f"/run/netns/{topology.pod_netns(uid)}")
            return str(path) if uid and path.exists() else None

        main = run_node_agent(
            kubeconfig or topology.kubeconfig,
            node,
            cni_conf_dir=topology.cni_conf_dir(node),
            cni_bin_dir=topology.cni_bin_dir(node),
            run_dir=topology.node_dir(node) / "run",
            netns_for=netns_for,
            excluded_namespaces=excluded,
            uninstall=uninstall,
        )
    else:

        def netns_for(pod: dict[str, Any]) -> str | None:
            return find_pod_netns(host_proc, str((pod.get("metadata") or {}).get("uid", "")))

        main = run_node_agent(
            kubeconfig,
            node,
            cni_conf_dir=cni_conf_dir,
            cni_bin_dir=cni_bin_dir,
            run_dir=run_dir,
            netns_for=netns_for,
            excluded_namespaces=excluded,
            uninstall=uninstall,
            zds_socket=ZDS_DIR / ZDS_SOCKET,
            ready_address=("0.0.0.0", ready_port) if ready_port else None,
            host_run_dir=host_run_dir,
            owner=(pod_namespace, daemonset)
            if daemonset and (pod_namespace := os.environ.get("POD_NAMESPACE"))
            else None,
        )
    try:
        asyncio.run(main)
    except (AmbitError, ValueError, OSError) as exc:
        typer.echo(f"ambit nodeagent: {exc}", err=True)
        raise typer.Exit(1) from None


@app.command(hidden=True)
def nodeproxy(
    node: NodeOption,
    directory: InClusterLabDir = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config", help="Workloads and services from this YAML file [default: <lab>/mesh/workloads.yaml]."
        ),
    ] = None,
    local_ca: Annotated[
        Path | None,
        typer.Option(
            "--local-ca", help="Sign workload certificates with the CA in this directory [default: <lab>/mesh/ca]."
        ),
    ] = None,
    xds_address: Annotated[
        str | None, typer.Option("--xds-address", help="Control plane HOST:PORT for the workload API (delta xDS).")
    ] = None,
    ca_address: Annotated[
        str | None, typer.Option("--ca-address", help="Control plane HOST:PORT for workload certificates.")
    ] = None,
    root_cert: Annotated[
        Path | None, typer.Option("--root-cert", help="The mesh root (PEM) the control plane is verified with.")
    ] = None,
    token: Annotated[
        Path | None, typer.Option("--token", help="Service-account token (audience istio-ca), re-read on use.")
    ] = None,
    server_name: Annotated[
        str, typer.Option("--xds-server-name", help="The name the control plane's certificate is checked against.")
    ] = "istiod.istio-system.svc",
    cluster_id: Annotated[str, typer.Option("--cluster-id", help="This cluster's id.")] = "Kubernetes",
    trust_domain: Annotated[str, typer.Option("--trust-domain", help="The mesh's trust domain.")] = "cluster.local",
    event_loop: Annotated[
        str, typer.Option("--event-loop", help="The event loop to run on: uvloop or asyncio.")
    ] = "uvloop",
    admin_token_file: Annotated[
        Path | None,
        typer.Option(
            "--admin-token-file",
            help="Write the token the admin POSTs (/quitquitquit, /logging) need here, mode 0600 "
            "[default: <lab>/nodes/<node>/run/admin-token].",
        ),
    ] = None,
    pool_max_streams: Annotated[
        str | None,
        typer.Option(
            "--pool-max-streams",
            metavar="N",
            help="Tunnels per pooled HBONE connection (else $POOL_MAX_STREAMS_PER_CONNECTION, else 100).",
        ),
    ] = None,
    dns_upstream: Annotated[
        list[str] | None,
        typer.Option(
            "--dns-upstream",
            metavar="IP",
            help="Forward the pods' unanswered DNS queries to this resolver (repeatable) "
            "[default: each pod's own resolv.conf nameservers].",
        ),
    ] = None,
    dns_proxy: Annotated[
        bool, typer.Option("--dns-proxy/--no-dns-proxy", help="Answer DNS on 15053 in each pod.")
    ] = True,
    xds_on_demand: Annotated[
        bool,
        typer.Option(
            "--xds-on-demand/--no-xds-on-demand",
            envvar="XDS_ON_DEMAND",
            help="Ask the control plane for each address when a connection needs it instead of holding every "
            "workload (large meshes; needs --no-dns-proxy).",
        ),
    ] = False,
    flow_log_size: Annotated[
        int,
        typer.Option(
            "--flow-log-size",
            min=0,
            max=1_000_000,
            help="Connections kept for admin GET /flows (`ambit flows`); 0: no flow log.",
        ),
    ] = 4096,
    crl_path: Annotated[
        Path | None,
        typer.Option(
            "--crl-path",
            envvar="CRL_PATH",
            help="Check peers' certificate chains against this CRL bundle (PEM), watched for changes; a missing "
            "file means no checks until it appears [default: no CRL checks].",
        ),
    ] = None,
    pool_idle_timeout: Annotated[
        str | None,
        typer.Option(
            "--pool-idle-timeout",
            metavar="SECONDS",
            help="Seconds a pooled connection without tunnels is kept, 0: closed when its last tunnel ends "
            "(else $POOL_UNUSED_RELEASE_TIMEOUT, else 300).",
        ),
    ] = None,
    drain_deadline: Annotated[
        str | None,
        typer.Option(
            "--drain-deadline",
            metavar="SECONDS",
            help="On SIGTERM or /quitquitquit with no successor, seconds the connections already open may run "
            "before they are closed (else $CONNECTION_TERMINATION_DEADLINE, else $TERMINATION_GRACE_PERIOD_SECONDS "
            "less 5, else 5).",
        ),
    ] = None,
    drain_max: Annotated[
        str | None,
        typer.Option(
            "--drain-max",
            metavar="SECONDS",
            help="On SIGTERM or /quitquitquit once the node agent said a successor took over every pod, seconds "
            "the connections already open may run before they are closed (else $DRAIN_MAX, else 1h; at most "
            "$TERMINATION_GRACE_PERIOD_SECONDS less 5, at least the --drain-deadline).",
        ),
    ] = None,
    secret_ttl: Annotated[
        str | None,
        typer.Option(
            "--secret-ttl",
            metavar="DURATION",
            help="Validity asked of the CA for each workload certificate, refreshed at half life, e.g. 5m "
            "(else $SECRET_TTL, else 24h).",
        ),
    ] = None,
    tls_transport: TlsTransportOption = "socket",
    notify_fd: Annotated[
        int | None,
        typer.Option(
            "--notify-fd",
            metavar="FD",
            min=3,
            help="Write READY=1 to this inherited file descriptor once ready (a supervisor's hand-over waits for it).",
        ),
    ] = None,
    workers: Annotated[
        str | None,
        typer.Option(
            "--workers",
            metavar="N",
            help="Processes serving the node's pods, each on a core of its own: this one and N-1 workers "
            "(else $ZTUNNEL_WORKER_THREADS, else 1; at most 32).",
        ),
    ] = None,
) -> None:
    """Run a lab node's proxy: in-pod listeners for the pods the node agent hands over (ZDS), and the data path.

    Workloads come from the control plane (--xds-address) or a local file (--config); certificates from the control
    plane's CA (--ca-address) or a local CA directory (--local-ca).
    """
    # ambit's entry point runs `ambit nodeproxy` with argparse (ambit.cli.nodeproxy); this declaration is typer's
    # view of the same flags, which tests/unit/test_cli_nodeproxy.py holds to ambit.cli.nodeproxy_flags.FLAGS.
    run_argv_command(start, locals(), "ambit")


@app.command()
def controlplane(
    kubeconfig: Annotated[
        Path | None, typer.Option("--kubeconfig", help="The API server to watch [default: $KUBECONFIG or in-cluster].")
    ] = None,
    listen: Annotated[str, typer.Option("--listen", help="HOST:PORT for xDS and the CA (gRPC over TLS).")] = (
        "0.0.0.0:15012"
    ),
    san: Annotated[
        list[str] | None, typer.Option("--san", help="Extra DNS name or IP for the serving certificate (repeatable).")
    ] = None,
    plugin_cert: Annotated[Path | None, typer.Option("--plugin-cert", help="Plug-in CA certificate (PEM).")] = None,
    plugin_key: Annotated[Path | None, typer.Option("--plugin-key", help="Plug-in CA key (PEM).")] = None,
    plugin_root: Annotated[
        Path | None, typer.Option("--plugin-root", help="Root of the plug-in CA when it is an intermediate.")
    ] = None,
    trust_domain: Annotated[str, typer.Option("--trust-domain", help="The mesh's trust domain.")] = "cluster.local",
    cluster_id: Annotated[str, typer.Option("--cluster-id", help="This cluster's id.")] = "Kubernetes",
    webhook_port: Annotated[
        int, typer.Option("--webhook-port", help="Port of the validating webhook on the --listen host (0: none).")
    ] = 15017,
    monitoring_port: Annotated[
        int,
        typer.Option(
            "--monitoring-port",
            help="Port of istiod's monitoring endpoints (/metrics, /version; no credentials) on the --listen host "
            "(istiod's 15014; 0: none).",
        ),
    ] = 0,
    root_namespace: Annotated[
        str, typer.Option("--root-namespace", help="The mesh's root namespace (mesh-wide policies live there).")
    ] = "istio-system",
    enable_dry_run: Annotated[
        bool,
        typer.Option(
            "--enable-dry-run/--no-enable-dry-run",
            help="Send istio.io/dry-run AuthorizationPolicies to node proxies, which then only log "
            "(istiod's AMBIENT_ENABLE_DRY_RUN_AUTHORIZATION_POLICY; off by default).",
        ),
    ] = False,
    lab_dir: Annotated[
        Path | None, typer.Option("--lab-dir", hidden=True, help="The lab this control plane belongs to.")
    ] = None,
    webhook_service: Annotated[
        str | None,
        typer.Option(
            "--webhook-service",
            metavar="NAMESPACE/NAME",
            help="In a cluster: the Service the installed webhook configuration calls; only its caBundle is set.",
        ),
    ] = None,
    cacerts_dir: Annotated[
        Path | None,
        typer.Option(
            "--cacerts-dir", help="Istio's plug-in CA directory (the cacerts Secret), used if it holds a key."
        ),
    ] = None,
    crl_file: Annotated[
        Path | None,
        typer.Option(
            "--crl-file",
            help="The plug-in CA's CRL bundle (PEM), published as ConfigMap istio-ca-crl in every namespace "
            "[default: ca-crl.pem next to the plug-in CA's files].",
        ),
    ] = None,
    enable_ca_crl: Annotated[
        str,
        typer.Option(
            "--enable-ca-crl",
            envvar="PILOT_ENABLE_CA_CRL",
            metavar="true|false",
            help="Publish the plug-in CA's CRL (istiod's PILOT_ENABLE_CA_CRL).",
        ),
    ] = "true",
    crl_config_map: Annotated[
        str,
        typer.Option("--crl-configmap", envvar="PILOT_CRL_CONFIGMAP", help="The ConfigMap the CRL is published as."),
    ] = "istio-ca-crl",
    http10: Annotated[
        str,
        typer.Option(
            "--http10",
            envvar="PILOT_HTTP10",
            metavar="true|false",
            help="Waypoints and gateways serve HTTP/1.0 instead of answering it 426 (istiod's PILOT_HTTP10; set "
            "in the Deployments this control plane renders).",
        ),
    ] = "false",
    max_requests_per_second: Annotated[
        float,
        typer.Option(
            "--max-requests-per-second",
            envvar="PILOT_MAX_REQUESTS_PER_SECOND",
            min=0.0,
            help="New xDS streams admitted a second; beyond that a stream waits up to 1 s, then is refused with a "
            "retry hint (istiod's PILOT_MAX_REQUESTS_PER_SECOND; 0: 15 + 5 per CPU, at most 100).",
        ),
    ] = 0.0,
    max_xds_clients: Annotated[
        int,
        typer.Option(
            "--max-xds-clients",
            min=1,
            help="xDS streams held at most; a stream beyond it is refused at once with a retry hint.",
        ),
    ] = 20_000,
    untaint_nodes: Annotated[
        bool,
        typer.Option(
            "--untaint-nodes",
            help="Remove the cni.istio.io/not-ready taint from nodes whose node agent is ready (istiod's "
            "PILOT_ENABLE_NODE_UNTAINT_CONTROLLERS; needs patch on nodes).",
        ),
    ] = False,
    deploy_waypoints: Annotated[
        bool,
        typer.Option(
            "--deploy-waypoints/--no-deploy-waypoints",
            help="Deploy a Deployment, Service and ServiceAccount for each Gateway of class istio-waypoint.",
        ),
    ] = True,
    waypoint_xds_address: Annotated[
        str | None,
        typer.Option(
            "--waypoint-xds-address",
            envvar="WAYPOINT_XDS_ADDRESS",
            metavar="HOST:PORT",
            help="Where waypoint pods reach xDS and the CA "
            "[default: istiod.<$POD_NAMESPACE or istio-system>.svc:15012].",
        ),
    ] = None,
    waypoint_image: Annotated[
        str, typer.Option("--waypoint-image", envvar="WAYPOINT_IMAGE", help="The waypoint pods' image.")
    ] = "ambit",
    waypoint_image_pull_policy: Annotated[
        str | None,
        typer.Option(
            "--waypoint-image-pull-policy",
            envvar="WAYPOINT_IMAGE_PULL_POLICY",
            help="Always, IfNotPresent or Never [default (or empty): the cluster's].",
        ),
    ] = None,
    revision: Annotated[
        str,
        typer.Option(
            "--revision",
            envvar="REVISION",
            help="This control plane's revision: Gateways labelled (or in a namespace labelled) istio.io/rev with "
            "another are left to theirs.",
        ),
    ] = "default",
    kubernetes_api_qps: Annotated[
        float,
        typer.Option(
            "--kubernetes-api-qps",
            "--kubernetesApiQPS",
            help="Requests per second to the API server at most, on average (istiod's flag).",
        ),
    ] = 80.0,
    kubernetes_api_burst: Annotated[
        int,
        typer.Option(
            "--kubernetes-api-burst",
            "--kubernetesApiBurst",
            help="Requests to the API server at once after being idle (istiod's flag).",
        ),
    ] = 160,
) -> None:
    """Run the control plane: the workload API over delta xDS and the mesh CA, on one TLS gRPC port."""
    from ambit.controlplane.process import ControlPlaneSettings, run_control_plane

    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise typer.BadParameter(f"expected HOST:PORT, got {listen!r}", param_hint="--listen")
    if (plugin_cert is None) != (plugin_key is None):
        raise typer.BadParameter("--plugin-cert and --plugin-key go together")
    if not 0 <= monitoring_port <= 65535:
        raise typer.BadParameter(f"expected a port (0 for none), got {monitoring_port}", param_hint="--monitoring-port")
    if webhook_service is not None and not re.fullmatch(r"[a-z0-9-]{1,63}/[a-z0-9-]{1,63}", webhook_service):
        raise typer.BadParameter(f"expected NAMESPACE/NAME, got {webhook_service!r}", param_hint="--webhook-service")
    waypoint_image_pull_policy = waypoint_image_pull_policy or None
    if waypoint_image_pull_policy not in (None, "Always", "IfNotPresent", "Never"):
        raise typer.BadParameter(
            f"expected Always, IfNotPresent or Never, got {waypoint_image_pull_policy!r}",
            param_hint="--waypoint-image-pull-policy",
        )
    if not waypoint_xds_address:
        waypoint_xds_address = f"istiod.{os.environ.get('POD_NAMESPACE') or 'istio-system'}.svc:15012"
    xds_host, xds_sep, xds_port = waypoint_xds_address.rpartition(":")
    if not xds_sep or not xds_host or not xds_port.isdigit() or not 0 < int(xds_port) <= 65535:
        raise typer.BadParameter(
            f"expected HOST:PORT, got {waypoint_xds_address!r}", param_hint="--waypoint-xds-address"
        )
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", revision):
        raise typer.BadParameter(f"expected a DNS-1123 label, got {revision!r}", param_hint="--revision")
    if not 0 < kubernetes_api_qps <= 1e6 or not 0 < kubernetes_api_burst <= 1_000_000:
        raise typer.BadParameter(
            f"expected a positive rate and burst, got {kubernetes_api_qps} and {kubernetes_api_burst}",
            param_hint="--kubernetes-api-qps/--kubernetes-api-burst",
        )
    crl_enabled = _env_bool(enable_ca_crl, "--enable-ca-crl (PILOT_ENABLE_CA_CRL)")
    accept_http10 = _env_bool(http10, "--http10 (PILOT_HTTP10)")
    if not re.fullmatch(r"[a-z0-9]([-.a-z0-9]{0,251}[a-z0-9])?", crl_config_map):
        raise typer.BadParameter(f"expected a ConfigMap name, got {crl_config_map!r}", param_hint="--crl-configmap")
    settings = ControlPlaneSettings(
        kubeconfig=kubeconfig,
        host=host.strip("[]") or "0.0.0.0",
        port=int(port),
        sans=tuple(san or ()),
        trust_domain=trust_domain,
        cluster_id=cluster_id,
        plugin_cert=plugin_cert,
        plugin_key=plugin_key,
        plugin_root=plugin_root,
        webhook_port=webhook_port or None,
        monitoring_port=monitoring_port or None,
        root_namespace=root_namespace,
        enable_dry_run=enable_dry_run,
        webhook_service=webhook_service,
        cacerts_dir=cacerts_dir,
        untaint_nodes=untaint_nodes,
        xds_rate=max_requests_per_second or None,
        xds_max_streams=max_xds_clients,
        deploy_waypoints=deploy_waypoints,
        waypoint_xds_address=waypoint_xds_address,
        waypoint_image=waypoint_image,
        waypoint_image_pull_policy=waypoint_image_pull_policy,
        revision=revision,
        enable_ca_crl=crl_enabled,
        http10=accept_http10,
        crl_file=crl_file,
        crl_config_map=crl_config_map,
        kubernetes_api_qps=kubernetes_api_qps,
        kubernetes_api_burst=kubernetes_api_burst,
    )
    configure_logging()
    asyncio.run(run_control_plane(settings))


def _env_bool(value: str, what: str) -> bool:
    """A boolean as Go's strconv.ParseBool reads Istio's feature flags."""
    lowered = value.strip().lower()
    if lowered in ("1", "t", "true"):
        return True
    if lowered in ("0", "f", "false"):
        return False
    raise typer.BadParameter(f"expected true or false, got {value!r}", param_hint=what)

"""``ambit gateway``: the process an ingress gateway Deployment's pods run (Istio's ``pilot-agent proxy router``
for a Gateway of class ``istio``).

Who the gateway is comes from the pod's environment, as Istio's gateway pods get it (POD_NAME, POD_NAMESPACE,
INSTANCE_IP, SERVICE_ACCOUNT, NODE_NAME, GATEWAY_NAME: the Gateway's own name); its listeners, routes and
certificates from the control plane (--xds-address, --ca-address with --root-cert and --token), or, for tests,
workloads from a local file and a local CA (the listeners then come only from the API of :mod:`ambit.waypoint.ingress`).

This is typer's declaration of the command, for ``ambit --help``: ``ambit``'s entry point runs ``ambit gateway ...``
with argparse (:func:`ambit.cli.l7_proxy.gateway_main`, its flags :data:`~ambit.cli.l7_proxy_flags.GATEWAY_FLAGS`),
without typer, click or rich in the gateway's memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ambit.cli.app import TlsTransportOption, app, run_argv_command
from ambit.cli.l7_proxy import start_gateway
from ambit.cli.l7_proxy_flags import GATEWAY_PROG


@app.command("gateway")
def gateway(
    namespace: Annotated[str, typer.Option("--namespace", envvar="POD_NAMESPACE", help="The Gateway's namespace.")],
    gateway_name: Annotated[str, typer.Option("--gateway-name", envvar="GATEWAY_NAME", help="The Gateway's name.")],
    service_account: Annotated[
        str, typer.Option("--service-account", envvar="SERVICE_ACCOUNT", help="The pod's service account.")
    ] = "default",
    pod_name: Annotated[str, typer.Option("--pod-name", envvar="POD_NAME", help="The pod's name.")] = "",
    instance_ip: Annotated[
        str | None, typer.Option("--instance-ip", envvar="INSTANCE_IP", help="The pod's IP (listeners bind there).")
    ] = None,
    node_name: Annotated[str, typer.Option("--node-name", envvar="NODE_NAME", help="The node's name.")] = "",
    xds_address: Annotated[
        str | None, typer.Option("--xds-address", help="Control plane HOST:PORT for the workload API (delta xDS).")
    ] = None,
    ca_address: Annotated[
        str | None, typer.Option("--ca-address", help="Control plane HOST:PORT for the gateway's certificate.")
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
    config: Annotated[
        Path | None, typer.Option("--config", help="Workloads and services from this YAML file instead of xDS.")
    ] = None,
    local_ca: Annotated[
        Path | None, typer.Option("--local-ca", help="Sign the gateway's certificate with the CA in this directory.")
    ] = None,
    tls_transport: TlsTransportOption = "socket",
    admin_port: Annotated[int, typer.Option("--admin-port", help="Admin port (127.0.0.1).")] = 15000,
    stats_port: Annotated[int, typer.Option("--stats-port", help="Prometheus metrics port.")] = 15020,
    readiness_port: Annotated[int, typer.Option("--readiness-port", help="Readiness port.")] = 15021,
    admin_token_file: Annotated[
        Path | None, typer.Option("--admin-token-file", help="Write the admin POSTs' token here (mode 0600).")
    ] = None,
    log_json: Annotated[bool, typer.Option("--log-json", help="Access log lines as JSON.")] = False,
) -> None:
    """Run an ingress gateway: its Gateway's HTTP and HTTPS listeners, routed by HTTPRoutes to mesh Services over
    HBONE; metrics on 15020, readiness on 15021."""
    # ambit's entry point runs this command with argparse (ambit.cli.l7_proxy); this declaration is typer's view of
    # the same flags (`ambit --help` lists it), which tests/unit/test_cli_l7_proxy.py holds to its flag table.
    run_argv_command(start_gateway, locals(), GATEWAY_PROG)

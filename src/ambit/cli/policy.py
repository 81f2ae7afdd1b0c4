"""``ambit policy explain``: why a connection would be allowed or denied by L4 policy, from the cluster's objects.

It lists the objects the control plane translates (through :mod:`ambit.k8s`, against the embedded API server or a
real cluster), translates them as the control plane does and asks the node proxy's own engine
(:mod:`ambit.controlplane.explain`), so its verdict is the proxy's.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from ambit.cli.app import app

if TYPE_CHECKING:
    from ambit.model.localconfig import LocalConfig

policy_app = typer.Typer(help="L4 authorization policy: explain what the node proxies decide.", no_args_is_help=True)
app.add_typer(policy_app, name="policy")


async def _fetch(kubeconfig: Path | None) -> dict[str, list[dict[str, Any]]]:
    from ambit.k8s import KubeClient, KubeForbiddenError, KubeNotFoundError, kinds

    required = (kinds.PODS, kinds.SERVICES, kinds.ENDPOINT_SLICES, kinds.NAMESPACES)
    optional = (kinds.SERVICE_ENTRIES, kinds.WORKLOAD_ENTRIES, kinds.AUTHORIZATION_POLICIES, kinds.PEER_AUTHENTICATIONS)
    client = KubeClient.from_kubeconfig(kubeconfig) if kubeconfig else KubeClient.from_env()
    objects: dict[str, list[dict[str, Any]]] = {}
    async with client:
        for kind in required:
            objects[kind.plural], _ = await client.list(kind)
        for kind in optional:
            try:
                objects[kind.plural], _ = await client.list(kind)
            except (KubeNotFoundError, KubeForbiddenError):
                objects[kind.plural] = []
    return objects


def load_config(
    kubeconfig: Path | None,
    *,
    root_namespace: str = "istio-system",
    trust_domain: str = "cluster.local",
    domain: str = "cluster.local",
    enable_dry_run: bool = True,
) -> LocalConfig:
    """What the control plane would send the node proxies now, translated from the cluster's objects (raises
    ``KubeClientError`` when the API server cannot be read)."""
    from ambit.controlplane.translate import translate_all

    objects = asyncio.run(_fetch(kubeconfig))
    translation = translate_all(
        objects["pods"],
        objects["services"],
        objects["endpointslices"],
        objects["namespaces"],
        service_entries=objects["serviceentries"],
        workload_entries=objects["workloadentries"],
        authorization_policies=objects["authorizationpolicies"],
        peer_authentications=objects["peerauthentications"],
        trust_domain=trust_domain,
        domain=domain,
        root_namespace=root_namespace,
        enable_dry_run=enable_dry_run,
    )
    return translation.config


@policy_app.command("explain")
def explain_command(
    source: Annotated[str, typer.Option("--from", help="The client pod: NAMESPACE/POD.")],
    destination: Annotated[str, typer.Option("--to", help="The server: NAMESPACE/POD or NAMESPACE/SERVICE.")],
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Destination (service or pod) port.")],
    output: Annotated[str, typer.Option("--output", "-o", help="table or json.")] = "table",
    kubeconfig: Annotated[Path | None, typer.Option(help="Kubeconfig (default: $KUBECONFIG, ~/.kube/config).")] = None,
    root_namespace: Annotated[str, typer.Option(help="The mesh's root namespace.")] = "istio-system",
    trust_domain: Annotated[str, typer.Option(help="The mesh's trust domain.")] = "cluster.local",
    domain: Annotated[str, typer.Option(help="The cluster's DNS domain.")] = "cluster.local",
    enable_dry_run: Annotated[
        bool,
        typer.Option(help="Report dry-run policies (the control plane sends them with its --enable-dry-run)."),
    ] = True,
) -> None:
    """Explain the verdict of the destination's node proxy for a connection, policy by policy."""
    from ambit.controlplane.explain import ExplainError, explain
    from ambit.k8s import KubeClientError

    if output not in ("table", "json"):
        raise typer.BadParameter("expected table or json", param_hint="--output")
    try:
        config = load_config(
            kubeconfig,
            root_namespace=root_namespace,
            trust_domain=trust_domain,
            domain=domain,
            enable_dry_run=enable_dry_run,
        )
    except KubeClientError as exc:
        typer.echo(f"ambit policy explain: {exc}", err=True)
        raise typer.Exit(1) from None
    try:
        result = explain(config, source, destination, port, domain=domain)
    except ExplainError as exc:
        typer.echo(f"ambit policy explain: {exc}", err=True)
        raise typer.Exit(2) from None
    if output == "json":
        typer.echo(json.dumps(result.to_json(), indent=2))
        return
    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(
        f"from {result.source} ({result.source_identity or 'no identity: plaintext'}) to {destination}:{port}"
    )
    for verdict in result.verdicts:
        table = Table(
            title=f"{verdict.destination} {verdict.address}:{verdict.port}",
            title_justify="left",
            box=None,
            header_style="bold",
        )
        for column in ("POLICY", "ACTION", "DRY-RUN", "MATCHED", "WHY NOT"):
            table.add_column(column)
        for report in verdict.policies:
            table.add_row(
                report.key,
                report.action,
                "yes" if report.dry_run else "",
                "-" if report.matched_rule is None else f"rule {report.matched_rule}",
                "; ".join(report.why_not),
            )
        console.print(table)
        if verdict.note:
            console.print(f"  note: {verdict.note}")
        if verdict.missing:
            console.print(f"  unknown policies listed by the workload: {', '.join(verdict.missing)}")
        if verdict.dry_run:
            console.print(f"  dry run: would be denied: {verdict.dry_run}")
        console.print(
            f"  verdict: {'ALLOW' if verdict.allowed else 'DENY'}{': ' + verdict.reason if verdict.reason else ''}"
        )
    console.print(f"verdict: {'ALLOW' if result.allowed else 'DENY'}")

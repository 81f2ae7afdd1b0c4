"""``ambit get``: the mesh's view of cluster objects, read through :mod:`ambit.k8s` (the same client every
component uses), against the embedded API server or a real cluster."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from ambit.cli.app import app
from ambit.k8s import kinds
from ambit.k8s.kinds import ResourceKind

Row = Callable[[Mapping[str, Any]], list[str]]

_DATAPLANE_LABEL = "istio.io/dataplane-mode"
_REDIRECTION = "ambient.istio.io/redirection"


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def _namespace_row(obj: Mapping[str, Any]) -> list[str]:
    return [(obj.get("status") or {}).get("phase", ""), _labels(obj).get(_DATAPLANE_LABEL, "")]


def _pod_row(obj: Mapping[str, Any]) -> list[str]:
    status = obj.get("status") or {}
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    mode = _labels(obj).get(_DATAPLANE_LABEL, "")
    return [
        status.get("phase", ""),
        status.get("podIP", ""),
        (obj.get("spec") or {}).get("nodeName", ""),
        annotations.get(_REDIRECTION, mode),
    ]


def _service_row(obj: Mapping[str, Any]) -> list[str]:
    spec = obj.get("spec") or {}
    ports = ",".join(f"{p.get('port')}/{p.get('protocol', 'TCP')}" for p in spec.get("ports") or [])
    return [spec.get("clusterIP", ""), ports]


def _policy_row(obj: Mapping[str, Any]) -> list[str]:
    spec = obj.get("spec") or {}
    return [spec.get("action", "ALLOW"), str(len(spec.get("rules") or []))]


def _peer_authentication_row(obj: Mapping[str, Any]) -> list[str]:
    return [((obj.get("spec") or {}).get("mtls") or {}).get("mode", "")]


# What `ambit get` can show: accepted names → (kind, extra column titles, extra cells).
_VIEWS: list[tuple[tuple[str, ...], ResourceKind, tuple[str, ...], Row | None]] = [
    (("namespaces", "namespace", "ns"), kinds.NAMESPACES, ("STATUS", "DATAPLANE"), _namespace_row),
    (("pods", "pod", "po"), kinds.PODS, ("PHASE", "IP", "NODE", "AMBIENT"), _pod_row),
    (("services", "service", "svc"), kinds.SERVICES, ("CLUSTER-IP", "PORTS"), _service_row),
    (("serviceaccounts", "serviceaccount", "sa"), kinds.SERVICE_ACCOUNTS, (), None),
    (("nodes", "node", "no"), kinds.NODES, (), None),
    (("deployments", "deployment", "deploy"), kinds.DEPLOYMENTS, (), None),
    (("configmaps", "configmap", "cm"), kinds.CONFIG_MAPS, (), None),
    (
        ("authorizationpolicies", "authorizationpolicy", "ap"),
        kinds.AUTHORIZATION_POLICIES,
        ("ACTION", "RULES"),
        _policy_row,
    ),
    (
        ("peerauthentications", "peerauthentication", "pa"),
        kinds.PEER_AUTHENTICATIONS,
        ("MODE",),
        _peer_authentication_row,
    ),
    (("serviceentries", "serviceentry", "se"), kinds.SERVICE_ENTRIES, (), None),
]


def _view(name: str) -> tuple[ResourceKind, tuple[str, ...], Row | None]:
    for names, kind, titles, row in _VIEWS:
        if name.lower() in names:
            return kind, titles, row
    known = ", ".join(names[0] for names, *_ in _VIEWS)
    raise typer.BadParameter(f"unknown resource {name!r}; known: {known}", param_hint="RESOURCE")


def _age(created: str, now: float) -> str:
    try:
        then = time.mktime(time.strptime(created, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
    except (TypeError, ValueError):
        return "?"
    seconds = max(0, int(now - then))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


@app.command()
def get(
    resource: Annotated[str, typer.Argument(help="What to list: namespaces, pods, services, authorizationpolicies…")],
    namespace: Annotated[str | None, typer.Option("--namespace", "-n", help="Namespace (default: all).")] = None,
    selector: Annotated[str | None, typer.Option("--selector", "-l", help="Label selector.")] = None,
    kubeconfig: Annotated[Path | None, typer.Option(help="Kubeconfig (default: $KUBECONFIG, ~/.kube/config).")] = None,
) -> None:
    """List objects as the mesh sees them (dataplane mode, redirection, policy actions)."""
    from ambit.k8s import KubeClient, KubeClientError

    kind, titles, row = _view(resource)

    async def fetch() -> list[dict[str, Any]]:
        client = KubeClient.from_kubeconfig(kubeconfig) if kubeconfig else KubeClient.from_env()
        async with client:
            items, _ = await client.list(kind, namespace if kind.namespaced else None, label_selector=selector)
            return items

    try:
        items = asyncio.run(fetch())
    except KubeClientError as exc:
        typer.echo(f"ambit get: {exc}", err=True)
        raise typer.Exit(1) from None
    table = Table(title=f"{kind.plural} ({len(items)})", title_justify="left", box=None, header_style="bold")
    if kind.namespaced:
        table.add_column("NAMESPACE")
    table.add_column("NAME")
    for title in titles:
        table.add_column(title)
    table.add_column("AGE")
    now = time.time()
    for obj in items:
        meta = obj.get("metadata") or {}
        cells = [meta.get("namespace", "")] if kind.namespaced else []
        cells.append(meta.get("name", ""))
        if row is not None:
            cells.extend(row(obj))
        cells.append(_age(meta.get("creationTimestamp", ""), now))
        table.add_row(*cells)
    Console(width=None if sys.stdout.isatty() else 160).print(table)

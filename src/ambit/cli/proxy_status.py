"""``ambit proxy-status``: is every node proxy, waypoint and gateway in sync with the control plane?

Theory of operation (istioctl proxy-status's): with the operator's kubeconfig, mint a short-lived token (TokenRequest,
audience ``istio-ca``, 10 minutes) for the control plane's debug account (``istio-system/istiod`` by default; see
:mod:`ambit.controlplane.debug_access` for who may read), read the mesh root from the ``istio-ca-root-cert``
ConfigMap, find the control plane pods (``app=istiod``), and ask each one for its sync document over its xDS port
(:mod:`ambit.xds.sync_client`). The documents are printed as one table (:mod:`ambit.cli.sync_status`) or as JSON.
``--xds-address``, ``--root-cert`` and ``--token-file`` replace the lookups (a port-forward, or no kubeconfig at all).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from ambit.cli.app import app
from ambit.cli.sync_status import SyncDocumentError, parse_document, status_table

TOKEN_SECONDS = 600
ROOT_CONFIG_MAP = "istio-ca-root-cert"
XDS_PORT = 15012


class _Failed(Exception):
    """One line for the user."""


async def _collect(
    *,
    kubeconfig: Path | None,
    addresses: list[str],
    root_cert: Path | None,
    token_file: Path | None,
    service_account: str,
    namespace: str,
    server_name: str,
    cluster_id: str,
    xds_port: int,
) -> tuple[list[dict[str, Any]], list[str]]:
    """The documents of every control plane that answered, and one line per one that did not."""
    from ambit.xds.sync_client import SyncReadError, fetch_sync_document

    token = _read(token_file, "token").decode().strip() if token_file else ""
    root = _read(root_cert, "root certificate") if root_cert else b""
    targets = [(a, a) for a in addresses]
    if not (token and root and targets):
        token, root, targets = await _from_cluster(
            kubeconfig, token, root, targets, service_account, namespace, xds_port
        )
    documents, failures = [], []
    for label, address in targets:
        try:
            document = await fetch_sync_document(
                address, root_pem=root, token=token, server_name=server_name, cluster_id=cluster_id
            )
        except SyncReadError as exc:
            failures.append(str(exc))
            continue
        document["controlPlane"] = document.get("controlPlane") or label
        documents.append(document)
    return documents, failures


async def _from_cluster(
    kubeconfig: Path | None,
    token: str,
    root: bytes,
    targets: list[tuple[str, str]],
    service_account: str,
    namespace: str,
    xds_port: int,
) -> tuple[str, bytes, list[tuple[str, str]]]:
    from ambit.k8s import KubeClient, KubeClientError, kinds

    sa_namespace, slash, sa_name = service_account.partition("/")
    if not slash or not sa_namespace or not sa_name:
        raise _Failed(f"--service-account {service_account!r} is not <namespace>/<name>")
    try:
        client = KubeClient.from_kubeconfig(kubeconfig) if kubeconfig else KubeClient.from_env()
    except Exception as exc:  # a missing or malformed kubeconfig
        raise _Failed(f"cannot load the kubeconfig: {exc}") from None
    async with client:
        try:
            if not token:
                issued = await client.create_token(sa_namespace, sa_name, ["istio-ca"], TOKEN_SECONDS)
                token = str((issued.get("status") or {}).get("token") or "")
                if not token:
                    raise _Failed(f"the API server issued no token for {service_account}")
            if not root:
                config_map = await client.get(kinds.CONFIG_MAPS, ROOT_CONFIG_MAP, namespace)
                root = str((config_map.get("data") or {}).get("root-cert.pem") or "").encode()
                if not root:
                    raise _Failed(f"ConfigMap {namespace}/{ROOT_CONFIG_MAP} has no root-cert.pem")
            if not targets:
                pods, _ = await client.list(kinds.PODS, namespace, label_selector="app=istiod")
                for pod in pods:
                    status, meta = pod.get("status") or {}, pod.get("metadata") or {}
                    if status.get("phase") == "Running" and status.get("podIP"):
                        targets.append((str(meta.get("name", "")), _host_port(str(status["podIP"]), xds_port)))
                if not targets:
                    raise _Failed(f"no running control plane pod (app=istiod) in {namespace}; give --xds-address")
        except KubeClientError as exc:
            raise _Failed(str(exc)) from None
    return token, root, targets


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise _Failed(f"cannot read the {what} file {path}: {exc.strerror}") from None


@app.command("proxy-status")
def proxy_status(
    kubeconfig: Annotated[Path | None, typer.Option(help="Kubeconfig (default: $KUBECONFIG, ~/.kube/config).")] = None,
    output: Annotated[str, typer.Option("--output", "-o", help="table or json.")] = "table",
    xds_address: Annotated[
        list[str] | None, typer.Option("--xds-address", help="Control plane HOST:PORT (repeatable; default: its pods).")
    ] = None,
    root_cert: Annotated[Path | None, typer.Option(help="Mesh root certificate (default: istio-ca-root-cert).")] = None,
    token_file: Annotated[Path | None, typer.Option(help="Bearer token to present (default: mint one).")] = None,
    service_account: Annotated[
        str, typer.Option(help="NAMESPACE/NAME to mint the token for (it must be allowed to read the sync status).")
    ] = "istio-system/istiod",
    istio_namespace: Annotated[str, typer.Option(help="The control plane's namespace.")] = "istio-system",
    server_name: Annotated[str, typer.Option(help="The name the control plane's certificate has.")] = (
        "istiod.istio-system.svc"
    ),
    cluster_id: Annotated[str, typer.Option(help="The cluster id to present.")] = "Kubernetes",
    xds_port: Annotated[int, typer.Option(help="The control plane pods' xDS port (without --xds-address).")] = XDS_PORT,
) -> None:
    """Every proxy connected to the control plane: SYNCED, NOT SENT, PENDING, STALE or ERROR per type."""
    if output not in ("table", "json"):
        raise typer.BadParameter("expected table or json", param_hint="--output")
    try:
        documents, failures = asyncio.run(
            _collect(
                kubeconfig=kubeconfig,
                addresses=list(xds_address or ()),
                root_cert=root_cert,
                token_file=token_file,
                service_account=service_account,
                namespace=istio_namespace,
                server_name=server_name,
                cluster_id=cluster_id,
                xds_port=xds_port,
            )
        )
        proxies = [p for document in documents for p in parse_document(document)]
    except (_Failed, SyncDocumentError) as exc:
        typer.echo(f"ambit proxy-status: {exc}", err=True)
        raise typer.Exit(1) from None
    for failure in failures:
        typer.echo(f"ambit proxy-status: {failure}", err=True)
    if output == "json":
        typer.echo(json.dumps(documents, indent=2, sort_keys=True))
    else:
        headers, rows = status_table(proxies)
        table = Table(box=None, header_style="bold", pad_edge=False)
        for header in headers:
            table.add_column(header, no_wrap=True)
        for row in rows:
            table.add_row(*row)
        Console(width=None if sys.stdout.isatty() else 200).print(table)
    if failures:
        raise typer.Exit(1)

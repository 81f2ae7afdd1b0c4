"""``ambit install``, ``ambit uninstall`` and ``ambit version``: istioctl's role, with the manifests of ``deploy/``.

Theory of operation. The manifests come from ``kubectl kustomize <dir>`` (kubectl's built-in kustomize; nothing
else to install) or from a file of rendered YAML (``-f``); :mod:`ambit.k8s.manifests` turns them into an ordered
plan and :mod:`ambit.k8s.install` carries it out against the current kubeconfig (create-or-replace in dependency
order, readiness waits with a line per change, a summary; uninstall in reverse, CRDs kept unless ``--purge``).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated

import typer

import ambit
from ambit.cli.app import app
from ambit.k8s import KubeClient, KubeClientError
from ambit.k8s.install import control_plane_version, render, run_install, run_uninstall
from ambit.k8s.manifests import InstallError, Manifest, ManifestError, parse_manifests

DEFAULT_KUSTOMIZATION = Path(__file__).resolve().parents[3] / "deploy" / "base"
"""``deploy/base`` of the checkout ambit runs from (an installed wheel has none: pass ``--kustomize`` or ``-f``)."""

KubeconfigOption = Annotated[
    Path | None, typer.Option("--kubeconfig", help="Kubeconfig (default: $KUBECONFIG, ~/.kube/config, in-cluster).")
]
KustomizeOption = Annotated[
    Path | None,
    typer.Option(
        "--kustomize",
        "-k",
        help="Kustomization directory, rendered with `kubectl kustomize` (kubectl must be on PATH) "
        "(default: deploy/base of this checkout).",
    ),
]
FileOption = Annotated[
    Path | None,
    typer.Option("--filename", "-f", help="Rendered manifests (YAML) instead of a kustomization; - reads stdin."),
]
TimeoutOption = Annotated[float, typer.Option("--timeout", help="Seconds to wait for readiness (or removal).")]


def read_manifests(kustomize: Path | None, filename: Path | None) -> str:
    if kustomize is not None and filename is not None:
        raise ManifestError("--kustomize and --filename are exclusive")
    if filename is not None:
        if str(filename) == "-":
            return sys.stdin.read()
        try:
            return filename.read_text()
        except OSError as exc:
            raise ManifestError(f"{filename}: {exc.strerror}") from None
    return render(kustomize or DEFAULT_KUSTOMIZATION)


def _client(kubeconfig: Path | None) -> KubeClient:
    return KubeClient.from_kubeconfig(kubeconfig) if kubeconfig else KubeClient.from_env()


def _run(work: Callable[[KubeClient], Awaitable[None]], kubeconfig: Path | None) -> None:
    async def main() -> None:
        async with _client(kubeconfig) as client:
            await work(client)

    try:
        asyncio.run(main())
    except (ManifestError, InstallError, KubeClientError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


def _plan(kustomize: Path | None, filename: Path | None) -> tuple[str, list[Manifest]]:
    try:
        text = read_manifests(kustomize, filename)
        return text, parse_manifests(text)
    except ManifestError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


@app.command()
def install(
    kustomize: KustomizeOption = None,
    filename: FileOption = None,
    kubeconfig: KubeconfigOption = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the manifests; change nothing.")] = False,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Wait for the workloads to be ready.")] = True,
    timeout: TimeoutOption = 300.0,
) -> None:
    """Install the mesh on the current cluster from deploy/ (istioctl install's role).

    The kustomization is rendered with `kubectl kustomize`, then each object is created or replaced in dependency
    order with Ambit's own client, and the control plane and node DaemonSets are waited for.
    """
    text, plan = _plan(kustomize, filename)
    if dry_run:
        sys.stdout.write(text)
        return
    _run(lambda client: run_install(client, plan, timeout, wait, typer.echo), kubeconfig)


@app.command()
def uninstall(
    kustomize: KustomizeOption = None,
    filename: FileOption = None,
    kubeconfig: KubeconfigOption = None,
    purge: Annotated[bool, typer.Option("--purge", help="Also delete the CRDs, and with them every policy.")] = False,
    timeout: TimeoutOption = 300.0,
) -> None:
    """Remove what `ambit install` created, in reverse order, and wait until it is gone (CRDs stay unless --purge)."""
    _, plan = _plan(kustomize, filename)
    _run(lambda client: run_uninstall(client, plan, timeout, purge, typer.echo), kubeconfig)


@app.command()
def version(
    kubeconfig: KubeconfigOption = None,
    short: Annotated[bool, typer.Option("--short", help="The client version only; no cluster is asked.")] = False,
) -> None:
    """Print the client's version, the Istio release whose APIs Ambit implements (what its proxies state to
    EnvoyFilter ``proxyVersion`` matches), whether the native accelerator loads (``ambit.native``) and the control
    plane's version (the istiod Deployment's image tag)."""
    typer.echo(f"client version: {ambit.__version__}")
    typer.echo(f"istio api version: {ambit.ISTIO_VERSION}")
    from ambit.native import load_tls_records

    module, reason = load_tls_records()
    typer.echo(f"native accelerator: {'loads' if module is not None else 'not used'} ({reason})")
    if short:
        return

    async def remote(client: KubeClient) -> None:
        typer.echo(f"control plane version: {await control_plane_version(client)}")

    _run(remote, kubeconfig)

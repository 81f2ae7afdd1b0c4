"""``ambit lab up`` installs cluster DNS from ``deploy/lab-dns`` as a cluster add-on: rendered with kustomize, applied
in dependency order, and waited for until the kube-dns Deployment is available, so that pods started after
``lab up`` returns resolve names from their first query."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ambit.k8s import KubeClient
from ambit.k8s.install import render, run_install
from ambit.k8s.manifests import parse_manifests

LAB_DNS = Path(__file__).resolve().parents[4] / "deploy" / "lab-dns"
INSTALL_SECONDS = 120.0


async def install_cluster_dns(
    client: KubeClient, echo: Callable[[str], None], seconds: float = INSTALL_SECONDS, directory: Path = LAB_DNS
) -> None:
    await run_install(client, parse_manifests(render(directory)), seconds, True, echo)

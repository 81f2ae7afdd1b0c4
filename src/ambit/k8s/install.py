"""Applying the install manifests with the mesh's own client: ``ambit install``'s work, and the lab's when it
installs the mesh from ``deploy/``.

Theory of operation. :func:`render` runs ``kubectl kustomize`` (kubectl's built-in kustomize; nothing else to
install); :mod:`ambit.k8s.manifests` turns the YAML into an ordered plan. :func:`run_install` creates each object,
or, when it exists, replaces it (the embedded API server has no server-side apply, so this is create-or-replace for
every server). After the CRDs it waits for them to be Established, since the objects that follow may be custom
resources; at the end it waits for the workloads to be ready, reporting a line each time an object's state changes,
then a summary. :func:`run_uninstall` deletes in the reverse order and waits until each object is gone; CRDs (and so
every policy users wrote) stay unless ``purge``. Before touching anything both check that the server serves every
kind in the plan, so that a server without, say, PodDisruptionBudgets fails cleanly rather than half-way.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ambit.k8s import kinds
from ambit.k8s.client import KubeClient
from ambit.k8s.errors import KubeApiStatusError
from ambit.k8s.manifests import (
    InstallError,
    Manifest,
    ManifestError,
    apply_order,
    delete_order,
    needs_wait,
    readiness,
    replacement,
    summary,
)

POLL_SECONDS = 1.0

Echo = Callable[[str], None]


def render(directory: Path) -> str:
    """``kubectl kustomize directory``. Raises :class:`ManifestError`."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise ManifestError("kubectl is not on PATH: it renders the kustomization (or pass -f with rendered YAML)")
    if not directory.is_dir():
        raise ManifestError(f"{directory}: not a kustomization directory")
    done = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ManifestError(f"kubectl kustomize {directory} failed: {done.stderr.strip()}")
    return done.stdout


async def check_served(client: KubeClient, plan: Sequence[Manifest]) -> None:
    missing = [str(kind) for kind in dict.fromkeys(m.kind for m in plan) if not await client.serves(kind)]
    if missing:
        raise InstallError(f"the API server does not serve {', '.join(missing)}: nothing was changed")


async def apply_one(client: KubeClient, m: Manifest) -> str:
    """Create ``m``, or replace it if it exists; returns ``created``, ``configured`` or ``unchanged``."""
    try:
        await client.create(m.kind, m.obj, namespace=m.namespace)
        return "created"
    except KubeApiStatusError as exc:
        if not exc.is_already_exists:
            raise InstallError(f"{m.ref}: {exc}") from None
    for _ in range(5):
        current = await client.get(m.kind, m.name, m.namespace)
        try:
            await client.replace(m.kind, replacement(m.obj, current), namespace=m.namespace)
            return "configured"
        except KubeApiStatusError as exc:
            if not exc.is_conflict:
                raise InstallError(f"{m.ref}: {exc}") from None
    raise InstallError(f"{m.ref}: kept conflicting with another writer")


async def wait_ready(client: KubeClient, plan: Sequence[Manifest], deadline: float, echo: Echo) -> None:
    """Poll until each object of ``plan`` that has a readiness rule is ready; a line whenever one changes."""
    waiting = {m.ref: m for m in plan if needs_wait(m.kind)}
    seen = dict.fromkeys(waiting, "")
    while waiting:
        for ref, m in list(waiting.items()):
            state = readiness(m.kind, await client.get(m.kind, m.name, m.namespace))
            if state.ready:
                echo(f"  ready    {ref} ({state.detail})")
                del waiting[ref]
            elif state.detail != seen[ref]:
                echo(f"  waiting  {ref} ({state.detail})")
                seen[ref] = state.detail
        if not waiting:
            return
        if time.monotonic() >= deadline:
            late = "; ".join(f"{ref}: {seen[ref]}" for ref in waiting)
            raise InstallError(f"not ready in time: {late}")
        await asyncio.sleep(POLL_SECONDS)


async def run_install(client: KubeClient, plan: Sequence[Manifest], seconds: float, wait: bool, echo: Echo) -> None:
    """Apply ``plan`` and, with ``wait``, wait up to ``seconds`` in all for it to be ready."""
    deadline = time.monotonic() + seconds
    ordered = apply_order(plan)
    await check_served(client, ordered)
    crds = [m for m in ordered if m.kind == kinds.CUSTOM_RESOURCE_DEFINITIONS]
    for m in ordered:
        echo(f"  {await apply_one(client, m):<10} {m.ref}")
        if crds and m is crds[-1]:
            await wait_ready(client, crds, deadline, echo)
    if wait:
        await wait_ready(client, [m for m in ordered if m.kind != kinds.CUSTOM_RESOURCE_DEFINITIONS], deadline, echo)
    echo(f"✔ installed: {summary(plan)}")


async def run_uninstall(client: KubeClient, plan: Sequence[Manifest], seconds: float, purge: bool, echo: Echo) -> None:
    """Delete ``plan`` (its CRDs only with ``purge``) and wait up to ``seconds`` in all for it to be gone."""
    deadline = time.monotonic() + seconds
    ordered = [m for m in delete_order(plan) if purge or m.kind != kinds.CUSTOM_RESOURCE_DEFINITIONS]
    await check_served(client, ordered)
    for m in ordered:
        try:
            await client.delete(m.kind, m.name, m.namespace, propagation_policy="Foreground")
            echo(f"  deleted    {m.ref}")
        except KubeApiStatusError as exc:
            if not exc.is_not_found:
                raise InstallError(f"{m.ref}: {exc}") from None
            echo(f"  absent     {m.ref}")
    for m in ordered:
        while await _exists(client, m):
            if time.monotonic() >= deadline:
                raise InstallError(f"{m.ref} is still there after {seconds:g}s")
            await asyncio.sleep(POLL_SECONDS)
    kept = "" if purge else " (CRDs kept; --purge removes them)"
    echo(f"✔ uninstalled: {summary(ordered)}{kept}")


async def _exists(client: KubeClient, m: Manifest) -> bool:
    try:
        await client.get(m.kind, m.name, m.namespace)
        return True
    except KubeApiStatusError as exc:
        if exc.is_not_found:
            return False
        raise


async def control_plane_version(client: KubeClient) -> str:
    """The image tag of the ``istiod`` Deployment's first container, or why there is none."""
    try:
        deployment = await client.get(kinds.DEPLOYMENTS, "istiod", "istio-system")
    except KubeApiStatusError as exc:
        if exc.is_not_found:
            return "not installed"
        raise
    containers = ((deployment.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []
    image = str(containers[0].get("image", "")) if containers else ""
    name, _, tag = image.rpartition(":")
    return tag if name and "/" not in tag else f"unknown (image {image or 'unset'})"

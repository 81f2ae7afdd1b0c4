"""The lab's mesh config writer against ``ambit apiserver`` (a real subprocess): the file follows the cluster."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from tests.harness import ServerProcess

from ambit.controlplane.view import ClusterViewSettings
from ambit.k8s import InformerSettings, KubeClient, kinds
from ambit.lab.mesh.config import MeshConfigSettings, MeshConfigWriter
from ambit.model.localconfig import LocalConfig, parse_local_config
from ambit.model.workload import AppProtocol, HealthStatus, PortMapping, TunnelProtocol

T = TypeVar("T")
INFORMER = InformerSettings(watch_timeout=30, backoff_initial=0.02, backoff_max=0.2)
_namespaces = itertools.count(1)


async def until(probe: Callable[[], Awaitable[T] | T], what: str, within: float = 10.0) -> T:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        value = probe()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last saw {value!r}")
        await asyncio.sleep(0.05)


@pytest.fixture
async def kube(server_process: ServerProcess) -> AsyncIterator[KubeClient]:
    async with KubeClient.from_kubeconfig(server_process.kubeconfig) as client:
        yield client


@pytest.fixture
async def namespace(kube: KubeClient) -> str:
    name = f"mesh-{next(_namespaces)}"
    await kube.create(kinds.NAMESPACES, {"metadata": {"name": name}})
    return name


@pytest.fixture
async def writer(kube: KubeClient, tmp_path: Path) -> AsyncIterator[MeshConfigWriter]:
    settings = MeshConfigSettings(
        tmp_path / "mesh" / "workloads.yaml", view=ClusterViewSettings(debounce=0.05, informer=INFORMER)
    )
    async with MeshConfigWriter(kube, settings) as w:
        yield w


def read(writer: MeshConfigWriter) -> LocalConfig:
    return parse_local_config(writer.settings.path.read_text())


async def add_pod(kube: KubeClient, namespace: str, name: str, ip: str, *, ready: bool = True, **metadata: Any) -> None:
    body = {
        "metadata": {"name": name, "namespace": namespace, **metadata},
        "spec": {
            "nodeName": "node-1",
            "containers": [{"name": "app", "image": "app:1", "ports": [{"name": "http", "containerPort": 8080}]}],
        },
    }
    await kube.create(kinds.PODS, body, namespace)
    status = {
        "phase": "Running",
        "podIP": ip,
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    await kube.patch_status(kinds.PODS, name, {"status": status}, namespace, patch_type="strategic")


async def test_the_file_is_written_as_soon_as_the_caches_have_synced(
    writer: MeshConfigWriter,
) -> None:
    assert writer.settings.path.exists()
    assert writer.writes == 1
    read(writer)  # parses


async def test_pods_and_services_appear_in_the_file_and_leave_it_when_deleted(
    kube: KubeClient, namespace: str, writer: MeshConfigWriter
) -> None:
    await add_pod(
        kube,
        namespace,
        "web-1",
        "198.18.200.10",
        labels={"app": "web"},
        annotations={"ambient.istio.io/redirection": "enabled"},
    )
    await add_pod(kube, namespace, "web-2", "198.18.200.11", ready=False, labels={"app": "web"})
    service = {
        "metadata": {"name": "web", "namespace": namespace},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
    }
    await kube.create(kinds.SERVICES, service, namespace)
    uid1, uid2 = f"Kubernetes//Pod/{namespace}/web-1", f"Kubernetes//Pod/{namespace}/web-2"
    key = f"{namespace}/web.{namespace}.svc.cluster.local"

    def complete() -> dict[str, Any] | None:
        config = read(writer)
        workloads = {w.uid: w for w in config.workloads if w.namespace == namespace}
        services = [s for s in config.services if s.namespace == namespace]
        if set(workloads) == {uid1, uid2} and services and all(key in w.services for w in workloads.values()):
            return {"workloads": workloads, "service": services[0]}
        return None

    seen = await until(complete, "both pods and the Service in the file")
    web1, web2 = seen["workloads"][uid1], seen["workloads"][uid2]
    assert web1.tunnel_protocol is TunnelProtocol.HBONE and web1.status is HealthStatus.HEALTHY
    assert web2.tunnel_protocol is TunnelProtocol.NONE and web2.status is HealthStatus.UNHEALTHY
    assert web1.services[key] == (PortMapping(80, 8080),)
    # the port's name "http" makes its protocol HTTP/1.1, as istiod infers it from the name
    assert seen["service"].ports == (PortMapping(80, 0, AppProtocol.HTTP11),)
    assert len(seen["service"].vips) == 1, "the API server allocated a cluster IP"

    await kube.delete(kinds.PODS, "web-2", namespace, grace_period_seconds=0)
    await kube.delete(kinds.SERVICES, "web", namespace)

    def web2_and_service_gone() -> bool:
        config = read(writer)
        uids = {w.uid for w in config.workloads}
        return uid1 in uids and uid2 not in uids and not any(s.namespace == namespace for s in config.services)

    await until(web2_and_service_gone, "web-2 and the Service gone from the file")
    (web1,) = [w for w in read(writer).workloads if w.uid == uid1]
    assert web1.services == {}, "no Service selects web-1 any more"


async def test_an_unchanged_cluster_does_not_rewrite_the_file(
    kube: KubeClient, namespace: str, writer: MeshConfigWriter
) -> None:
    await add_pod(kube, namespace, "calm", "198.18.200.20")
    await until(lambda: any(w.name == "calm" for w in read(writer).workloads), "the pod in the file")
    await asyncio.sleep(0.3)
    writes, mtime = writer.writes, writer.settings.path.stat().st_mtime_ns
    # A change that does not change the translation (an annotation nobody reads) writes nothing.
    await kube.patch(kinds.PODS, "calm", {"metadata": {"annotations": {"unrelated": "1"}}}, namespace)
    await asyncio.sleep(0.5)
    assert writer.writes == writes
    assert writer.settings.path.stat().st_mtime_ns == mtime
    assert not any(p.name.endswith(".tmp") for p in writer.settings.path.parent.iterdir())


async def test_a_burst_of_changes_is_written_once_after_the_debounce(
    kube: KubeClient, namespace: str, writer: MeshConfigWriter
) -> None:
    await asyncio.sleep(0.3)
    writes = writer.writes
    await asyncio.gather(*(add_pod(kube, namespace, f"b-{i}", f"198.18.201.{i + 1}") for i in range(5)))
    await until(
        lambda: sum(1 for w in read(writer).workloads if w.namespace == namespace) == 5, "five pods in the file"
    )
    # Ten API writes (create, status) in a burst, far fewer file writes.
    assert writer.writes - writes < 10

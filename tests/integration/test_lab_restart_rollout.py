"""``ambit lab restart``'s shell (:mod:`ambit.lab.cluster.restart`) against a real API server: the restart reaches
the pod template through the API, the wait follows the workload's status to the end, printing kubectl's lines, and
a rollout that does not finish, or a workload that is absent, is one clear error.

No lab controllers run here, so the test writes the DaemonSet's and Deployment's status itself, step by step, as
their controllers would (the e2e test, tests/e2e/test_lab_restart.py, has the real ones)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from tests.integration.lab_cluster import kubectl
from tests.supervision import until_true

from ambit.apiserver.server import ApiServer, write_kubeconfig
from ambit.k8s import KubeClient, kinds
from ambit.lab.cluster.restart import restart_workload
from ambit.lab.cluster.rollout import COMPONENTS, RESTARTED_AT, RolloutError, rollout_progress

SYSTEM = "istio-system"
TEMPLATE = {
    "metadata": {"labels": {"app": "x"}},
    "spec": {"containers": [{"name": "c", "image": "none", "command": ["sleep", "1"]}]},
}


@pytest.fixture
async def admin(tmp_path: Path, apiserver: ApiServer) -> Any:
    ca = (apiserver.settings.data_dir / "pki" / "ca.crt").read_bytes()
    write_kubeconfig(tmp_path / "kubeconfig", apiserver.url, ca, apiserver.admin_token)
    async with KubeClient.from_kubeconfig(tmp_path / "kubeconfig") as client:
        await client.create(kinds.NAMESPACES, {"metadata": {"name": SYSTEM}})
        yield client


def _daemon_set(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": "x"}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": TEMPLATE,
        },
    }


async def _when_generation(client: KubeClient, kind: kinds.ResourceKind, name: str, above: int) -> int:
    while True:
        generation = int((await client.get(kind, name, SYSTEM))["metadata"]["generation"])
        if generation > above:
            return generation
        await asyncio.sleep(0.02)


async def test_a_node_proxy_restart_patches_the_template_and_waits_for_every_node_as_rollout_status(
    admin: KubeClient,
) -> None:
    created = await admin.create(kinds.DAEMON_SETS, _daemon_set("ztunnel"), SYSTEM)
    before = int(created["metadata"]["generation"])
    seen: list[str] = []
    restart = asyncio.create_task(
        restart_workload(admin, COMPONENTS["nodeproxy"], seconds=60, echo=seen.append, poll=0.05)
    )
    generation = await _when_generation(admin, kinds.DAEMON_SETS, "ztunnel", before)
    # The DaemonSet controller's steps: one node updated, both updated, both available; each waits until the
    # command has reported the one before it.
    steps = [
        (1, 0, 'Waiting for daemon set "ztunnel" rollout to finish: 1 out of 2 new pods have been updated...'),
        (2, 1, 'Waiting for daemon set "ztunnel" rollout to finish: 1 of 2 updated pods are available...'),
        (2, 2, 'daemon set "ztunnel" successfully rolled out'),
    ]
    for updated, available, line in steps:
        status = {
            "observedGeneration": generation,
            "desiredNumberScheduled": 2,
            "currentNumberScheduled": 2,
            "numberReady": available,
            "updatedNumberScheduled": updated,
            "numberAvailable": available,
        }
        await admin.patch_status(kinds.DAEMON_SETS, "ztunnel", {"status": status}, SYSTEM)
        await until_true(lambda line=line: line in seen, f"the command reporting {line!r}", within=30)
    took = await asyncio.wait_for(restart, 30)

    template = (await admin.get(kinds.DAEMON_SETS, "ztunnel", SYSTEM))["spec"]["template"]
    assert RESTARTED_AT in template["metadata"]["annotations"]
    assert seen[0] == "daemonset/ztunnel restarted"
    assert seen[-1] == 'daemon set "ztunnel" successfully rolled out'
    assert len(seen) == len(set(seen)), seen  # each line once, however often the status was read
    assert took >= 0


async def test_a_control_plane_restart_waits_for_the_deployments_new_replica(admin: KubeClient) -> None:
    body = {
        "metadata": {"name": "istiod"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "x"}}, "template": TEMPLATE},
    }
    before = int((await admin.create(kinds.DEPLOYMENTS, body, SYSTEM))["metadata"]["generation"])
    seen: list[str] = []
    restart = asyncio.create_task(
        restart_workload(admin, COMPONENTS["controlplane"], seconds=60, echo=seen.append, poll=0.05)
    )
    generation = await _when_generation(admin, kinds.DEPLOYMENTS, "istiod", before)
    status = {"observedGeneration": generation, "replicas": 2, "updatedReplicas": 1, "availableReplicas": 1}
    await admin.patch_status(kinds.DEPLOYMENTS, "istiod", {"status": status}, SYSTEM)
    await asyncio.sleep(0.3)
    assert not restart.done(), seen  # an old replica is still there
    status = {"observedGeneration": generation, "replicas": 1, "updatedReplicas": 1, "availableReplicas": 1}
    await admin.patch_status(kinds.DEPLOYMENTS, "istiod", {"status": status}, SYSTEM)
    await asyncio.wait_for(restart, 30)
    assert 'Waiting for deployment "istiod" rollout to finish: 1 old replicas are pending termination...' in seen
    assert seen[-1] == 'deployment "istiod" successfully rolled out'


async def test_a_rollout_that_does_not_finish_in_time_or_an_absent_workload_is_one_clear_error(
    admin: KubeClient,
) -> None:
    with pytest.raises(RolloutError, match=r"daemonset/ztunnel not found in istio-system \(is the mesh installed\?\)"):
        await restart_workload(admin, COMPONENTS["nodeproxy"], seconds=5, echo=lambda _: None)
    await admin.create(kinds.DAEMON_SETS, _daemon_set("istio-cni-node"), SYSTEM)
    seen: list[str] = []
    with pytest.raises(RolloutError) as stuck:
        await restart_workload(admin, COMPONENTS["nodeagent"], seconds=0.5, echo=seen.append, poll=0.05)
    message = str(stuck.value)
    assert message.startswith("daemonset/istio-cni-node not rolled out after 0.5 s: "), message
    assert message.endswith("Waiting for daemon set spec update to be observed..."), message  # the last line seen
    assert "\n" not in message


@pytest.mark.kubectl
async def test_the_real_kubectl_restarts_and_judges_the_same_objects_as_ambit_does(
    admin: KubeClient, apiserver: ApiServer
) -> None:
    """Parity with kubectl: ``kubectl rollout restart`` sets the same annotation, and ``kubectl rollout status
    --watch=false`` prints, for each status a DaemonSet and a Deployment pass through, the line :mod:`rollout` gives."""
    await admin.create(kinds.DAEMON_SETS, _daemon_set("ztunnel"), SYSTEM)
    body = {
        "metadata": {"name": "istiod"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "x"}}, "template": TEMPLATE},
    }
    await admin.create(kinds.DEPLOYMENTS, body, SYSTEM)
    config = apiserver.kubeconfig
    for workload in (COMPONENTS["nodeproxy"], COMPONENTS["controlplane"]):
        await kubectl(config, "rollout", "restart", str(workload), "-n", SYSTEM)
    ds = await admin.get(kinds.DAEMON_SETS, "ztunnel", SYSTEM)
    assert RESTARTED_AT in ds["spec"]["template"]["metadata"]["annotations"]
    generation = int(ds["metadata"]["generation"])
    steps: list[tuple[Any, dict[str, Any]]] = [
        (COMPONENTS["nodeproxy"], {"observedGeneration": generation - 1, "desiredNumberScheduled": 2}),
        *(
            (
                COMPONENTS["nodeproxy"],
                {
                    "observedGeneration": generation,
                    "desiredNumberScheduled": 2,
                    "currentNumberScheduled": 2,
                    "numberReady": available,
                    "updatedNumberScheduled": updated,
                    "numberAvailable": available,
                },
            )
            for updated, available in ((0, 2), (1, 1), (2, 1), (2, 2))
        ),
    ]
    deploy_generation = int((await admin.get(kinds.DEPLOYMENTS, "istiod", SYSTEM))["metadata"]["generation"])
    for replicas, updated, available in ((3, 1, 2), (2, 2, 1), (2, 2, 2)):
        status = {
            "observedGeneration": deploy_generation,
            "replicas": replicas,
            "updatedReplicas": updated,
            "readyReplicas": available,
            "availableReplicas": available,
        }
        steps.append((COMPONENTS["controlplane"], status))
    for workload, status in steps:
        kind = kinds.DAEMON_SETS if workload.kind == "daemonset" else kinds.DEPLOYMENTS
        await admin.patch_status(kind, workload.name, {"status": status}, SYSTEM)
        obj = await admin.get(kind, workload.name, SYSTEM)
        theirs = await kubectl(config, "rollout", "status", str(workload), "-n", SYSTEM, "--watch=false")
        assert theirs.strip() == rollout_progress(workload, obj).message, (status, theirs)

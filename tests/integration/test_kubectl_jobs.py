"""The real kubectl against the embedded API server on Jobs and CronJobs: ``create job``, ``wait
--for=condition=complete``, ``get jobs`` and ``get cronjobs`` (the server's tables), ``create cronjob``, ``create
job --from=cronjob/...``, discovery, and malformed manifests refused with a clear 422, with the lab's controllers
and a stand-in kubelet whose pods succeed."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.integration.lab_cluster import Kubelet, add_node, kubectl, settings

from ambit.apiserver.server import ApiServer
from ambit.k8s import KubeClient
from ambit.lab.controllers import ControllerManager

pytestmark = pytest.mark.kubectl

BAD_CRON_JOB = """
apiVersion: batch/v1
kind: CronJob
metadata: {name: bad, namespace: default}
spec:
  schedule: "CRON_TZ=UTC 61 * * * *"
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: Always
          containers: [{name: main, image: busybox}]
"""

BAD_JOB = """
apiVersion: batch/v1
kind: Job
metadata: {name: bad, namespace: default}
spec:
  parallelism: 99999999999
  backoffLimit: -1
  template:
    spec:
      restartPolicy: Always
      containers: [{name: main, image: busybox}]
"""


@pytest.fixture
async def cluster(apiserver: ApiServer) -> AsyncIterator[Path]:
    async with (
        KubeClient.from_kubeconfig(apiserver.kubeconfig) as kube,
        ControllerManager(kube, settings(disruption=False, endpoints=False)),
        Kubelet(kube, finish="Succeeded"),
    ):
        await add_node(kube, "node-a")
        yield apiserver.kubeconfig


def rows(table: str) -> list[list[str]]:
    """``kubectl get`` output split into columns (at runs of two or more spaces)."""
    return [re.split(r"\s{2,}", line.strip()) for line in table.strip().splitlines()]


async def test_create_wait_and_get_a_job(cluster: Path) -> None:
    created = await kubectl(cluster, "create", "job", "hello", "--image=busybox", "--", "echo", "hi")
    assert created.strip() == "job.batch/hello created"
    waited = await kubectl(cluster, "wait", "--for=condition=complete", "job/hello", "--timeout=30s")
    assert waited.strip() == "job.batch/hello condition met"
    table = rows(await kubectl(cluster, "get", "jobs"))
    assert table[0] == ["NAME", "STATUS", "COMPLETIONS", "DURATION", "AGE"]
    assert table[1][:3] == ["hello", "Complete", "1/1"]
    wide = rows(await kubectl(cluster, "get", "job", "hello", "-o", "wide"))
    assert wide[0][5:] == ["CONTAINERS", "IMAGES", "SELECTOR"]
    assert wide[1][5:7] == ["hello", "busybox"] and wide[1][7].startswith("batch.kubernetes.io/controller-uid=")
    pods = await kubectl(cluster, "get", "pods", "-l", "job-name=hello", "-o", "jsonpath={.items[*].status.phase}")
    assert pods == "Succeeded"
    assert "job.batch/hello" in await kubectl(cluster, "get", "all", "-o", "name")
    described = await kubectl(cluster, "describe", "job", "hello")
    assert "Pods Statuses:" in described and "1 Succeeded" in described, described


async def test_create_a_cron_job_and_a_job_from_it(cluster: Path) -> None:
    made = await kubectl(
        cluster, "create", "cronjob", "tick", "--image=busybox", "--schedule=*/5 * * * *", "--", "date"
    )
    assert made.strip() == "cronjob.batch/tick created"
    table = rows(await kubectl(cluster, "get", "cj"))
    assert table[0] == ["NAME", "SCHEDULE", "TIMEZONE", "SUSPEND", "ACTIVE", "LAST SCHEDULE", "AGE"]
    assert table[1][:6] == ["tick", "*/5 * * * *", "<none>", "False", "0", "<none>"]
    manual = await kubectl(cluster, "create", "job", "tick-manual", "--from=cronjob/tick")
    assert manual.strip() == "job.batch/tick-manual created"
    owner = await kubectl(cluster, "get", "job", "tick-manual", "-o", "jsonpath={.metadata.ownerReferences[0].kind}")
    assert owner == "CronJob"
    waited = await kubectl(cluster, "wait", "--for=condition=complete", "job/tick-manual", "--timeout=30s")
    assert "condition met" in waited
    described = await kubectl(cluster, "describe", "cronjob", "tick")
    assert "*/5 * * * *" in described and "Concurrency Policy:" in described, described
    resources = await kubectl(cluster, "api-resources", "--api-group=batch", "-o", "name")
    assert resources.split() == ["cronjobs.batch", "jobs.batch"]


@pytest.mark.parametrize(
    ("manifest", "expected"),
    [
        (
            BAD_CRON_JOB,
            [
                'The CronJob "bad" is invalid',
                "spec.schedule: Invalid value",
                "cannot use TZ or CRON_TZ in schedule",
                'spec.jobTemplate.spec.template.spec.restartPolicy: Unsupported value: "Always"',
            ],
        ),
        (
            BAD_JOB,
            [
                'The Job "bad" is invalid',
                "spec.parallelism: Invalid value: 99999999999: must be less than or equal to 2147483647",
                "spec.backoffLimit: Invalid value: -1: must be greater than or equal to 0",
                'spec.template.spec.restartPolicy: Unsupported value: "Always": supported values: "OnFailure", "Never"',
            ],
        ),
    ],
)
async def test_a_malformed_manifest_is_refused_with_its_fields(
    cluster: Path, manifest: str, expected: list[str]
) -> None:
    out = await kubectl(cluster, "apply", "-f", "-", stdin=manifest, check=False)
    for text in expected:
        assert text in out, out
    assert "Traceback" not in out


async def test_the_view_and_edit_roles_cover_jobs_and_cron_jobs_as_kubes_do(cluster: Path) -> None:
    for role, user in (("view", "viewer"), ("edit", "editor")):
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": user, "namespace": "default"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }
        await kubectl(cluster, "apply", "-f", "-", stdin=json.dumps(binding))

    async def can(user: str, *what: str) -> str:
        out = await kubectl(cluster, "auth", "can-i", *what, f"--as={user}", check=False)
        return out.strip().splitlines()[0]

    for resource in ("jobs.batch", "cronjobs.batch", "jobs.batch/status", "cronjobs.batch/status"):
        assert await can("viewer", "get", resource) == "yes", resource
    assert (await can("viewer", "create", "jobs.batch")).startswith("no")
    for verb in ("create", "delete", "patch"):
        for resource in ("jobs.batch", "cronjobs.batch"):
            assert await can("editor", verb, resource) == "yes", (verb, resource)

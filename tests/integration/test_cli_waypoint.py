"""``ambit waypoint apply|list|status|delete`` (typer's CliRunner) against a real API server (subprocess, the
CRDs installed), with the real control plane deploying the waypoints for ``--wait``.

The commands run ``asyncio.run`` themselves, so each invocation runs in a worker thread while the control plane
runs in the test's loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from click.testing import Result
from tests.harness import ServerProcess
from tests.integration.controlplane_rig import eventually
from typer.testing import CliRunner

from ambit.cli import waypoint as waypoint_commands  # noqa: F401  (registers the commands on the app)
from ambit.cli.app import app
from ambit.controlplane.process import ControlPlane
from ambit.k8s import KubeClient, KubeNotFoundError, kinds

Obj = dict[str, Any]


@pytest.fixture
def cli(server_process: ServerProcess) -> Callable[..., Awaitable[Result]]:
    runner = CliRunner()

    async def run(*args: str) -> Result:
        argv = ["waypoint", *args, "--kubeconfig", str(server_process.kubeconfig)]
        return await asyncio.to_thread(runner.invoke, app, argv)

    return run


async def make_ready(kube: KubeClient, namespace: str, name: str) -> None:
    """Be the Deployment controller: once the waypoint's Deployment exists, report one ready replica."""

    async def deployment() -> Obj | None:
        try:
            return await kube.get(kinds.DEPLOYMENTS, name, namespace)
        except KubeNotFoundError:
            return None

    await eventually(deployment)
    await kube.patch_status(kinds.DEPLOYMENTS, name, {"status": {"replicas": 1, "readyReplicas": 1}}, namespace)


async def test_apply_creates_the_waypoint_gateway(kube: KubeClient, namespace: str, cli: Any) -> None:
    result = await cli("apply", "-n", namespace, "--for", "workload")
    assert result.exit_code == 0, result.output
    assert result.output == f"✅ waypoint {namespace}/waypoint applied\n"
    gateway = await kube.get(kinds.GATEWAYS, "waypoint", namespace)
    assert gateway["spec"]["gatewayClassName"] == "istio-waypoint"
    assert gateway["spec"]["listeners"] == [{"name": "mesh", "port": 15008, "protocol": "HBONE"}]
    assert gateway["metadata"]["labels"] == {"istio.io/waypoint-for": "workload"}
    again = await cli("apply", "-n", namespace, "--for", "all")
    assert again.exit_code == 0, again.output
    gateway = await kube.get(kinds.GATEWAYS, "waypoint", namespace)
    assert gateway["metadata"]["labels"] == {"istio.io/waypoint-for": "all"}


async def test_apply_enroll_and_wait_labels_the_namespace_once_the_waypoint_is_ready(
    kube: KubeClient, plane: ControlPlane, namespace: str, cli: Any
) -> None:
    await kube.patch(kinds.NAMESPACES, namespace, {"metadata": {"labels": {"istio.io/dataplane-mode": "ambient"}}})
    ready = asyncio.create_task(make_ready(kube, namespace, "wp"))
    result = await cli("apply", "-n", namespace, "--name", "wp", "--enroll-namespace", "--wait")
    await ready
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        f"✅ waypoint {namespace}/wp applied",
        f"✅ waypoint {namespace}/wp is ready!",
        f'✅ namespace {namespace} labeled with "istio.io/use-waypoint: wp"',
    ]
    ns = await kube.get(kinds.NAMESPACES, namespace)
    assert ns["metadata"]["labels"]["istio.io/use-waypoint"] == "wp"

    listed = await cli("list", "-n", namespace)
    assert listed.exit_code == 0, listed.output
    header, row = listed.output.splitlines()
    assert header.split() == ["NAME", "REVISION", "TRAFFIC", "TYPE", "PROGRAMMED"]
    assert row.split() == ["wp", "default", "service", "True"]
    status = await cli("status", "-n", namespace)
    assert status.exit_code == 0, status.output
    header, row = status.output.splitlines()
    assert header.split() == ["NAME", "STATUS", "TYPE", "REASON", "MESSAGE"]
    assert row.split()[:4] == ["wp", "True", "Programmed", "Programmed"]

    # Enrolled already: without --overwrite istioctl only warns, and applies nothing.
    warned = await cli("apply", "-n", namespace, "--name", "other", "--enroll-namespace")
    assert warned.exit_code == 0, warned.output
    assert "already has an enrolled Waypoint" in warned.output and "--overwrite" in warned.output
    with pytest.raises(KubeNotFoundError):
        await kube.get(kinds.GATEWAYS, "other", namespace)


async def test_apply_warns_when_the_namespace_is_not_ambient(namespace: str, cli: Any) -> None:
    result = await cli("apply", "-n", namespace, "--enroll-namespace")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0].startswith("⚠️ Warning: namespace is not enrolled in ambient.")


async def test_list_and_status_across_namespaces_and_when_there_are_none(
    kube: KubeClient, namespace: str, cli: Any
) -> None:
    empty = await cli("list", "-n", namespace)
    assert empty.output == "No waypoints found.\n"
    for name in ("b-waypoint", "a-waypoint"):
        assert (await cli("apply", "-n", namespace, "--name", name, "-r", "canary")).exit_code == 0
    listed = await cli("list", "-A")
    rows = [line.split() for line in listed.output.splitlines()]
    assert rows[0] == ["NAMESPACE", "NAME", "REVISION", "TRAFFIC", "TYPE", "PROGRAMMED"]
    mine = [r for r in rows[1:] if r[0] == namespace]
    assert mine == [
        [namespace, "a-waypoint", "canary", "service", "False"],
        [namespace, "b-waypoint", "canary", "service", "False"],
    ]
    status = await cli("status", "-n", namespace, "--name", "a-waypoint", "--no-wait")
    assert status.exit_code == 0, status.output
    assert len(status.output.splitlines()) == 2
    timed_out = await cli("status", "-n", namespace, "--name", "a-waypoint", "--waypoint-timeout", "0.2")
    assert timed_out.exit_code == 1
    assert f"timed out while retrieving status for waypoint\t{namespace}/a-waypoint" in timed_out.output


async def test_status_lists_the_services_a_waypoint_fronts_with_their_weighted_canary(
    kube: KubeClient, namespace: str, cli: Any
) -> None:
    for name in ("primary", "canary"):
        assert (await cli("apply", "-n", namespace, "--name", name)).exit_code == 0
        address = {"type": "Hostname", "value": f"{name}.{namespace}.svc.cluster.local"}
        await kube.patch_status(kinds.GATEWAYS, name, {"status": {"addresses": [address]}}, namespace)
    labels = {"istio.io/use-waypoint": "primary", "istio.io/use-waypoint-canary": "canary"}
    services = [
        ("reviews", labels, {"istio.io/use-waypoint-canary-weight": "25"}),
        ("ratings", {"istio.io/use-waypoint": "primary"}, {}),
        ("web", {}, {}),
    ]
    for name, service_labels, service_annotations in services:
        meta = {"name": name, "namespace": namespace, "labels": service_labels, "annotations": service_annotations}
        await kube.create(kinds.SERVICES, {"metadata": meta, "spec": {"ports": [{"port": 80}]}}, namespace)
    status = await cli("status", "-n", namespace, "--no-wait")
    assert status.exit_code == 0, status.output
    blocks = status.output.split("\n\n")
    assert [line.split()[0] for line in blocks[0].splitlines()] == ["NAME", "canary", "primary"]
    rows = [line.split() for line in blocks[1].splitlines()]
    assert rows == [
        ["NAMESPACE", "NAME", "KIND", "WAYPOINT", "WEIGHTED", "WAYPOINTS"],
        [namespace, "ratings", "Service", f"{namespace}/primary", "None"],
        [namespace, "reviews", "Service", f"{namespace}/primary", f"{namespace}/primary=75%,{namespace}/canary=25%"],
    ]
    only_canary = await cli("status", "-n", namespace, "--name", "canary", "--no-wait")
    assert [line.split()[1] for line in only_canary.output.split("\n\n")[1].splitlines()[1:]] == ["reviews"]


async def test_delete_by_name_all_and_revision(kube: KubeClient, namespace: str, cli: Any) -> None:
    for name, revision in (("one", "r1"), ("two", "r2"), ("three", "r2")):
        assert (await cli("apply", "-n", namespace, "--name", name, "-r", revision)).exit_code == 0
    deleted = await cli("delete", "-n", namespace, "one", "missing")
    assert deleted.exit_code == 0, deleted.output
    assert sorted(deleted.output.splitlines()) == sorted(
        [f"waypoint {namespace}/missing not found", f"waypoint {namespace}/one deleted"]
    )
    by_revision = await cli("delete", "-n", namespace, "-r", "r2")
    assert sorted(by_revision.output.splitlines()) == [
        f"waypoint {namespace}/three deleted",
        f"waypoint {namespace}/two deleted",
    ]
    items, _ = await kube.list(kinds.GATEWAYS, namespace)
    assert items == []


async def test_delete_keeps_gateways_of_other_classes(kube: KubeClient, namespace: str, cli: Any) -> None:
    ingress = {"metadata": {"name": "ingress", "namespace": namespace}, "spec": {"gatewayClassName": "istio"}}
    await kube.create(kinds.GATEWAYS, ingress)
    assert (await cli("apply", "-n", namespace)).exit_code == 0
    result = await cli("delete", "-n", namespace, "--all")
    assert result.output == f"waypoint {namespace}/waypoint deleted\n"
    assert (await kube.get(kinds.GATEWAYS, "ingress", namespace))["spec"]["gatewayClassName"] == "istio"
    refused = await cli("apply", "-n", namespace, "--name", "ingress")
    assert refused.exit_code == 1
    assert "exists with class 'istio', not 'istio-waypoint'" in refused.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("apply", "--for", "everything"),
            "invalid traffic type: everything. Valid options are: [all none service workload]",
        ),
        (("apply", "--name", "none"), "invalid name provided for waypoint, 'none' is a reserved value"),
        (("apply", "--name", "../../secrets"), "invalid name '../../secrets' for a waypoint"),
        (("apply", "--name", "a.b"), "must be a DNS-1035 label"),
        (("apply", "-n", "no/such"), "invalid namespace 'no/such'"),
        (("apply", "-n", "absent-namespace-x"), "namespace: absent-namespace-x not found"),
        (("list", "-n", "../x"), "invalid namespace '../x'"),
        (("delete", "x/y"), "invalid waypoint name 'x/y'"),
        (("delete", "--all", "x"), "cannot specify waypoint names when deleting all waypoints"),
        (("delete",), "must specify a waypoint name or delete all using --all"),
    ],
    ids=[
        "bad-for",
        "none",
        "path",
        "dotted",
        "ns-slash",
        "ns-missing",
        "list-ns",
        "delete-slash",
        "all-and-names",
        "nothing",
    ],
)
async def test_bad_input_is_one_clear_line_and_exit_status_one(args: tuple[str, ...], message: str, cli: Any) -> None:
    result = await cli(*args)
    assert result.exit_code == 1, result.output
    assert message in result.output
    assert "Traceback" not in result.output and len(result.output.splitlines()) == 1


async def test_upstream_waypoint_test_invocations_work_as_written(
    kube: KubeClient, plane: ControlPlane, namespace: str, cli: Any
) -> None:
    """The words of istio's tests/integration/ambient/waypoint_test.go TestWaypoint, in its order."""
    await kube.patch(kinds.NAMESPACES, namespace, {"metadata": {"labels": {"istio.io/dataplane-mode": "ambient"}}})
    ready = [asyncio.create_task(make_ready(kube, namespace, n)) for n in ("waypoint", "w1", "w2", "w3")]
    steps = [
        ("apply", "--namespace", namespace, "--wait"),
        *(("apply", "--namespace", namespace, "--name", name, "--wait") for name in ("", "w1", "w2")),
        ("apply", "--namespace", namespace, "--name", "w3", "--enroll-namespace", "true", "--wait"),
    ]
    for step in steps:
        result = await cli(*step)
        assert result.exit_code == 0, (step, result.output)
    await asyncio.gather(*ready)
    assert (await kube.get(kinds.NAMESPACES, namespace))["metadata"]["labels"]["istio.io/use-waypoint"] == "w3"
    for listing in (("list", "--namespace", namespace), ("-n", namespace, "list"), ("list", "-A")):
        listed = await cli(*listing)
        assert listed.exit_code == 0, listed.output
        for name in ("waypoint", "w1", "w2", "w3"):
            assert name in listed.output, (listing, listed.output)

    deleted = await cli("-n", namespace, "delete", "w1", "w2")
    assert deleted.exit_code == 0, deleted.output
    assert sorted(deleted.output.splitlines()) == [
        f"waypoint {namespace}/w1 deleted",
        f"waypoint {namespace}/w2 deleted",
    ]
    rest = await cli("-n", namespace, "delete", "--all")
    assert rest.exit_code == 0, rest.output
    assert sorted(rest.output.splitlines()) == [
        f"waypoint {namespace}/w3 deleted",
        f"waypoint {namespace}/waypoint deleted",
    ]
    items, _ = await kube.list(kinds.GATEWAYS, namespace)
    assert items == []


async def test_group_flags_and_istioctl_bool_spellings(kube: KubeClient, namespace: str, cli: Any) -> None:
    # --name and -n on the group are the defaults of the command's; the command's own win.
    result = await cli("-n", namespace, "--name", "grouped", "apply", "--enroll-namespace=false", "--wait=false")
    assert result.exit_code == 0, result.output
    assert result.output == f"✅ waypoint {namespace}/grouped applied\n"
    assert "istio.io/use-waypoint" not in (
        (await kube.get(kinds.NAMESPACES, namespace))["metadata"].get("labels") or {}
    )
    own = await cli("-n", "elsewhere", "--name", "grouped", "apply", "-n", namespace, "--name", "own", "-r", "foo")
    assert own.exit_code == 0, own.output
    assert (await kube.get(kinds.GATEWAYS, "own", namespace))["metadata"]["labels"] == {"istio.io/rev": "foo"}
    status = await cli("-n", namespace, "--name", "own", "status", "--wait=false")
    assert status.exit_code == 0, status.output
    assert [line.split()[0] for line in status.output.splitlines()] == ["NAME", "own"]
    every = await cli("-n", namespace, "--name", "own", "status", "--name", "", "--no-wait")
    assert [line.split()[0] for line in every.output.splitlines()] == ["NAME", "grouped", "own"]
    listed = await cli("-n", namespace, "list", "-A=false")
    assert [line.split()[0] for line in listed.output.splitlines()] == ["NAME", "grouped", "own"]
    refused = await cli("-n", namespace, "apply", "--wait=soon")
    assert refused.exit_code == 2
    assert "invalid argument 'soon' for '--wait' flag: expected true or false" in refused.output
    stray = await cli("-n", namespace, "apply", "extra")
    assert stray.exit_code == 2 and "unexpected extra argument" in stray.output


async def test_generate_prints_what_apply_creates_and_changes_nothing(
    kube: KubeClient, namespace: str, cli: Any
) -> None:
    result = await cli("generate", "-n", namespace, "--for", "service", "-r", "canary")
    assert result.exit_code == 0, result.output
    assert result.output == (
        "apiVersion: gateway.networking.k8s.io/v1\n"
        "kind: Gateway\n"
        "metadata:\n"
        "  labels:\n"
        "    istio.io/rev: canary\n"
        "    istio.io/waypoint-for: service\n"
        "  name: waypoint\n"
        f"  namespace: {namespace}\n"
        "spec:\n"
        "  gatewayClassName: istio-waypoint\n"
        "  listeners:\n"
        "  - name: mesh\n"
        "    port: 15008\n"
        "    protocol: HBONE\n"
    )
    with pytest.raises(KubeNotFoundError):
        await kube.get(kinds.GATEWAYS, "waypoint", namespace)
    plain = await cli("generate", "-n", namespace, "--name", "wp")
    assert plain.exit_code == 0 and "labels" not in plain.output, "no --for: istiod picks the class default"
    bad = await cli("generate", "-n", namespace, "--for", "everything")
    assert bad.exit_code == 1 and "invalid traffic type: everything" in bad.output
    bad_name = await cli("generate", "-n", namespace, "--name", "Not_A_Name")
    assert bad_name.exit_code == 1

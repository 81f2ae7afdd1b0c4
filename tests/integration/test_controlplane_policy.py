"""L4 policy through the real control plane: Authorization over delta ADS, incremental, and ZtunnelAccepted status.

A real API server (subprocess, the CRDs installed) and the real control plane (tests/integration/controlplane_rig.py).
The xDS side is a raw gRPC delta client that subscribes to both types (wildcard), ACKs
every response and records what each one carried, so tests can say exactly which resources a change re-sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from tests.integration.controlplane_rig import account_token, delta_stream, eventually, make_pod

from ambit.api import authorization_pb2 as apb
from ambit.api import discovery_pb2 as dpb
from ambit.api import workload_pb2 as wpb
from ambit.controlplane.process import ControlPlane
from ambit.k8s import KubeClient, kinds
from ambit.xds.convert import ADDRESS_TYPE_URL
from ambit.xds.session import AUTHORIZATION_TYPE_URL

Obj = dict[str, Any]


@dataclass
class DeltaClient:
    """What the server sent: the latest body per (type, name), and every (type, name) sent or removed, in order."""

    held: dict[tuple[str, str], bytes] = field(default_factory=dict)
    sent: list[tuple[str, str]] = field(default_factory=list)
    removed: list[tuple[str, str]] = field(default_factory=list)
    responses: dict[str, int] = field(default_factory=dict)

    def record(self, response: dpb.DeltaDiscoveryResponse) -> None:
        t = response.type_url
        for resource in response.resources:
            self.held[(t, resource.name)] = resource.resource.value
            self.sent.append((t, resource.name))
        for name in response.removed_resources:
            self.held.pop((t, name), None)
            self.removed.append((t, name))
        self.responses[t] = self.responses.get(t, 0) + 1

    def mark(self) -> int:
        return len(self.sent)

    def sent_since(self, mark: int) -> list[tuple[str, str]]:
        return self.sent[mark:]

    def authorization(self, key: str) -> apb.Authorization | None:
        body = self.held.get((AUTHORIZATION_TYPE_URL, key))
        return None if body is None else apb.Authorization.FromString(body)

    def workload(self, name: str) -> wpb.Workload | None:
        for (type_url, _), body in self.held.items():
            if type_url == ADDRESS_TYPE_URL:
                address = wpb.Address.FromString(body)
                if address.HasField("workload") and address.workload.name == name:
                    return address.workload
        return None


@pytest.fixture
async def xds(kube: KubeClient, plane: ControlPlane) -> AsyncIterator[DeltaClient]:
    token = await account_token(kube, "istio-system", "ztunnel")
    client = DeltaClient()
    requests = [dpb.DeltaDiscoveryRequest(type_url=t) for t in (ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL)]
    async with delta_stream(plane, token, requests, client.record):
        await eventually(lambda: len(client.responses) == 2)
        yield client


def policy(name: str, namespace: str, **spec: Any) -> Obj:
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


async def test_a_policy_arrives_changes_and_is_removed_and_only_what_changed_is_resent(
    kube: KubeClient, namespace: str, xds: DeltaClient
) -> None:
    await make_pod(kube, namespace, "web-1", "198.18.220.1", {"app": "web"})
    await make_pod(kube, namespace, "db-1", "198.18.220.2", {"app": "db"})
    await eventually(lambda: xds.workload("web-1") and xds.workload("db-1"))
    key = f"{namespace}/deny-ssh"

    # Apply: the Authorization arrives; the selected workload's Address is re-sent listing it, the other is not.
    mark = xds.mark()
    deny = policy("deny-ssh", namespace, selector={"matchLabels": {"app": "web"}}, action="DENY")
    deny["spec"]["rules"] = [{"to": [{"operation": {"ports": ["22"]}}]}]
    await kube.create(kinds.AUTHORIZATION_POLICIES, deny)
    await eventually(lambda: xds.authorization(key) is not None)
    await eventually(lambda: list((xds.workload("web-1") or wpb.Workload()).authorization_policies) == [key])
    arrived = xds.authorization(key)
    assert arrived is not None and arrived.action == apb.Action.DENY and arrived.scope == apb.Scope.WORKLOAD_SELECTOR
    assert list(arrived.rules[0].clauses[0].matches[0].destination_ports) == [22]
    assert (ADDRESS_TYPE_URL, f"Kubernetes//Pod/{namespace}/db-1") not in xds.sent_since(mark)

    # Change it: only the Authorization is re-sent (the workloads' lists did not change).
    mark = xds.mark()
    current = await kube.get(kinds.AUTHORIZATION_POLICIES, "deny-ssh", namespace)
    current["spec"]["rules"][0]["to"][0]["operation"]["ports"] = ["22", "23"]
    await kube.replace(kinds.AUTHORIZATION_POLICIES, current)
    await eventually(
        lambda: (
            list((xds.authorization(key) or apb.Authorization()).rules[0].clauses[0].matches[0].destination_ports)
            == [22, 23]
        )
    )
    assert all(type_url == AUTHORIZATION_TYPE_URL for type_url, _ in xds.sent_since(mark))

    # A label change selects db-1 too: its Address alone is re-sent, the policy is not.
    mark = xds.mark()
    await kube.patch(kinds.PODS, "db-1", {"metadata": {"labels": {"app": "web"}}}, namespace)
    await eventually(lambda: list((xds.workload("db-1") or wpb.Workload()).authorization_policies) == [key])
    await asyncio.sleep(0.3)  # let any (wrong) extra push land before looking
    assert xds.sent_since(mark) == [(ADDRESS_TYPE_URL, f"Kubernetes//Pod/{namespace}/db-1")]

    # Delete it: the removal is sent, and both workloads are re-sent without it.
    await kube.delete(kinds.AUTHORIZATION_POLICIES, "deny-ssh", namespace)
    await eventually(lambda: (AUTHORIZATION_TYPE_URL, key) in xds.removed)
    await eventually(
        lambda: all(not (xds.workload(n) or wpb.Workload(name="x")).authorization_policies for n in ("web-1", "db-1"))
    )
    assert xds.authorization(key) is None


async def test_a_peer_authentication_sends_the_static_strict_policy_and_lists_it(
    kube: KubeClient, namespace: str, xds: DeltaClient
) -> None:
    await make_pod(kube, namespace, "app-1", "198.18.220.10", {"app": "a"})
    await eventually(lambda: xds.workload("app-1"))
    strict = {
        "apiVersion": "security.istio.io/v1",
        "kind": "PeerAuthentication",
        "metadata": {"name": "strict", "namespace": namespace},
        "spec": {"mtls": {"mode": "STRICT"}},
    }
    await kube.create(kinds.PEER_AUTHENTICATIONS, strict)
    static = "istio-system/istio_converted_static_strict"
    await eventually(lambda: list((xds.workload("app-1") or wpb.Workload()).authorization_policies) == [static])
    assert xds.authorization(static) is not None
    await kube.delete(kinds.PEER_AUTHENTICATIONS, "strict", namespace)
    await eventually(lambda: not (xds.workload("app-1") or wpb.Workload(name="x")).authorization_policies)


def ztunnel_condition(obj: Obj) -> Obj | None:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "ZtunnelAccepted"), None)


async def test_status_is_written_once_and_follows_the_policy(
    kube: KubeClient, namespace: str, plane: ControlPlane
) -> None:
    await kube.create(kinds.AUTHORIZATION_POLICIES, policy("allow-a", namespace, rules=[{}]))

    async def accepted() -> Obj | None:
        obj = await kube.get(kinds.AUTHORIZATION_POLICIES, "allow-a", namespace)
        return obj if ztunnel_condition(obj) else None

    obj = await eventually(accepted)
    condition = ztunnel_condition(obj)
    assert condition is not None
    assert (condition["status"], condition["reason"], condition["message"]) == (
        "True",
        "Accepted",
        "attached to ztunnel",
    )
    assert condition["observedGeneration"] == obj["metadata"]["generation"] and condition["lastTransitionTime"]

    # Another translation (a second policy) does not rewrite the first: its resourceVersion stays.
    version = obj["metadata"]["resourceVersion"]
    await kube.create(kinds.AUTHORIZATION_POLICIES, policy("allow-b", namespace, rules=[{}]))

    async def b_accepted() -> bool:
        return ztunnel_condition(await kube.get(kinds.AUTHORIZATION_POLICIES, "allow-b", namespace)) is not None

    await eventually(b_accepted)
    await asyncio.sleep(0.5)
    assert (await kube.get(kinds.AUTHORIZATION_POLICIES, "allow-a", namespace))["metadata"][
        "resourceVersion"
    ] == version

    # AUDIT: not sent, status False with istiod's message and the new generation.
    obj["spec"]["action"] = "AUDIT"
    obj.pop("status", None)
    updated = await kube.replace(kinds.AUTHORIZATION_POLICIES, obj)

    async def refused() -> Obj | None:
        current = ztunnel_condition(await kube.get(kinds.AUTHORIZATION_POLICIES, "allow-a", namespace))
        return current if current and current["status"] == "False" else None

    condition = await eventually(refused)
    assert condition["reason"] == "UnsupportedValue"
    assert condition["message"] == "ztunnel does not support the AUDIT action"
    assert condition["observedGeneration"] == updated["metadata"]["generation"] > obj["metadata"]["generation"]
    assert f"{namespace}/allow-a" not in plane.authorizations.current.by_name

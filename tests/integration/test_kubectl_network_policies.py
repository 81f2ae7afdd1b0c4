"""NetworkPolicies through the real kubectl against ``ambit apiserver``: discovery, apply with kube's defaults, the
``kubectl get netpol`` table, kube's field errors for bad policies, and who may read and write them (RBAC's view
and edit, and a node: the lab's policy agent reads policies, pods and namespaces with the node's identity).

The node's full ``kubectl auth can-i --list`` is compared with ``tests/security/golden/can-i/node.txt``;
``AMBIT_UPDATE_GOLDEN=1 pytest ...`` rewrites it.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from tests.harness import ServerProcess

from ambit.apiserver.server import ApiServer
from ambit.k8s import KubeApiStatusError, KubeClient, kinds

pytestmark = pytest.mark.kubectl

NODE_GOLDEN = Path(__file__).resolve().parents[1] / "security" / "golden" / "can-i" / "node.txt"
AS_NODE = ("--as=system:node:node-1", "--as-group=system:nodes")
ONLY_HBONE = """
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: only-hbone, namespace: default}
spec:
  podSelector: {matchLabels: {app: httpbin}}
  policyTypes: [Ingress]
  ingress:
  - ports: [{protocol: TCP, port: 15008}]
"""
BAD = """
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: bad, namespace: default}
spec:
  podSelector: {}
  ingress:
  - ports: [{port: http, endPort: 90}, {port: 70000}, {protocol: ICMP}]
    from: [{}, {ipBlock: {cidr: 10.0.0.0/8, except: [11.0.0.0/8]}, podSelector: {}}]
  policyTypes: [Ingress, Sideways]
"""


def test_network_policies_are_discoverable_by_their_short_name(server_process: ServerProcess) -> None:
    rows = server_process.kubectl("api-resources", "--api-group=networking.k8s.io", "--no-headers").splitlines()
    assert [row.split() for row in rows] == [
        ["networkpolicies", "netpol", "networking.k8s.io/v1", "true", "NetworkPolicy"]
    ]


def test_apply_fills_in_kube_defaults_and_get_prints_the_pod_selector(server_process: ServerProcess) -> None:
    server_process.kubectl("apply", "-f", "-", input=ONLY_HBONE)
    server_process.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": {"name": "egress", "namespace": "default"},
                "spec": {"egress": [{"ports": [{"port": 53}]}]},
            }
        ),
    )
    stored = server_process.kubectl_json("get", "netpol", "only-hbone")
    assert stored["spec"] == {
        "podSelector": {"matchLabels": {"app": "httpbin"}},
        "policyTypes": ["Ingress"],
        "ingress": [{"ports": [{"protocol": "TCP", "port": 15008}]}],
    }
    egress = server_process.kubectl_json("get", "networkpolicy", "egress")["spec"]
    assert (egress["podSelector"], egress["policyTypes"]) == ({}, ["Ingress", "Egress"])
    assert egress["egress"] == [{"ports": [{"port": 53, "protocol": "TCP"}]}]
    table = [row.split() for row in server_process.kubectl("get", "netpol").splitlines()]
    assert table[0] == ["NAME", "POD-SELECTOR", "AGE"]
    assert [row[:2] for row in table[1:]] == [["egress", "<none>"], ["only-hbone", "app=httpbin"]]


def test_a_bad_policy_is_refused_with_kubes_field_errors(server_process: ServerProcess) -> None:
    out = server_process.kubectl("apply", "-f", "-", input=BAD, check=False)
    assert 'The NetworkPolicy "bad" is invalid' in out, out
    for cause in (
        "spec.ingress[0].ports[0].endPort: Invalid value: 90: may not be specified when `port` is non-numeric",
        "spec.ingress[0].ports[1].port: Invalid value: 70000: must be between 1 and 65535, inclusive",
        'spec.ingress[0].ports[2].protocol: Unsupported value: "ICMP"',
        "spec.ingress[0].from[0]: Required value: must specify a peer",
        'spec.ingress[0].from[1].ipBlock.except[0]: Invalid value: "11.0.0.0/8": must be a strict subset of `cidr`',
        "spec.ingress[0].from[1]: Forbidden: may not specify both ipBlock and another peer",
        'spec.policyTypes[1]: Unsupported value: "Sideways"',
    ):
        assert cause in out, (cause, out)


def test_view_reads_edit_writes_and_a_node_only_lists_and_watches(server_process: ServerProcess) -> None:
    def can_i(*args: str) -> str:
        return server_process.kubectl("auth", "can-i", *args, check=False).strip().splitlines()[0]

    server_process.kubectl("create", "namespace", "np", check=False)
    for role in ("view", "edit"):
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": role, "namespace": "np"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": f"{role}-user"}],
        }
        server_process.kubectl("apply", "-f", "-", input=json.dumps(binding))
    assert can_i("list", "networkpolicies", "-n", "np", "--as=view-user") == "yes"
    assert can_i("create", "networkpolicies", "-n", "np", "--as=view-user").startswith("no")
    assert can_i("delete", "networkpolicies", "-n", "np", "--as=edit-user") == "yes"
    assert can_i("list", "networkpolicies.networking.k8s.io", "-A", *AS_NODE) == "yes"
    assert can_i("watch", "networkpolicies.networking.k8s.io", "-A", *AS_NODE) == "yes"
    assert can_i("create", "networkpolicies.networking.k8s.io", "-n", "np", *AS_NODE).startswith("no")
    assert can_i("list", "namespaces", *AS_NODE) == "yes"


def test_a_nodes_rules_match_the_golden_file(server_process: ServerProcess) -> None:
    out = server_process.kubectl("auth", "can-i", "--list", "-n", "default", *AS_NODE)
    if os.environ.get("AMBIT_UPDATE_GOLDEN"):
        NODE_GOLDEN.write_text(out)
    assert out == NODE_GOLDEN.read_text(), f"{NODE_GOLDEN} differs (AMBIT_UPDATE_GOLDEN=1 rewrites it)"
    [line] = [row for row in out.splitlines() if row.split()[:1] == ["networkpolicies.networking.k8s.io"]]
    assert line.split()[-2:] == ["[list", "watch]"], line


@pytest.fixture
async def kube(apiserver: ApiServer) -> AsyncIterator[KubeClient]:
    async with KubeClient.from_kubeconfig(apiserver.kubeconfig) as client:
        yield client


def _policy(name: str, spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default"}, "spec": spec}


async def test_hostile_policies_get_a_422_and_defaults_hold_on_update(kube: KubeClient) -> None:
    for spec in (
        "nonsense",
        {"podSelector": {"matchLabels": {"a": "b c"}}},
        {"ingress": "everything"},
        {"ingress": [{"from": [{"ipBlock": {"cidr": "x" * 5000}}]}]},
        {"policyTypes": ["Ingress", "Egress", "Ingress"]},
    ):
        with pytest.raises(KubeApiStatusError) as caught:
            await kube.create(kinds.NETWORK_POLICIES, _policy("hostile", spec))
        assert caught.value.status_code == 422, caught.value.message
    created = await kube.create(kinds.NETWORK_POLICIES, _policy("p", {"ingress": [{"ports": [{"port": 80}]}]}))
    assert created["spec"]["policyTypes"] == ["Ingress"]
    patched = await kube.patch(
        kinds.NETWORK_POLICIES, "p", {"spec": {"egress": [{"ports": [{"port": 53, "protocol": "UDP"}]}]}}, "default"
    )
    # an explicit (stored) policyTypes is kept on update, as in kube
    assert patched["spec"]["policyTypes"] == ["Ingress"]
    assert patched["spec"]["egress"] == [{"ports": [{"port": 53, "protocol": "UDP"}]}]

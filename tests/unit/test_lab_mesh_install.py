"""What the lab adds to deploy/overlays/lab when it installs the mesh: Istio's cacerts Secret from the lab's root,
and the node agent told where its node sees the run directory."""

from __future__ import annotations

import base64
from pathlib import Path

from ambit.k8s import kinds
from ambit.lab.mesh.install import cacerts_secret, lab_plan
from ambit.lab.network.topology import Topology


def test_the_cacerts_secret_holds_istio_s_four_files() -> None:
    secret = cacerts_secret(b"CERT", b"KEY")
    assert secret["metadata"] == {"name": "cacerts", "namespace": "istio-system"}
    decoded = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    assert decoded == {
        "ca-cert.pem": b"CERT",
        "ca-key.pem": b"KEY",
        "root-cert.pem": b"CERT",
        "cert-chain.pem": b"CERT",
    }


def test_only_the_node_agent_changes_and_it_learns_its_node_s_run_directory(tmp_path: Path) -> None:
    topology = Topology.new(2, tmp_path / "lab")
    plan = lab_plan(topology)
    (agent,) = [m for m in plan if m.kind == kinds.DAEMON_SETS and m.name == "istio-cni-node"]
    args = agent.obj["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[-1] == f"--host-run-dir={topology.path}/nodes/$(NODE_NAME)/root/var/run/istio-cni"
    others = [m for m in plan if m is not agent]
    assert all("--host-run-dir" not in str(m.obj) for m in others)
    assert {m.kind.kind for m in plan} >= {"Deployment", "DaemonSet", "Service", "ValidatingWebhookConfiguration"}

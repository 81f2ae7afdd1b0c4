"""Certificate revocation end to end on the installed mesh (Istio's TestZtunnelCrlOutbound/Inbound, ztunnel's
crl_*_terminates_existing_connection_on_revocation), on the shared 2-node lab.

The lab's mesh root is Istio's plug-in CA (Secret ``istio-system/cacerts``, mounted by the control plane at
``/etc/cacerts``). The test adds ``ca-crl.pem`` to that Secret, a CRL signed by the root that revokes the server
pod's workload certificate, and follows it the whole way: the kubelet updates the control plane's Secret volume,
the control plane publishes ConfigMap ``istio-ca-crl`` in every namespace, the kubelet updates each node proxy's
optional ConfigMap volume (``CRL_PATH``), and the client's node proxy closes the established HBONE connection to the
server and refuses new ones (``istio_crl_policy_rejections_total{reporter="source"}``). An empty ``ca-crl.pem``
withdraws the revocation again, leaving the shared lab as it was found.

The lab's plug-in CA is the root itself (it signs workload certificates directly), so the certificate revoked is a
leaf; a revoked plug-in intermediate is covered by tests/integration/test_hbone_crl.py on real TLS.
"""

from __future__ import annotations

import base64
import datetime
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from tests.e2e.lab_driver import TEST_TIMEOUT, Lab, module_on_shared_lab, pod_manifest, sleeper, wait_until

from ambit.identity.localca import ROOT_COMMON_NAME, ROOT_NAME
from ambit.tls.certs import KeyPair, load_or_create_ca

pytestmark = [pytest.mark.root, pytest.mark.kubectl, pytest.mark.timeout(TEST_TIMEOUT)]
SHARES_THE_MESH_LAB = True

NS = "crl-amb"
PROPAGATION = 90.0
"""Secret volume resync, the control plane's look at the file, ConfigMap volume resync, the proxy's look: each a
few seconds in the lab, with room for a loaded machine."""

HOLD = """
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)
s.settimeout(3)
s.sendall(b"ping"); assert s.recv(4) == b"ping"
print("ready", flush=True)
deadline = time.time() + float(sys.argv[3])
while time.time() < deadline:
    try:
        s.sendall(b"x")
        if s.recv(1) != b"x":
            break
    except OSError:
        break
    time.sleep(0.1)
else:
    print("still open", flush=True)
    sys.exit()
print("closed", time.time(), flush=True)
"""

PROBE = """
import socket, sys
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)
    s.settimeout(3)
    s.sendall(b"ping")
    print("ok" if s.recv(4) == b"ping" else "refused")
except OSError:
    print("refused")
"""


@dataclass
class Crl:
    lab: Lab
    server_ip: str
    root: KeyPair

    def probe(self) -> str:
        return self.lab.exec("cli", NS, "python3", "-c", PROBE, self.server_ip, "9000", timeout=20).strip()

    def set_crl(self, pem: bytes) -> None:
        patch = {"data": {"ca-crl.pem": base64.b64encode(pem).decode()}}
        self.lab.kubectl("patch", "secret", "cacerts", "-n", "istio-system", "--type=merge", "-p", json.dumps(patch))

    def crl_map(self) -> str | None:
        found = self.lab.kubectl("get", "configmap", "istio-ca-crl", "-n", NS, "-o", "json", check=False)
        if found.returncode != 0:
            return None
        value = (json.loads(found.stdout).get("data") or {}).get("ca-crl.pem")
        return value if isinstance(value, str) else None

    def node_proxy_crl(self, node: str) -> dict[str, Any]:
        dump = json.loads(self.lab.node_proxy_admin(node, "/config_dump"))
        crl = dump.get("crl") or {}
        assert isinstance(crl, dict)
        return crl

    def rejections(self, node: str) -> float:
        text = self.lab.node_proxy_metrics(node)
        found = re.search(r'^istio_crl_policy_rejections_total\{reporter="source"\} (\S+)$', text, re.MULTILINE)
        return float(found.group(1)) if found else 0.0


def revoking(root: KeyPair, serials: list[int]) -> bytes:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(root.certificate.subject)
        .last_update(now - datetime.timedelta(minutes=1))
        .next_update(now + datetime.timedelta(days=1))
    )
    for serial in serials:
        entry = x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(now).build()
        builder = builder.add_revoked_certificate(entry)
    return builder.sign(root.private_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


@pytest.fixture(scope="module")
def crl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Crl]:
    with module_on_shared_lab(tmp_path_factory) as lab:
        n1, n2 = (node.name for node in lab.topology.all_nodes())
        lab.namespace(NS)
        lab.kubectl("label", "namespace", NS, "istio.io/dataplane-mode=ambient")
        server = {"name": "echo", "image": "none", "command": ["python3", "-m", "ambit.lab.apps", "tcp-echo"]}
        server["command"] += ["--port", "9000"]
        lab.apply(
            pod_manifest("srv", [server], node=n2, labels={"app": "srv"}),
            pod_manifest("cli", [sleeper()], node=n1, labels={"app": "cli"}),
            namespace=NS,
        )
        lab.wait_pods_ready(NS, "", 2, timeout=60)
        server_ip = lab.pod("srv", NS)["status"]["podIP"]
        root = load_or_create_ca(lab.topology.mesh_ca_dir, ROOT_NAME, ROOT_COMMON_NAME, time.time())
        state = Crl(lab, server_ip, root)
        wait_until("cli reaches srv through the mesh", lambda: state.probe() == "ok", timeout=60)
        try:
            yield state
        finally:
            state.set_crl(b"")  # withdraw: the shared lab goes on without revocations
            wait_until("the empty CRL published", lambda: state.crl_map() == "", timeout=PROPAGATION)
            wait_until("cli reaches srv again", lambda: state.probe() == "ok", timeout=PROPAGATION)
        assert lab.log_tracebacks() == []


def test_a_revoked_server_certificate_closes_the_open_connection_and_refuses_new_ones(crl: Crl) -> None:
    lab = crl.lab
    n1, n2 = (node.name for node in lab.topology.all_nodes())
    identity = f"spiffe://cluster.local/ns/{NS}/sa/default"
    certificates = json.loads(lab.node_proxy_admin(n2, "/config_dump"))["certificates"]
    (entry,) = [c for c in certificates if c["identity"] == identity]
    serial = int(entry["certChain"][0]["serialNumber"], 16)
    before = crl.rejections(n1)

    argv = [sys.executable, "-m", "ambit.cli", "lab", "exec", "--dir", str(lab.directory), "cli", "-n", NS, "--"]
    holder = subprocess.Popen(
        [*argv, "python3", "-c", HOLD, crl.server_ip, "9000", str(PROPAGATION + 30)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "ready"
        pem = revoking(crl.root, [serial])
        crl.set_crl(pem)
        wait_until("ConfigMap istio-ca-crl published", lambda: crl.crl_map() == pem.decode(), timeout=PROPAGATION)
        out, _ = holder.communicate(timeout=PROPAGATION + 60)
        closed = [line for line in out.splitlines() if line.startswith("closed")]
        assert closed, f"the connection to the revoked server stayed open: {out}"
    finally:
        holder.kill()
        holder.wait()
    dump = crl.node_proxy_crl(n1)
    assert dump["path"] == "/var/run/secrets/istio/crl/ca-crl.pem" and dump["error"] == "", dump
    (listed,) = dump["crls"]
    assert listed["revokedCertificates"] == 1 and listed["status"] == "verified", listed
    assert crl.probe() == "refused"
    assert crl.rejections(n1) >= before + 2  # the open connection, then the new one

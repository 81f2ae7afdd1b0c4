"""A new plug-in intermediate while the mesh runs (Istio's TestIntermediateCertificateRefresh), on the shared 2-node
lab.

The lab's mesh root is Istio's plug-in CA (Secret ``istio-system/cacerts``, mounted by the control plane at
``/etc/cacerts``; the root signs workload certificates itself). The test puts an intermediate signed by that root
into the Secret, as upstream's ``CreateCustomCASecret`` does, and follows it: the kubelet updates the control
plane's Secret volume, the control plane takes the new set (a ``CaReloaded`` Event), and the server's node proxy
holds, at its next refresh (half of the lab's 2-minute ``SECRET_TTL``), a certificate whose chain's second element
is the new intermediate and whose leaf names it as authority (upstream's two checks). A connection opened before the
rotation stays up throughout, and new connections work after it. The Secret is put back as it was found; the
certificates issued meanwhile chain to the same root, so the shared lab goes on as before.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from cryptography import x509
from tests import crl_pki
from tests.cacerts import cacerts_files, first_cert
from tests.e2e.lab_driver import TEST_TIMEOUT, Lab, module_on_shared_lab, pod_manifest, sleeper, wait_until

from ambit.identity.localca import ROOT_COMMON_NAME, ROOT_NAME
from ambit.tls.certs import KeyPair, load_or_create_ca

pytestmark = [pytest.mark.root, pytest.mark.kubectl, pytest.mark.timeout(TEST_TIMEOUT)]
SHARES_THE_MESH_LAB = True

NS = "carot-amb"
IDENTITY = f"spiffe://cluster.local/ns/{NS}/sa/default"
REFRESH = 180.0
"""Secret volume sync and the control plane's two looks (seconds), then the node proxy's refresh at half of the
lab's 2-minute certificates (60 s), with room for a loaded machine."""
RELOAD = 90.0

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

HOLD = """
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)
s.settimeout(3)
s.sendall(b"ping"); assert s.recv(4) == b"ping"
print("ready", flush=True)
for line in sys.stdin:
    try:
        s.sendall(b"x")
        assert s.recv(1) == b"x"
    except (OSError, AssertionError) as exc:
        print("closed", exc, flush=True)
        break
    print("open", flush=True)
"""


@dataclass
class Rotation:
    lab: Lab
    server_ip: str
    root: KeyPair
    original: dict[str, str]

    def probe(self) -> str:
        return self.lab.exec("cli", NS, "python3", "-c", PROBE, self.server_ip, "9000", timeout=20).strip()

    def set_cacerts(self, data: dict[str, str]) -> None:
        patch = json.dumps({"data": data})
        self.lab.kubectl("patch", "secret", "cacerts", "-n", "istio-system", "--type=merge", "-p", patch)

    def server_certificate(self) -> dict[str, Any] | None:
        node = self.lab.pod("srv", NS)["spec"]["nodeName"]
        dump = json.loads(self.lab.node_proxy_admin(node, "/config_dump"))
        found = [c for c in dump["certificates"] if c["identity"] == IDENTITY and c["certChain"]]
        return found[0] if found else None

    def reloads(self) -> int:
        events = self.lab.items("events.v1.events.k8s.io", "-n", "istio-system")
        # Repeats of one note fold into a series (ambit.k8s.events): count occurrences, not Events.
        return sum(int((e.get("series") or {}).get("count", 1)) for e in events if e.get("reason") == "CaReloaded")


def _encoded(files: dict[str, bytes]) -> dict[str, str]:
    return {name: base64.b64encode(value).decode() for name, value in files.items()}


@pytest.fixture(scope="module")
def rotation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rotation]:
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
        secret = json.loads(lab.kubectl("get", "secret", "cacerts", "-n", "istio-system", "-o", "json").stdout)
        state = Rotation(lab, server_ip, root, dict(secret["data"]))
        wait_until("cli reaches srv through the mesh", lambda: state.probe() == "ok", timeout=60)
        try:
            yield state
        finally:
            before = state.reloads()
            state.set_cacerts(state.original)  # the root signs again, as the shared lab was found
            wait_until("the lab's own CA taken back", lambda: state.reloads() > before, timeout=RELOAD)
            wait_until("cli reaches srv", lambda: state.probe() == "ok", timeout=60)
        assert lab.log_tracebacks() == []


def test_new_workload_certificates_chain_to_the_new_intermediate_and_traffic_keeps_working(
    rotation: Rotation,
) -> None:
    lab = rotation.lab
    original = wait_until("the server's certificate", rotation.server_certificate, timeout=60)
    intermediate = crl_pki.intermediate(rotation.root, "Lab intermediate 2", now=time.time())
    new = x509.load_pem_x509_certificate(first_cert(intermediate.cert_pem))

    argv = [sys.executable, "-m", "ambit.cli", "lab", "exec", "--dir", str(lab.directory), "cli", "-n", NS, "--"]
    holder = subprocess.Popen(
        [*argv, "python3", "-c", HOLD, rotation.server_ip, "9000"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdin is not None and holder.stdout is not None
        assert holder.stdout.readline().strip() == "ready"
        reloads = rotation.reloads()
        started = time.monotonic()
        rotation.set_cacerts(_encoded(cacerts_files(intermediate, rotation.root.cert_pem)))
        wait_until("the control plane takes the new intermediate", lambda: rotation.reloads() > reloads, RELOAD)
        taken = time.monotonic() - started

        def refreshed() -> dict[str, Any] | None:
            cert = rotation.server_certificate()
            if cert is None or cert["certChain"][0]["validFrom"] == original["certChain"][0]["validFrom"]:
                return None
            chain = cert["certChain"]
            return cert if len(chain) > 1 and int(chain[1]["serialNumber"], 16) == new.serial_number else None

        updated = wait_until(
            "the server's node proxy holds a certificate from the new intermediate", refreshed, REFRESH
        )
        refreshed_after = time.monotonic() - started
        print(f"the control plane took the Secret in {taken:.0f} s, the node proxy in {refreshed_after:.0f} s")
        leaf = x509.load_pem_x509_certificate(updated["certChain"][0]["pem"].encode())
        aki = leaf.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value.key_identifier
        ski = new.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest
        assert aki == ski, "the workload certificate does not name the new intermediate as its authority"

        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "open", "the connection opened before the rotation broke"
        assert rotation.probe() == "ok"  # a new connection, with the new certificates on both ends
    finally:
        holder.kill()
        holder.communicate(timeout=10)  # reaps it and closes its pipes

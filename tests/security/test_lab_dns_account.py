"""Cluster DNS's service account (``kube-system/kube-dns``, ``deploy/lab-dns``) can list and watch Services,
EndpointSlices and kube-system's ConfigMaps, and nothing else: no Secrets, no Pods, no writes.

The golden file is ``golden/can-i/kube-dns.txt``; ``AMBIT_UPDATE_GOLDEN=1 pytest ...`` rewrites it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tests.harness import ServerProcess

pytestmark = pytest.mark.kubectl

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden" / "can-i" / "kube-dns.txt"
AS = "--as=system:serviceaccount:kube-system:kube-dns"


@pytest.fixture(scope="module")
def dns_server(server_process: ServerProcess) -> ServerProcess:
    server_process.kubectl("create", "namespace", "kube-system", check=False)
    for name in ("serviceaccount.yaml", "rbac.yaml"):
        server_process.kubectl("apply", "-f", str(ROOT / "deploy" / "lab-dns" / name))
    return server_process


def test_the_kube_dns_account_holds_the_rules_of_its_golden_file(dns_server: ServerProcess) -> None:
    out = dns_server.kubectl("auth", "can-i", "--list", "-n", "kube-system", AS)
    if os.environ.get("AMBIT_UPDATE_GOLDEN"):
        GOLDEN.write_text(out)
    assert out == GOLDEN.read_text(), f"{GOLDEN} differs (AMBIT_UPDATE_GOLDEN=1 rewrites it)"


@pytest.mark.parametrize(
    ("verb", "resource", "namespace", "allowed"),
    [
        ("watch", "services", "default", True),
        ("list", "endpointslices.discovery.k8s.io", "apps", True),
        ("watch", "configmaps", "kube-system", True),
        ("list", "configmaps", "default", False),
        ("get", "secrets", "kube-system", False),
        ("list", "pods", "default", False),
        ("create", "services", "default", False),
        ("update", "endpointslices.discovery.k8s.io", "default", False),
        ("delete", "configmaps", "kube-system", False),
    ],
)
def test_the_kube_dns_account_may_only_read_what_it_answers_from(
    dns_server: ServerProcess, verb: str, resource: str, namespace: str, allowed: bool
) -> None:
    out = dns_server.kubectl("auth", "can-i", verb, resource, "-n", namespace, AS, check=False).strip()
    assert out == ("yes" if allowed else "no"), f"{verb} {resource} in {namespace}: {out}"

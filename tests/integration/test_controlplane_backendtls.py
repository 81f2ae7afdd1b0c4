"""BackendTLSPolicy status through the real control plane and the embedded API server: ``status.ancestors`` as
istiod writes them (mesh ancestor per target, Gateway ancestors from routes), a CA ConfigMap that goes missing
flips them to ``NoValidCACertificate``, another controller's ancestor is kept, a conflict is reported.

A real API server (subprocess, the CRDs installed) and the real control plane (tests/integration/controlplane_rig.py).
"""

from __future__ import annotations

import secrets
from typing import Any

from tests.integration.controlplane_rig import eventually

from ambit.controlplane.process import ControlPlane
from ambit.k8s import KubeClient, kinds
from ambit.tls.certs import new_ca

Obj = dict[str, Any]
CA_PEM = new_ca("backend-ca", now=1.7e9).cert_pem.decode()


def policy(ns: str, name: str, ca: str = "backend-ca") -> Obj:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "BackendTLSPolicy",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "targetRefs": [{"group": "", "kind": "Service", "name": "backend", "sectionName": "https"}],
            "validation": {
                "hostname": "backend.example",
                "caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": ca}],
            },
        },
    }


async def setup(kube: KubeClient) -> str:
    ns = f"btls-{secrets.token_hex(3)}"
    await kube.create(kinds.NAMESPACES, {"metadata": {"name": ns}})
    service = {"metadata": {"name": "backend", "namespace": ns}, "spec": {"ports": [{"name": "https", "port": 443}]}}
    await kube.create(kinds.SERVICES, service, ns)
    await kube.create(
        kinds.CONFIG_MAPS, {"metadata": {"name": "backend-ca", "namespace": ns}, "data": {"ca.crt": CA_PEM}}, ns
    )
    route = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "to-backend", "namespace": ns},
        "spec": {"parentRefs": [{"name": "edge"}], "rules": [{"backendRefs": [{"name": "backend", "port": 443}]}]},
    }
    await kube.create(kinds.HTTP_ROUTES, route, ns)
    return ns


def reasons(obj: Obj) -> list[tuple[str, str, list[tuple[str, str, str]]]]:
    """(ancestor name, controller, [(type, status, reason)]) of each ancestor."""
    return [
        (
            str(a["ancestorRef"]["name"]),
            str(a["controllerName"]),
            [(c["type"], c["status"], c["reason"]) for c in a.get("conditions") or ()],
        )
        for a in (obj.get("status") or {}).get("ancestors") or ()
    ]


async def test_ancestors_are_written_and_follow_the_ca_configmap(kube: KubeClient, plane: ControlPlane) -> None:
    ns = await setup(kube)
    await kube.create(kinds.BACKEND_TLS_POLICIES, policy(ns, "backend-tls"), ns)
    valid = [("Accepted", "True", "Accepted"), ("ResolvedRefs", "True", "ResolvedRefs")]

    async def written(expected: list[Any]) -> Obj | None:
        obj = await kube.get(kinds.BACKEND_TLS_POLICIES, "backend-tls", ns)
        return obj if reasons(obj) == expected else None

    obj = await eventually(
        lambda: written(
            [("backend", "istio.io/mesh-controller", valid), ("edge", "istio.io/gateway-controller", valid)]
        )
    )
    mesh = obj["status"]["ancestors"][0]
    assert mesh["ancestorRef"] == {"group": "", "kind": "Service", "name": "backend", "sectionName": "https"}
    assert mesh["conditions"][0]["observedGeneration"] == obj["metadata"]["generation"]

    # Another controller's ancestor is kept in its place across our rewrites.
    theirs = {"ancestorRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "theirs"},
              "controllerName": "example.com/other", "conditions": []}  # fmt: skip
    await kube.patch_status(
        kinds.BACKEND_TLS_POLICIES,
        "backend-tls",
        {"status": {"ancestors": [theirs, *obj["status"]["ancestors"]]}},
        ns,
    )
    await kube.delete(kinds.CONFIG_MAPS, "backend-ca", ns)
    broken = [("Accepted", "False", "NoValidCACertificate"), ("ResolvedRefs", "False", "InvalidCACertificateRef")]
    obj = await eventually(
        lambda: written(
            [
                ("theirs", "example.com/other", []),
                ("backend", "istio.io/mesh-controller", broken),
                ("edge", "istio.io/gateway-controller", broken),
            ]
        )
    )


async def test_a_younger_policy_on_the_same_target_is_conflicted(kube: KubeClient, plane: ControlPlane) -> None:
    ns = await setup(kube)
    await kube.create(kinds.BACKEND_TLS_POLICIES, policy(ns, "a-first"), ns)
    await eventually(lambda: _accepted(kube, ns, "a-first"))
    await kube.create(kinds.BACKEND_TLS_POLICIES, policy(ns, "b-second"), ns)
    conflicted = await eventually(lambda: _accepted(kube, ns, "b-second"))
    assert conflicted["status"] == "False" and conflicted["reason"] == "Conflicted"
    assert "a-first" in conflicted["message"]
    first = await _accepted(kube, ns, "a-first")
    assert first is not None and first["status"] == "True"


async def _accepted(kube: KubeClient, ns: str, name: str) -> Obj | None:
    obj = await kube.get(kinds.BACKEND_TLS_POLICIES, name, ns)
    ancestors = (obj.get("status") or {}).get("ancestors") or []
    return dict(ancestors[0]["conditions"][0]) if ancestors else None

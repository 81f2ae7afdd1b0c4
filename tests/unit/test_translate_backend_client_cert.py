"""The Gateway's backend client certificate in the control plane: which Secret resolves
(:mod:`ambit.controlplane.translate.listeners` rules 6-7, the same judgement as the Gateway's ``ResolvedRefs``) and
which destination policies of the gateway present it (:mod:`ambit.controlplane.translate.backendtls` rule 9)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from tests.ingress_pki import client_cert, opaque_secret

from ambit.controlplane.translate.backendtls import with_gateway_client_certificate
from ambit.controlplane.translate.listeners import backend_client_certificate, resolve_backend_client_certificate
from ambit.controlplane.translate.reference_grants import ReferenceGrants
from ambit.model.destination_policy import ClientTls, DestinationPolicy, PortTrafficPolicy, TlsMode, TrafficPolicy
from ambit.tls.certs import new_ca
from ambit.tls.credentials import TlsCredential

CA = new_ca("backend client unit CA", now=time.time())
PAIR = client_cert(CA, "edge-gateway")
CREDENTIAL = TlsCredential(PAIR.cert_pem, PAIR.key_pem)
SIMPLE = ClientTls(TlsMode.SIMPLE, sni="mutual.example.com", ca_certificates="CA")
SECRETS = {
    ("edge", "edge-client"): opaque_secret(
        "edge-client", "edge", "kubernetes.io/tls", tls_crt=PAIR.cert_pem, tls_key=PAIR.key_pem
    ),
    ("other", "elsewhere"): opaque_secret(
        "elsewhere", "other", "kubernetes.io/tls", tls_crt=PAIR.cert_pem, tls_key=PAIR.key_pem
    ),
    ("edge", "not-tls"): opaque_secret("not-tls", "edge", "Opaque", ca_crt=CA.cert_pem),
}
GRANT = {
    "metadata": {"name": "let-edge", "namespace": "other"},
    "spec": {
        "from": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": "edge"}],
        "to": [{"group": "", "kind": "Secret"}],
    },
}


def gateway(ref: dict[str, Any] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"gatewayClassName": "istio", "listeners": []}
    if ref is not None:
        spec["tls"] = {"backend": {"clientCertificateRef": ref}}
    return {"metadata": {"name": "edge", "namespace": "edge"}, "spec": spec}


@pytest.mark.parametrize(
    ("ref", "grants", "resolves", "reason"),
    [
        (None, (), False, "ResolvedRefs"),
        ({"name": "edge-client"}, (), True, "ResolvedRefs"),
        ({"name": "missing"}, (), False, "InvalidClientCertificateRef"),
        ({"name": "not-tls"}, (), False, "InvalidClientCertificateRef"),
        ({"name": "edge-client", "kind": "ConfigMap"}, (), False, "InvalidClientCertificateRef"),
        ({"name": "elsewhere", "namespace": "other"}, (), False, "RefNotPermitted"),
        ({"name": "elsewhere", "namespace": "other"}, (GRANT,), True, "ResolvedRefs"),
    ],
)
def test_the_certificate_is_presented_exactly_when_the_gateway_s_status_says_it_resolved(
    ref: dict[str, Any] | None, grants: tuple[dict[str, Any], ...], resolves: bool, reason: str
) -> None:
    built = ReferenceGrants.build(grants)
    status = backend_client_certificate(gateway(ref), lambda ns, name: SECRETS.get((ns, name)), built)
    found = resolve_backend_client_certificate(gateway(ref), lambda ns, name: SECRETS.get((ns, name)), built)
    assert status[1] == reason
    assert (found is not None) == resolves
    if found is not None:
        assert found.cert_pem == PAIR.cert_pem and found.key_pem == PAIR.key_pem


def test_only_the_simple_tls_of_rules_a_backend_tls_policy_generated_becomes_mutual() -> None:
    generated = DestinationPolicy(
        "app/mutual.app.svc.cluster.local",
        "app/mutual~gateway",
        TrafficPolicy(tls=SIMPLE, port_level=(PortTrafficPolicy(443, tls=SIMPLE),)),
    )
    merged = DestinationPolicy(
        "app/other.app.svc.cluster.local", "app/other~gateway,app/users", TrafficPolicy(tls=SIMPLE)
    )
    users = DestinationPolicy("app/users.app.svc.cluster.local", "app/users", TrafficPolicy(tls=SIMPLE))
    mesh = DestinationPolicy(
        "app/mesh.app.svc.cluster.local", "app/mesh~gateway", TrafficPolicy(tls=ClientTls(TlsMode.ISTIO_MUTUAL))
    )
    bare = DestinationPolicy("app/bare.app.svc.cluster.local", "app/bare~gateway")
    out = with_gateway_client_certificate((generated, merged, users, mesh, bare), CREDENTIAL)
    chain, key = PAIR.cert_pem.decode(), PAIR.key_pem.decode()
    want = ClientTls(
        TlsMode.MUTUAL, sni="mutual.example.com", ca_certificates="CA", client_certificate=chain, private_key=key
    )
    assert out[0].traffic_policy is not None and out[0].traffic_policy.tls == want
    assert out[0].traffic_policy.port_level[0].tls == want
    assert out[1].traffic_policy is not None and out[1].traffic_policy.tls == want
    assert out[2:] == (users, mesh, bare)  # a user's own rule, mesh mTLS, no TLS: untouched
    assert with_gateway_client_certificate((generated,), None) == (generated,)

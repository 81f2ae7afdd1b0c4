"""Gateway API frontend TLS validation on an ingress Gateway of class ``istio`` (``spec.tls.frontend``, as istiod
converts it): the listener's client verification (MUTUAL for ``AllowValidOnly``, OPTIONAL_MUTUAL for
``AllowInsecureFallback`` or the ``gateway.istio.io/tls-terminate-mode`` option), per port or by default, the CA from
a ConfigMap or a Secret; a reference that is not usable leaves the listener unserved with istiod's reasons; the
Gateway's ``InsecureFrontendValidationMode`` condition."""

from __future__ import annotations

import time
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.ingress_pki import opaque_secret
from tests.unit.json_strategies import json_values

from ambit.controlplane.gateway.ingress_status import ingress_status
from ambit.controlplane.gateway.status import Deployed, plan_status
from ambit.controlplane.translate.ingress import translate_ingress
from ambit.controlplane.translate.listeners import frontend_config_maps, judge_listeners
from ambit.model.ingress import ListenerTls, TlsMode
from ambit.tls.certs import issue_server_cert, new_ca

NOW = time.time()
SERVER_CA = new_ca("edge server CA", now=NOW)
CLIENT_CA = new_ca("edge client CA", now=NOW)
PAIR = issue_server_cert(SERVER_CA, common_name="a.example", dns_names=["a.example"], ip_addresses=[], now=NOW)
SECRETS = {
    ("edge", "cert"): opaque_secret("cert", "edge", "kubernetes.io/tls", tls_crt=PAIR.cert_pem, tls_key=PAIR.key_pem),
    ("edge", "ca-secret"): opaque_secret("ca-secret", "edge", ca_crt=CLIENT_CA.cert_pem),
}
CONFIG_MAPS = {
    ("edge", "client-ca"): {
        "metadata": {"namespace": "edge", "name": "client-ca"},
        "data": {"ca.crt": CLIENT_CA.cert_pem.decode()},
    },
    ("edge", "empty"): {"metadata": {"namespace": "edge", "name": "empty"}, "data": {"ca.crt": "not a certificate"}},
}


def find_secret(namespace: str, name: str) -> dict[str, Any] | None:
    return SECRETS.get((namespace, name))


def find_config_map(namespace: str, name: str) -> dict[str, Any] | None:
    return CONFIG_MAPS.get((namespace, name))


def https(name: str, port: int, **options: str) -> dict[str, Any]:
    tls: dict[str, Any] = {"certificateRefs": [{"name": "cert"}]}
    if options:
        tls["options"] = options
    return {"name": name, "port": port, "protocol": "HTTPS", "hostname": f"{name}.example", "tls": tls}


def validation(kind: str = "ConfigMap", name: str = "client-ca", mode: str = "", **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"caCertificateRefs": [{"group": "", "kind": kind, "name": name, **extra}]}
    if mode:
        out["mode"] = mode
    return {"validation": out}


def gateway(
    listeners: list[dict[str, Any]], default: dict[str, Any] | None, **per_port: dict[str, Any]
) -> dict[str, Any]:
    frontend: dict[str, Any] = {}
    if default is not None:
        frontend["default"] = default
    if per_port:
        frontend["perPort"] = [{"port": int(port[1:]), "tls": tls} for port, tls in per_port.items()]
    return {
        "metadata": {"namespace": "edge", "name": "edge"},
        "spec": {"gatewayClassName": "istio", "tls": {"frontend": frontend}, "listeners": listeners},
    }


def judged(gw: dict[str, Any]) -> dict[str, Any]:
    return {j.name: j for j in judge_listeners(gw, find_secret, find_config_map)}


def test_the_default_validation_makes_https_listeners_mutual_and_a_port_entry_overrides_it() -> None:
    gw = gateway(
        [
            https("a", 443),
            https("b", 8443),
            https("c", 9443, **{"gateway.istio.io/tls-terminate-mode": "OPTIONAL_MUTUAL"}),
        ],
        validation(),
        p8443=validation("Secret", "ca-secret", mode="AllowInsecureFallback"),
    )
    found = judged(gw)
    assert found["a"].client_tls == ListenerTls(TlsMode.MUTUAL, CLIENT_CA.cert_pem)
    assert found["b"].client_tls == ListenerTls(TlsMode.OPTIONAL_MUTUAL, CLIENT_CA.cert_pem)
    assert found["c"].client_tls == ListenerTls(TlsMode.OPTIONAL_MUTUAL, CLIENT_CA.cert_pem)  # the option wins
    assert all(j.ready for j in found.values())
    out = translate_ingress(
        gateways=[gw],
        http_routes=[],
        k8s_services=[],
        find_secret=find_secret,
        find_config_map=find_config_map,
        namespace_labels={},
    )
    tls = {listener.name: listener.tls.mode for listener in out.configs[0].listeners}
    assert tls == {"a": TlsMode.MUTUAL, "b": TlsMode.OPTIONAL_MUTUAL, "c": TlsMode.OPTIONAL_MUTUAL}
    assert frontend_config_maps(gw) == {("edge", "client-ca")}


def test_without_frontend_validation_a_listener_verifies_no_client() -> None:
    (only,) = judge_listeners(gateway([https("a", 443)], None), find_secret, find_config_map)
    assert only.client_tls == ListenerTls() and only.ready


def test_unusable_ca_references_leave_the_listener_unserved_with_istiod_s_reasons() -> None:
    cases = {
        "kind": (validation("Service", "some-service"), "InvalidCACertificateKind", "only secret and configmap"),
        "missing": (validation(name="does-not-exist"), "InvalidCACertificateRef", "configmap edge/does-not-exist not"),
        "no pem": (validation(name="empty"), "InvalidCACertificateRef", "holds no PEM certificate"),
        "other namespace": (validation(namespace="other"), "RefNotPermitted", "not accessible to a Gateway"),
        "two": (
            {"validation": {"caCertificateRefs": [{"kind": "ConfigMap", "name": "client-ca"}] * 2}},
            "InvalidCACertificateRef",
            "only one caCertificateRef",
        ),
    }
    for case, (frontend, reason, message) in cases.items():
        (listener,) = judge_listeners(gateway([https("a", 443)], frontend), find_secret, find_config_map)
        assert not listener.ready, case
        assert listener.accepted[:2] == (False, "NoValidCACertificate"), case
        assert listener.resolved[:2] == (False, reason) and message in listener.resolved[2], (case, listener.resolved)
        status = ingress_status(
            gateway([https("a", 443)], frontend), Deployed(service_exists=True), (listener,), host="h", addresses=()
        )
        conditions = {c["type"]: (c["status"], c["reason"]) for c in status["listeners"][0]["conditions"]}
        assert conditions["Programmed"] == ("False", "Invalid") and conditions["ResolvedRefs"] == ("False", reason)


def test_insecure_fallback_is_reported_on_the_gateway() -> None:
    def condition_types(gw: dict[str, Any]) -> list[str]:
        found = judge_listeners(gw, find_secret, find_config_map)
        status = ingress_status(gw, Deployed(service_exists=True), found, host="h", addresses=())
        return [c["type"] for c in status["conditions"]]

    assert "InsecureFrontendValidationMode" not in condition_types(gateway([https("a", 443)], validation()))
    insecure = gateway([https("a", 443)], validation(), p443=validation(mode="AllowInsecureFallback"))
    assert "InsecureFrontendValidationMode" in condition_types(insecure)


def test_the_insecure_condition_is_removed_once_no_port_falls_back() -> None:
    insecure = gateway([https("a", 443)], validation(mode="AllowInsecureFallback"))
    found = judge_listeners(insecure, find_secret, find_config_map)
    wanted = ingress_status(insecure, Deployed(service_exists=True), found, host="h", addresses=())
    patch = plan_status({"metadata": {"resourceVersion": "1"}}, wanted, "t1")
    assert patch is not None
    written = {**insecure, "status": patch["status"]}
    assert "InsecureFrontendValidationMode" in [c["type"] for c in written["status"]["conditions"]]
    strict = {**written, "spec": gateway([https("a", 443)], validation())["spec"]}
    wanted = ingress_status(strict, Deployed(service_exists=True), found, host="h", addresses=())
    patch = plan_status(strict, wanted, "t2")
    assert patch is not None
    assert "InsecureFrontendValidationMode" not in [c["type"] for c in patch["status"]["conditions"]]
    assert plan_status({**strict, "status": patch["status"]}, wanted, "t3") is None  # and then nothing to write


@settings(max_examples=150, deadline=None)
@given(
    frontend=json_values(),
    validation_value=st.fixed_dictionaries(
        {
            "caCertificateRefs": st.lists(
                st.fixed_dictionaries(
                    {
                        "group": st.sampled_from(["", "core", "x"]) | json_values(),
                        "kind": st.sampled_from(["ConfigMap", "Secret", "Service"]) | json_values(),
                        "name": st.sampled_from(["client-ca", "ca-secret", "empty", "cert", ""]) | json_values(),
                    }
                )
                | json_values(),
                max_size=2,
            )
            | json_values(),
            "mode": st.sampled_from(["AllowValidOnly", "AllowInsecureFallback"]) | json_values(),
        }
    ),
    options=st.dictionaries(st.sampled_from(["gateway.istio.io/tls-terminate-mode"]), json_values(), max_size=1),
)
def test_any_frontend_settings_give_a_judgement_and_never_raise(
    frontend: Any, validation_value: Any, options: dict[str, Any]
) -> None:
    listener = https("a", 443)
    listener["tls"]["options"] = options
    for tls in ({"frontend": frontend}, {"frontend": {"default": {"validation": validation_value}}}):
        gw = {"metadata": {"namespace": "edge", "name": "edge"}, "spec": {"tls": tls, "listeners": [listener]}}
        (judged_listener,) = judge_listeners(gw, find_secret, find_config_map)
        assert judged_listener.ready or judged_listener.accepted[1] == "NoValidCACertificate"
        frontend_config_maps(gw)
        ingress_status(gw, Deployed(service_exists=True), (judged_listener,), host="h", addresses=())

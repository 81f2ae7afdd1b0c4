"""Ingress Gateways (class ``istio``) in the gateway deployment controller's pure parts: what they render to, how
their listeners are judged (protocols, certificates from ``kubernetes.io/tls`` Secrets, conflicts), and their
status; plus the reading of TLS Secrets, with hostile input.
"""

from __future__ import annotations

import base64
import time
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.controlplane.gateway.apply import Refuse, plan_apply
from ambit.controlplane.gateway.ingress_status import ingress_addresses, ingress_status, load_balancer_addresses
from ambit.controlplane.gateway.render import Rendered, Unrenderable, WaypointTemplateSettings, render_waypoint
from ambit.controlplane.gateway.status import Deployed
from ambit.controlplane.translate.listeners import judge_listeners
from ambit.tls.certs import issue_server_cert, new_ca
from ambit.tls.credentials import CredentialProblem, TlsCredential, read_tls_secret, server_name_matches

LAB = WaypointTemplateSettings(xds_address="198.18.0.1:15012", image_pull_policy="Never")
NOW = time.time()
CA = new_ca("test ingress CA", now=NOW)
PAIR = issue_server_cert(
    CA, common_name="a.example.com", dns_names=["a.example.com", "*.b.example.com"], ip_addresses=[], now=NOW
)
OTHER = issue_server_cert(CA, common_name="c.example.com", dns_names=["c.example.com"], ip_addresses=[], now=NOW)


def tls_secret(
    name: str = "cert", namespace: str = "edge", cert: bytes = PAIR.cert_pem, key: bytes = PAIR.key_pem
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace},
        "type": "kubernetes.io/tls",
        "data": {"tls.crt": base64.b64encode(cert).decode(), "tls.key": base64.b64encode(key).decode()},
    }


def ingress(*listeners: dict[str, Any], name: str = "edge", namespace: str = "edge") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": "u-1", "generation": 2, "resourceVersion": "5"},
        "spec": {"gatewayClassName": "istio", "listeners": list(listeners)},
    }


HTTP = {"name": "http", "port": 8080, "protocol": "HTTP"}


def https(name: str = "https", port: int = 8443, hostname: str | None = None, *refs: str) -> dict[str, Any]:
    listener: dict[str, Any] = {
        "name": name,
        "port": port,
        "protocol": "HTTPS",
        "tls": {"mode": "Terminate", "certificateRefs": [{"name": r} for r in refs or ("cert",)]},
    }
    if hostname:
        listener["hostname"] = hostname
    return listener


def secrets_of(*items: dict[str, Any]) -> Any:
    table = {(s["metadata"]["namespace"], s["metadata"]["name"]): s for s in items}
    return lambda namespace, name: table.get((namespace, name))


# -- render ---------------------------------------------------------------------------------------------------
def test_an_ingress_gateway_renders_name_istio_objects_a_load_balancer_and_the_gateway_command() -> None:
    out = render_waypoint(ingress(HTTP, https()), LAB)
    assert isinstance(out, Rendered)
    for obj in out.objects():
        assert obj["metadata"]["name"] == "edge-istio"
        assert obj["metadata"]["labels"]["gateway.istio.io/managed"] == "istio.io-gateway-controller"
        assert obj["metadata"]["labels"]["gateway.networking.k8s.io/gateway-name"] == "edge"
        assert obj["metadata"]["ownerReferences"][0]["name"] == "edge"
    service = out.service["spec"]
    assert service["type"] == "LoadBalancer"
    assert [(p["name"], p["port"]) for p in service["ports"]] == [
        ("status-port", 15021),
        ("http", 8080),
        ("https", 8443),
    ]
    pod = out.deployment["spec"]["template"]
    assert pod["metadata"]["labels"]["istio.io/gateway-name"] == "edge"
    assert pod["metadata"]["labels"]["istio.io/dataplane-mode"] == "none"
    assert pod["spec"]["serviceAccountName"] == "edge-istio"
    assert pod["spec"]["automountServiceAccountToken"] is False
    container = pod["spec"]["containers"][0]
    assert container["args"][0] == "gateway"
    assert {"name": "GATEWAY_NAME", "value": "edge"} in container["env"]


def test_the_service_type_annotation_sets_the_service_type_and_the_gateway_labels_reach_the_pods() -> None:
    # TestSimpleHTTPSandwich's Gateway: a ClusterIP Service, and pods the node proxy captures.
    gw = ingress(HTTP)
    gw["metadata"]["labels"] = {"istio.io/dataplane-mode": "ambient", "team": "a"}
    gw["metadata"]["annotations"] = {"networking.istio.io/service-type": "ClusterIP"}
    out = render_waypoint(gw, LAB)
    assert isinstance(out, Rendered)
    assert out.service["spec"]["type"] == "ClusterIP"
    labels = out.deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["istio.io/dataplane-mode"] == "ambient" and labels["team"] == "a"
    assert labels["sidecar.istio.io/inject"] == "false"
    # The fixed labels still win over copied ones.
    gw["metadata"]["labels"]["gateway.istio.io/managed"] = "istio.io-mesh-controller"
    out = render_waypoint(gw, LAB)
    assert isinstance(out, Rendered)
    assert out.deployment["spec"]["template"]["metadata"]["labels"]["gateway.istio.io/managed"] == (
        "istio.io-gateway-controller"
    )


def test_a_waypoint_keeps_its_pods_out_of_capture_whatever_its_labels() -> None:
    gw = ingress({"name": "mesh", "port": 15008, "protocol": "HBONE"}, name="waypoint")
    gw["spec"]["gatewayClassName"] = "istio-waypoint"
    gw["metadata"]["labels"] = {"istio.io/dataplane-mode": "ambient"}
    gw["metadata"]["annotations"] = {"networking.istio.io/service-type": "NodePort"}
    out = render_waypoint(gw, LAB)
    assert isinstance(out, Rendered)
    assert out.deployment["spec"]["template"]["metadata"]["labels"]["istio.io/dataplane-mode"] == "none"
    assert out.service["spec"]["type"] == "NodePort"


def test_a_service_type_annotation_naming_no_type_is_unrenderable() -> None:
    for bad in ("ExternalName", "clusterip", "", 7):
        gw = ingress(HTTP)
        gw["metadata"]["annotations"] = {"networking.istio.io/service-type": bad}
        out = render_waypoint(gw, LAB)
        assert isinstance(out, Unrenderable)
        assert "networking.istio.io/service-type must be one of ClusterIP, NodePort, LoadBalancer" in out.message


def test_a_waypoint_still_renders_as_before() -> None:
    gw = ingress({"name": "mesh", "port": 15008, "protocol": "HBONE"}, name="waypoint")
    gw["spec"]["gatewayClassName"] = "istio-waypoint"
    out = render_waypoint(gw, LAB)
    assert isinstance(out, Rendered)
    assert out.service["metadata"]["name"] == "waypoint" and out.service["spec"]["type"] == "ClusterIP"
    assert out.deployment["spec"]["template"]["spec"]["containers"][0]["args"][:2] == ["waypoint", "proxy"]


def test_an_ingress_name_too_long_once_suffixed_is_unrenderable() -> None:
    out = render_waypoint(ingress(HTTP, name="a" * 60), LAB)
    assert isinstance(out, Unrenderable) and "gateway's Service" in out.message


def test_a_waypoint_s_objects_are_not_taken_over_by_an_ingress_gateway() -> None:
    out = render_waypoint(ingress(HTTP), LAB)
    assert isinstance(out, Rendered)
    theirs = {"metadata": {"name": "edge-istio", "labels": {"gateway.istio.io/managed": "istio.io-mesh-controller"}}}
    assert isinstance(plan_apply(out.deployment, theirs), Refuse)


# -- listeners ------------------------------------------------------------------------------------------------
def test_http_and_https_listeners_with_a_valid_tls_secret_are_ready() -> None:
    http, tls = judge_listeners(ingress(HTTP, https(hostname="A.example.com")), secrets_of(tls_secret()))
    assert http.ready and tls.ready
    assert tls.hostname == "a.example.com"
    (credential,) = tls.credentials
    assert credential.names == ("a.example.com", "*.b.example.com")


def test_a_missing_secret_is_an_invalid_certificate_ref() -> None:
    (tls,) = judge_listeners(ingress(https()), secrets_of())
    assert not tls.ready
    # istiod's message: the reference as written (group/kind/name.namespace), then what is wrong
    assert tls.resolved == (
        False,
        "InvalidCertificateRef",
        "invalid certificate reference //cert., secret edge/cert not found",
    )


def test_a_secret_of_another_type_or_with_a_foreign_key_is_an_invalid_certificate_ref() -> None:
    opaque = tls_secret() | {"type": "Opaque"}
    (tls,) = judge_listeners(ingress(https()), secrets_of(opaque))
    assert tls.resolved[:2] == (False, "InvalidCertificateRef") and "kubernetes.io/tls" in tls.resolved[2]
    mismatched = tls_secret(key=OTHER.key_pem)
    (tls,) = judge_listeners(ingress(https()), secrets_of(mismatched))
    assert "not the key" in tls.resolved[2]


def test_a_certificate_in_another_namespace_is_not_permitted() -> None:
    listener = https()
    listener["tls"]["certificateRefs"] = [{"name": "cert", "namespace": "other"}]
    (tls,) = judge_listeners(ingress(listener), secrets_of(tls_secret(namespace="other")))
    assert tls.resolved[:2] == (False, "RefNotPermitted") and not tls.ready


def test_https_without_certificates_and_https_passthrough_are_not_served_tls_and_tcp_are() -> None:
    bare = https()
    del bare["tls"]
    passthrough = https("pass", 9443)
    passthrough["tls"]["mode"] = "Passthrough"
    tcp = {"name": "tcp", "port": 9000, "protocol": "TCP"}
    tls = {"name": "tls", "port": 9444, "protocol": "TLS", "tls": {"mode": "Passthrough"}}
    tls_terminate = {"name": "tls-t", "port": 9445, "protocol": "TLS", "tls": https()["tls"]}
    bare_terminate = {"name": "tls-bare", "port": 9446, "protocol": "TLS"}  # the default mode: Terminate
    judged = judge_listeners(
        ingress(bare, passthrough, tcp, tls, tls_terminate, bare_terminate), secrets_of(tls_secret())
    )
    assert [j.ready for j in judged] == [False, False, True, True, True, False]
    assert judged[0].resolved[1] == "InvalidCertificateRef"
    assert judged[1].accepted[1] == "UnsupportedProtocol"
    assert judged[3].credentials == ()  # the backend terminates: no certificate needed
    assert len(judged[4].credentials) == 1 and judged[4].terminates_tls  # TLS Terminate: served as HTTPS's TLS
    assert judged[5].resolved[1] == "InvalidCertificateRef"  # terminating needs a certificate


def test_listeners_on_one_port_conflict_on_protocol_or_hostname() -> None:
    clash = {"name": "plain", "port": 8443, "protocol": "HTTP"}  # no hostname, as the HTTPS one: the later loses
    judged = judge_listeners(ingress(https(), clash), secrets_of(tls_secret()))
    assert [j.conflicted[1] for j in judged] == ["NoConflicts", "ProtocolConflict"]
    assert [j.ready for j in judged] == [True, False]
    judged = judge_listeners(
        ingress(https("a", 8443, "a.example.com"), https("b", 8443, "a.example.com")), secrets_of(tls_secret())
    )
    assert [j.conflicted[0] for j in judged] == [False, True]


# -- status ---------------------------------------------------------------------------------------------------
def _conditions(obj: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in obj["conditions"]}


def test_programmed_waits_for_the_load_balancer_address_and_then_reports_it() -> None:
    gw = ingress(HTTP, https())
    judged = judge_listeners(gw, secrets_of(tls_secret()))
    host = "edge-istio.edge.svc.cluster.local"
    pending = ingress_status(gw, Deployed(service_exists=True), judged, host=host, addresses=())
    assert _conditions(pending)["Programmed"] == ("False", "AddressNotAssigned")
    assert pending["addresses"] is None
    service = {"status": {"loadBalancer": {"ingress": [{"ip": "198.18.254.1"}]}}}
    addresses = load_balancer_addresses(service)
    done = ingress_status(
        gw, Deployed(service_exists=True), judged, host=host, addresses=addresses, attached={"http": 2}
    )
    assert _conditions(done)["Programmed"] == ("True", "Programmed")
    assert _conditions(done)["Accepted"] == ("True", "Accepted")
    assert done["addresses"] == [{"type": "IPAddress", "value": "198.18.254.1"}]
    assert [(item["name"], item["attachedRoutes"]) for item in done["listeners"]] == [("http", 2), ("https", 0)]


def test_several_ports_are_named_one_by_one_in_text_order_as_istiod_names_them() -> None:
    """istiod's goldens (frontend-tls-refgrant and others): "...:443 and ...:80"; Ambit wrote "...:8080,8443"."""
    host = "edge-istio.edge.svc.cluster.local"
    gw = ingress(HTTP | {"port": 80}, https(port=443))
    judged = judge_listeners(gw, secrets_of(tls_secret()))
    addresses = ({"type": "IPAddress", "value": "198.18.254.1"},)
    done = ingress_status(gw, Deployed(service_exists=True), judged, host=host, addresses=addresses)
    (programmed,) = [c for c in done["conditions"] if c["type"] == "Programmed"]
    assert programmed["message"] == f"Resource programmed, assigned to service(s) {host}:443 and {host}:80"
    pending = ingress_status(gw, Deployed(service_exists=True), judged, host=host, addresses=())
    (programmed,) = [c for c in pending["conditions"] if c["type"] == "Programmed"]
    assert programmed["message"].startswith(f"Assigned to service(s) {host}:443 and {host}:80, but failed")


def test_a_cluster_ip_gateway_reports_its_service_hostname_at_once_a_load_balancer_waits() -> None:
    host = "edge-istio.edge.svc.cluster.local"
    assert ingress_addresses(None, host) == ()
    assert ingress_addresses({"spec": {"type": "LoadBalancer"}}, host) == ()
    lb = {"spec": {"type": "LoadBalancer"}, "status": {"loadBalancer": {"ingress": [{"hostname": "lb.example"}]}}}
    assert ingress_addresses(lb, host) == ({"type": "Hostname", "value": "lb.example"},)
    for kind in ("ClusterIP", "NodePort"):
        assert ingress_addresses({"spec": {"type": kind}}, host) == ({"type": "Hostname", "value": host},)
    gw = ingress(HTTP)
    judged = judge_listeners(gw, secrets_of())
    addresses = ingress_addresses({"spec": {"type": "ClusterIP"}}, host)
    done = ingress_status(gw, Deployed(service_exists=True), judged, host=host, addresses=addresses)
    assert _conditions(done)["Programmed"] == ("True", "Programmed")
    assert done["addresses"] == [{"type": "Hostname", "value": host}]


def test_a_listener_with_a_bad_certificate_is_not_programmed_and_the_gateway_lists_it_invalid() -> None:
    gw = ingress(HTTP, https())
    judged = judge_listeners(gw, secrets_of())
    status = ingress_status(gw, Deployed(service_exists=True), judged, host="h", addresses=())
    https_status = _conditions(status["listeners"][1])
    assert https_status["ResolvedRefs"] == ("False", "InvalidCertificateRef")
    assert https_status["Programmed"] == ("False", "Invalid")
    assert _conditions(status["listeners"][0])["Programmed"] == ("True", "Programmed")


# -- TLS Secrets ----------------------------------------------------------------------------------------------
def test_a_tls_secret_reads_to_its_chain_key_and_names() -> None:
    credential = read_tls_secret(tls_secret())
    assert isinstance(credential, TlsCredential)
    assert credential.covers("a.example.com") and credential.covers("x.b.example.com")
    assert not credential.covers("b.example.com") and not credential.covers("y.x.b.example.com")


def test_server_name_wildcards_cover_one_label() -> None:
    assert server_name_matches("*.example.com", "A.Example.com.")
    assert not server_name_matches("*.example.com", "example.com")
    assert not server_name_matches("*.example.com", ".example.com")


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        st.none(),
        st.dictionaries(
            st.sampled_from(["type", "data", "x"]),
            st.one_of(
                st.text(),
                st.binary(),
                st.integers(),
                st.dictionaries(st.sampled_from(["tls.crt", "tls.key"]), st.one_of(st.text(), st.integers())),
            ),
        ),
    )
)
def test_any_secret_reads_to_a_credential_or_a_problem_without_raising(secret: Any) -> None:
    out = read_tls_secret(secret if isinstance(secret, dict) else {})
    assert isinstance(out, TlsCredential | CredentialProblem)


def test_an_ingress_gateway_pod_may_listen_below_1024_as_istiod_renders_it_a_waypoint_has_no_sysctl() -> None:
    out = render_waypoint(ingress(HTTP), LAB)
    assert isinstance(out, Rendered)
    assert out.deployment["spec"]["template"]["spec"]["securityContext"] == {
        "sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}]
    }
    gw = ingress({"name": "mesh", "port": 15008, "protocol": "HBONE"}, name="waypoint")
    gw["spec"]["gatewayClassName"] = "istio-waypoint"
    out = render_waypoint(gw, LAB)
    assert isinstance(out, Rendered)
    assert "securityContext" not in out.deployment["spec"]["template"]["spec"]

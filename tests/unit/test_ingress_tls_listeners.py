"""Gateway API TLS at the ingress gateway, judged as istiod judges it (issue 18): TLS listeners in mode ``Terminate``
(TLSRoutes and TCPRoutes behind them), TLS listeners of both modes on one port, ``certificateRefs`` to another
namespace allowed by a ReferenceGrant (checked before the Secret is looked up), at most two certificates, and the
listener status written for each, compared with istiod's (its ``tls-terminate`` golden file, ``buildTLS``'s
messages).
"""

from __future__ import annotations

import base64
import time
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.controlplane.gateway.ingress_status import ingress_status
from ambit.controlplane.gateway.status import Deployed
from ambit.controlplane.translate.ingress import translate_ingress
from ambit.controlplane.translate.listeners import judge_listeners
from ambit.controlplane.translate.reference_grants import ReferenceGrants
from ambit.model.ingress import ListenerProtocol
from ambit.model.workload import Service
from ambit.tls.certs import issue_server_cert, new_ca

NOW = time.time()
CA = new_ca("tls listener test CA", now=NOW)
PAIR = issue_server_cert(
    CA, common_name="example.com", dns_names=["example.com", "*.wild.example.com"], ip_addresses=[], now=NOW
)
GROUP = "gateway.networking.k8s.io"


def tls_secret(name: str = "my-cert", namespace: str = "istio-system") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace},
        "type": "kubernetes.io/tls",
        "data": {
            "tls.crt": base64.b64encode(PAIR.cert_pem).decode(),
            "tls.key": base64.b64encode(PAIR.key_pem).decode(),
        },
    }


def secrets_of(*items: dict[str, Any]) -> Any:
    table = {(s["metadata"]["namespace"], s["metadata"]["name"]): s for s in items}
    return lambda namespace, name: table.get((namespace, name))


def gateway(*listeners: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "gateway", "namespace": "istio-system", "generation": 1},
        "spec": {"gatewayClassName": "istio", "listeners": list(listeners)},
    }


def terminate(name: str, port: int, hostname: str | None = None, *refs: dict[str, Any]) -> dict[str, Any]:
    listener: dict[str, Any] = {
        "name": name,
        "port": port,
        "protocol": "TLS",
        "allowedRoutes": {"namespaces": {"from": "All"}},
        "tls": {"mode": "Terminate", "certificateRefs": list(refs) or [{"name": "my-cert"}]},
    }
    if hostname:
        listener["hostname"] = hostname
    return listener


def passthrough(name: str, port: int, hostname: str | None = None) -> dict[str, Any]:
    listener: dict[str, Any] = {
        "name": name,
        "port": port,
        "protocol": "TLS",
        "allowedRoutes": {"namespaces": {"from": "All"}},
        "tls": {"mode": "Passthrough"},
    }
    if hostname:
        listener["hostname"] = hostname
    return listener


def grant(namespace: str, *names: str, from_ns: str = "istio-system", kind: str = "Gateway") -> dict[str, Any]:
    return {
        "metadata": {"name": "allow", "namespace": namespace},
        "spec": {
            "from": [{"group": GROUP, "kind": kind, "namespace": from_ns}],
            "to": [{"group": "", "kind": "Secret", **({"name": n} if n else {})} for n in names or ("",)],
        },
    }


def conditions(listener: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    return {c["type"]: (c["status"], c["reason"], c["message"]) for c in listener["conditions"]}


GOLDEN = gateway(
    terminate("tls-terminate", 443, "example.com"),
    passthrough("tls-passthrough", 443),
    terminate("tls-wildcard", 9443, "*.wild.example.com"),
)
"""istiod's testdata/tls-terminate.yaml Gateway."""


def test_istiod_s_tls_terminate_golden_listeners_are_all_accepted_programmed_and_not_conflicted() -> None:
    judged = judge_listeners(GOLDEN, secrets_of(tls_secret()))
    status = ingress_status(GOLDEN, Deployed(service_exists=True), judged, host="h", addresses=())
    ok = {
        "Accepted": ("True", "Accepted", "No errors found"),
        "Conflicted": ("False", "NoConflicts", "No errors found"),
        "Programmed": ("True", "Programmed", "No errors found"),
        "ResolvedRefs": ("True", "ResolvedRefs", "No errors found"),
    }
    both = [{"group": GROUP, "kind": "TLSRoute"}, {"group": GROUP, "kind": "TCPRoute"}]
    expected = {
        "tls-terminate": both,
        "tls-passthrough": [{"group": GROUP, "kind": "TLSRoute"}],
        "tls-wildcard": both,
    }
    for listener in status["listeners"]:
        assert conditions(listener) == ok, listener["name"]
        assert listener["supportedKinds"] == expected[listener["name"]], listener["name"]
    terminating, passing, wildcard = judged
    assert (terminating.terminates_tls, passing.terminates_tls, wildcard.terminates_tls) == (True, False, True)
    assert len(terminating.credentials) == 1 and passing.credentials == ()


def tls_route(name: str, section: str, hostnames: list[str], service: str, port: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {
            "parentRefs": [{"name": "gateway", "namespace": "istio-system", "sectionName": section}],
            "hostnames": hostnames,
            "rules": [{"backendRefs": [{"name": service, "port": port}]}],
        },
    }


def service(name: str) -> Service:
    return Service(name=name, namespace="default", hostname=f"{name}.default.svc.cluster.local")


def test_istiod_s_golden_routes_attach_and_the_gateway_serves_terminated_and_passthrough_listeners() -> None:
    routes = [
        tls_route("tls-terminate-route", "tls-terminate", ["example.com"], "backend-terminate", 8080),
        tls_route("tls-passthrough-route", "tls-passthrough", ["passthrough.example.com"], "backend-passthrough", 443),
        tls_route(
            "tls-hostname-intersection-route",
            "tls-wildcard",
            ["foo.wild.example.com", "bar.wild.example.com"],
            "backend-wildcard",
            8080,
        ),
        tls_route(
            "tls-no-matching-hostname-route", "tls-terminate", ["wrong-hostname.example.com"], "backend-wrong", 8080
        ),
    ]
    tcp = {
        "metadata": {"name": "raw", "namespace": "default"},
        "spec": {
            "parentRefs": [{"name": "gateway", "namespace": "istio-system", "sectionName": "tls-wildcard"}],
            "rules": [{"backendRefs": [{"name": "backend-raw", "port": 9000}]}],
        },
    }
    out = translate_ingress(
        gateways=[GOLDEN],
        http_routes=(),
        tls_routes=routes,
        tcp_routes=[tcp],
        k8s_services=[
            service(n) for n in ("backend-terminate", "backend-passthrough", "backend-wildcard", "backend-raw")
        ],
        find_secret=secrets_of(tls_secret()),
        namespace_labels={},
    )
    accepted = {s.name: s.parents[0].conditions[0] for s in out.status}
    assert {n: (c.status, c.reason) for n, c in accepted.items()} == {
        "tls-terminate-route": (True, "Accepted"),
        "tls-passthrough-route": (True, "Accepted"),
        "tls-hostname-intersection-route": (True, "Accepted"),
        "tls-no-matching-hostname-route": (False, "NoMatchingListenerHostname"),
        "raw": (True, "Accepted"),  # a TCPRoute on a terminating TLS listener: the stream is plain once terminated
    }
    (config,) = out.configs
    by_name = {item.name: item for item in config.listeners}
    assert by_name["tls-terminate"].protocol is ListenerProtocol.TLS_TERMINATE
    assert by_name["tls-passthrough"].protocol is ListenerProtocol.TLS
    assert by_name["tls-terminate"].port == by_name["tls-passthrough"].port == 443
    assert len(by_name["tls-terminate"].certificates) == 1 and by_name["tls-passthrough"].certificates == ()
    hosts = {v.hostname: v.tcp_backends[0].backend for v in by_name["tls-wildcard"].virtual_hosts}
    assert set(hosts) == {"foo.wild.example.com", "bar.wild.example.com", "*"}
    raw = hosts["*"]  # the TCPRoute: every name the listener takes that no TLSRoute names
    assert raw is not None and raw.hostname == "backend-raw.default.svc.cluster.local"
    terminated = by_name["tls-terminate"].virtual_hosts
    assert [
        (v.hostname, v.tcp_backends[0].backend.hostname if v.tcp_backends[0].backend else "") for v in terminated
    ] == [("example.com", "backend-terminate.default.svc.cluster.local")]


REF_OTHER = {"name": "shared-cert", "namespace": "certs"}
NOT_PERMITTED = (
    False,
    "RefNotPermitted",
    'certificateRef shared-cert/certs not accessible to a Gateway in namespace "istio-system"'
    " (missing a ReferenceGrant?)",
)


def test_a_certificate_in_another_namespace_needs_a_reference_grant_there() -> None:
    gw = gateway(terminate("t", 443, None, REF_OTHER))
    secret = tls_secret("shared-cert", "certs")
    cases = {
        "no grant": ([], False),
        "grant of every Secret": ([grant("certs")], True),
        "grant by name": ([grant("certs", "shared-cert")], True),
        "grant of another name": ([grant("certs", "other-cert")], False),
        "grant in the wrong namespace": ([grant("istio-system")], False),
        "grant from another namespace": ([grant("certs", from_ns="elsewhere")], False),
        "grant to HTTPRoutes, not Gateways": ([grant("certs", kind="HTTPRoute")], False),
    }
    for case, (grants, permitted) in cases.items():
        (judged,) = judge_listeners(gw, secrets_of(secret), grants=ReferenceGrants.build(grants))
        assert judged.ready is permitted, case
        if permitted:
            assert judged.credentials[0].cert_pem == PAIR.cert_pem, case
        else:
            assert judged.resolved == NOT_PERMITTED, case
            assert judged.credentials == (), case


def test_without_a_grant_the_status_never_tells_whether_the_secret_exists() -> None:
    """The attack: probing another namespace for Secret names through a Gateway's status (CWE-203)."""
    gw = gateway(terminate("t", 443, None, REF_OTHER))
    looked_up: list[tuple[str, str]] = []

    def spy(namespace: str, name: str) -> Any:
        looked_up.append((namespace, name))
        return tls_secret("shared-cert", "certs")

    (present,) = judge_listeners(gw, spy)
    (absent,) = judge_listeners(gw, secrets_of())
    assert present.resolved == absent.resolved == NOT_PERMITTED
    assert looked_up == []  # not even asked for
    status = ingress_status(gw, Deployed(service_exists=True), (present,), host="h", addresses=())
    assert conditions(status["listeners"][0])["Programmed"] == ("False", "Invalid", "Bad TLS configuration")


def test_a_granted_reference_to_a_missing_secret_is_an_invalid_certificate_ref_as_istiod_writes_it() -> None:
    gw = gateway(terminate("t", 443, None, REF_OTHER))
    (judged,) = judge_listeners(gw, secrets_of(), grants=ReferenceGrants.build([grant("certs")]))
    assert judged.resolved == (
        False,
        "InvalidCertificateRef",
        "invalid certificate reference //shared-cert.certs, secret certs/shared-cert not found",
    )


def test_more_than_two_certificates_is_invalid_tls_with_istiod_s_message() -> None:
    refs = [{"name": "my-cert"}] * 3
    for listener in (terminate("t", 443, None, *refs), {**terminate("h", 8443, None, *refs), "protocol": "HTTPS"}):
        (judged,) = judge_listeners(gateway(listener), secrets_of(tls_secret()))
        assert judged.resolved == (
            False,
            "InvalidCertificateRef",
            "TLS mode can only support up to 2 server certificates",
        )
        assert not judged.ready
    (two,) = judge_listeners(gateway(terminate("t", 443, None, *refs[:2])), secrets_of(tls_secret()))
    assert two.ready and len(two.credentials) == 2


def test_a_bad_reference_beside_a_good_one_is_skipped_and_with_none_good_the_problems_are_joined() -> None:
    """istiod's buildTLS: references are judged one by one; with one valid the listener is served with it, with none
    the first problem's reason and every message joined by "; "."""
    good_and_missing = terminate("t", 443, None, {"name": "my-cert"}, {"name": "missing"})
    (judged,) = judge_listeners(gateway(good_and_missing), secrets_of(tls_secret()))
    assert judged.ready and len(judged.credentials) == 1
    both_bad = terminate("t", 443, None, REF_OTHER, {"name": "missing"})
    (judged,) = judge_listeners(gateway(both_bad), secrets_of())
    assert judged.resolved == (
        False,
        "RefNotPermitted",
        NOT_PERMITTED[2] + "; invalid certificate reference //missing., secret istio-system/missing not found",
    )


def test_ports_mixing_modes_are_accepted_but_protocols_and_hostnames_still_conflict() -> None:
    judged = judge_listeners(
        gateway(
            terminate("a", 443, "a.example.com"),
            passthrough("b", 443),
            passthrough("c", 443, "a.example.com"),  # same port and hostname as "a": a conflict whatever the mode
            {"name": "d", "port": 443, "protocol": "TCP"},
        ),
        secrets_of(tls_secret()),
    )
    # istiod's rule: only the listeners that lose to an earlier winner are conflicted
    assert [j.conflicted[1] for j in judged] == ["NoConflicts", "NoConflicts", "HostnameConflict", "ProtocolConflict"]
    judged = judge_listeners(
        gateway(terminate("a", 443, "a.example.com"), passthrough("b", 443), passthrough("c", 443, "a.example.com")),
        secrets_of(tls_secret()),
    )
    assert [j.conflicted[1] for j in judged] == ["NoConflicts", "NoConflicts", "HostnameConflict"]


def test_the_istio_mutual_option_serves_the_mesh_certificate_without_references() -> None:
    listener = terminate("t", 443)
    listener["tls"] = {"mode": "Terminate", "options": {"gateway.istio.io/tls-terminate-mode": "ISTIO_MUTUAL"}}
    (judged,) = judge_listeners(gateway(listener), secrets_of())
    assert judged.ready and judged.credentials == () and judged.client_tls.mode.value == "ISTIO_MUTUAL"


WORDS = st.sampled_from(["", "Gateway", "HTTPRoute", "Secret", "core", GROUP, "istio-system", "certs", "c1"])
ENTRY = st.one_of(
    st.dictionaries(st.sampled_from(["group", "kind", "namespace", "name"]), WORDS, max_size=4),
    st.dictionaries(st.sampled_from(["group", "kind", "namespace", "name"]), st.integers() | st.none(), max_size=2),
    st.integers(),
)
GRANT = st.fixed_dictionaries(
    {
        "metadata": st.fixed_dictionaries({"namespace": WORDS}),
        "spec": st.dictionaries(
            st.sampled_from(["from", "to"]), st.lists(ENTRY, max_size=3) | ENTRY | st.none(), max_size=2
        ),
    }
)


def oracle(grants: list[Any], to_namespace: str, name: str) -> bool:
    """Rule 1 spelled out, for a Gateway of istio-system referring to a core Secret."""
    for item in grants:
        spec = item["spec"]
        froms, tos = spec.get("from"), spec.get("to")
        if item["metadata"]["namespace"] != to_namespace or not isinstance(froms, list) or not isinstance(tos, list):
            continue
        source = any(
            isinstance(f, dict)
            and f.get("group") == GROUP
            and f.get("kind") == "Gateway"
            and f.get("namespace") == "istio-system"
            for f in froms
        )
        target = any(
            isinstance(t, dict)
            and t.get("group", "") in ("", "core", None)
            and t.get("kind") == "Secret"
            and (t.get("name") in ("", None, name) or not isinstance(t.get("name"), str))
            for t in tos
        )
        if source and target:
            return True
    return False


@settings(max_examples=300, deadline=None)
@given(st.lists(GRANT, max_size=4), WORDS, WORDS)
def test_any_reference_grants_answer_without_error_and_grant_exactly_what_they_list(
    grants: list[dict[str, Any]], to_namespace: str, name: str
) -> None:
    permitted = ReferenceGrants.build(grants).permits(
        from_group=GROUP,
        from_kind="Gateway",
        from_namespace="istio-system",
        to_group="",
        to_kind="Secret",
        to_namespace=to_namespace,
        to_name=name,
    )
    assert permitted is oracle(grants, to_namespace, name)


LISTENER = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["a", "b", "c"]) | st.integers(),
        "port": st.sampled_from([443, 9443, 0, -1, 70000, "443"]),
        "protocol": st.sampled_from(["TLS", "HTTPS", "TCP", "HTTP", "tls", 7]),
    },
    optional={
        "hostname": st.sampled_from(["example.com", "*.example.com", "", None, 3]),
        "tls": st.fixed_dictionaries(
            {},
            optional={
                "mode": st.sampled_from(["Terminate", "Passthrough", "Other", None, 1]),
                "certificateRefs": st.lists(
                    st.fixed_dictionaries(
                        {},
                        optional={
                            "name": st.sampled_from(["my-cert", "shared-cert", "", None, 5]),
                            "namespace": st.sampled_from(["istio-system", "certs", "", None, []]),
                            "kind": st.sampled_from(["Secret", "ConfigMap", "", None]),
                            "group": st.sampled_from(["", "core", "x.io", None]),
                        },
                    )
                    | st.integers(),
                    max_size=4,
                )
                | st.none()
                | st.text(max_size=3),
                "options": st.dictionaries(
                    st.just("gateway.istio.io/tls-terminate-mode"),
                    st.sampled_from(["ISTIO_MUTUAL", "MUTUAL", "SIMPLE", "", 1]),
                ),
            },
        )
        | st.none()
        | st.integers(),
    },
)


@settings(max_examples=300, deadline=None)
@given(st.lists(LISTENER, max_size=5), st.booleans())
def test_any_listeners_are_judged_without_error_and_a_ready_terminating_one_has_what_it_serves(
    listeners: list[dict[str, Any]], granted: bool
) -> None:
    grants = ReferenceGrants.build([grant("certs")] if granted else [])
    find = secrets_of(tls_secret(), tls_secret("shared-cert", "certs"))
    for judged in judge_listeners(gateway(*listeners), find, grants=grants):
        if judged.ready and judged.terminates_tls:
            assert 1 <= len(judged.credentials) <= 2 or judged.client_tls.mode.value == "ISTIO_MUTUAL"
        if not judged.terminates_tls:
            assert judged.credentials == ()
        assert isinstance(judged.resolved[2], str) and isinstance(judged.accepted[2], str)

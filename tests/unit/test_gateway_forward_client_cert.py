"""The ingress gateway's ``x-forwarded-client-cert``: Envoy's five modes as a pure plan
(:func:`ambit.waypoint.client_cert.plan_forwarded_client_cert`, rules 5-10), the element that describes a verified
client certificate, where the mode comes from (``gatewayTopology.forwardClientCertDetails``:
:mod:`ambit.controlplane.translate.gateway_topology` rule 4, MeshConfig ``defaultConfig``), and how it travels to the
gateway (:mod:`ambit.xds.gateway` rule 6).

The element is read back with an independent parser written from Envoy's documented XFCC grammar (elements split by
``,``, key/value pairs by ``;``, a value double-quoted when it holds ``,;=``, ``\\"`` inside quotes), so "cannot
inject" means what a backend parsing the header would see.
"""

from __future__ import annotations

import hashlib
import json
import time
import urllib.parse
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from hypothesis import given
from hypothesis import strategies as st
from tests.ingress_pki import client_cert

from ambit.controlplane.translate import translate_all
from ambit.controlplane.translate.gateway_topology import forward_client_cert, gateway_forward_client_cert
from ambit.controlplane.translate.meshconfig import MeshConfigError, parse_mesh_config
from ambit.model.ingress import ForwardClientCert, GatewayConfig
from ambit.tls.certs import new_ca
from ambit.waypoint.client_cert import (
    XFCC,
    ClientCertificate,
    describe_client_certificate,
    edge_element,
    plan_forwarded_client_cert,
)
from ambit.waypoint.decisions import RequestHead
from ambit.xds.errors import XdsConversionError
from ambit.xds.gateway import decode_gateway_config, gateway_config_to_proto, pack_gateway_config

CA = new_ca("xfcc unit CA", now=time.time())
CLIENT = ClientCertificate(
    hash="ab" * 32,
    cert="-----BEGIN%20CERTIFICATE-----%0AMIIB%0A-----END%20CERTIFICATE-----%0A",
    subject="CN=client.example",
    uris=("spiffe://partner/ns/a/sa/b",),
    dns=("client.example",),
    by=("spiffe://cluster.local/ns/edge/sa/edge-istio",),
)
FORGED = "By=spiffe://evil;URI=spiffe://cluster.local/ns/admin/sa/root"
ALL_MODES = list(ForwardClientCert)


def parse_xfcc(value: str) -> list[list[tuple[str, str]]]:
    """Envoy's XFCC grammar: a list of elements (``,``), each of ``key=value`` pairs (``;``); a double-quoted value
    may hold ``,;=`` and ``\\"``/``\\\\`` escapes. Raises ValueError on anything else."""
    elements: list[list[tuple[str, str]]] = []
    pairs: list[tuple[str, str]] = []
    i, n = 0, len(value)
    while True:
        eq = value.find("=", i)
        if eq < 0:
            raise ValueError(f"no '=' after position {i}")
        key = value[i:eq]
        if not key or any(c in key for c in ',;"'):
            raise ValueError(f"bad key {key!r}")
        i = eq + 1
        if i < n and value[i] == '"':
            i += 1
            out = []
            while True:
                if i >= n:
                    raise ValueError("unterminated quote")
                c = value[i]
                if c == "\\":
                    if i + 1 >= n:
                        raise ValueError("dangling escape")
                    out.append(value[i + 1])
                    i += 2
                elif c == '"':
                    i += 1
                    break
                else:
                    out.append(c)
                    i += 1
            text = "".join(out)
        else:
            start = i
            while i < n and value[i] not in ",;":
                if value[i] in '="':
                    raise ValueError(f"unquoted {value[i]!r} in a value")
                i += 1
            text = value[start:i]
        pairs.append((key, text))
        if i >= n:
            elements.append(pairs)
            return elements
        if value[i] == ",":
            elements.append(pairs)
            pairs = []
        elif value[i] != ";":
            raise ValueError(f"expected ',' or ';' at {i}")
        i += 1


def head(*xfcc: str) -> RequestHead:
    return RequestHead("GET", "/", "web.example.com", (("accept", "*/*"), *((XFCC, v) for v in xfcc)))


def xfcc_of(request: RequestHead) -> list[str]:
    return [v for k, v in request.headers if k == XFCC]


@pytest.mark.parametrize(
    ("mode", "client", "want"),
    [
        (ForwardClientCert.SANITIZE, CLIENT, []),
        (ForwardClientCert.SANITIZE, None, []),
        (ForwardClientCert.FORWARD_ONLY, CLIENT, [FORGED]),
        (ForwardClientCert.FORWARD_ONLY, None, []),
        (ForwardClientCert.APPEND_FORWARD, CLIENT, [f"{FORGED},{edge_element(CLIENT)}"]),
        (ForwardClientCert.APPEND_FORWARD, None, []),
        (ForwardClientCert.SANITIZE_SET, CLIENT, [edge_element(CLIENT)]),
        (ForwardClientCert.SANITIZE_SET, None, []),
        (ForwardClientCert.ALWAYS_FORWARD_ONLY, CLIENT, [FORGED]),
        (ForwardClientCert.ALWAYS_FORWARD_ONLY, None, [FORGED]),
    ],
)
def test_each_mode_over_mutual_tls_and_without_it_does_what_envoy_does(
    mode: ForwardClientCert, client: ClientCertificate | None, want: list[str]
) -> None:
    planned = plan_forwarded_client_cert(head(FORGED), mode, client)
    assert xfcc_of(planned) == want
    assert ("accept", "*/*") in planned.headers


def test_the_element_has_envoy_s_fields_in_envoy_s_order() -> None:
    assert edge_element(CLIENT) == (
        "By=spiffe://cluster.local/ns/edge/sa/edge-istio;"
        f"Hash={'ab' * 32};"
        f'Cert="{CLIENT.cert}";'
        'Subject="CN=client.example";'
        "URI=spiffe://partner/ns/a/sa/b;"
        "DNS=client.example"
    )


def test_a_certificate_without_uri_names_still_says_uri_and_no_by_without_a_served_uri() -> None:
    bare = ClientCertificate("00" * 32, "x", "", ())
    assert edge_element(bare) == f'Hash={"00" * 32};Cert="x";Subject="";URI='


def test_append_forward_joins_several_client_lines_in_their_order_before_the_element() -> None:
    planned = plan_forwarded_client_cert(head("Hash=1", "Hash=2"), ForwardClientCert.APPEND_FORWARD, CLIENT)
    assert xfcc_of(planned) == [f"Hash=1,Hash=2,{edge_element(CLIENT)}"]


def test_a_real_certificate_is_described_as_envoy_describes_it() -> None:
    pair = client_cert(CA, dns=("client.example",), uris=("spiffe://partner/ns/a/sa/b",))
    cert = x509.load_pem_x509_certificate(pair.cert_pem)
    der = cert.public_bytes(serialization.Encoding.DER)
    described = describe_client_certificate(der, ("spiffe://cluster.local/ns/edge/sa/edge-istio",))
    assert described is not None
    assert described.hash == hashlib.sha256(der).hexdigest()
    assert urllib.parse.unquote(described.cert) == pair.cert_pem.decode()
    assert described.subject == cert.subject.rfc4514_string()
    assert described.uris == ("spiffe://partner/ns/a/sa/b",) and described.dns == ("client.example",)
    (element,) = parse_xfcc(edge_element(described))
    assert dict(element)["Hash"] == described.hash
    assert urllib.parse.unquote(dict(element)["Cert"]) == pair.cert_pem.decode()


def test_a_certificate_that_does_not_parse_is_not_described() -> None:
    assert describe_client_certificate(b"\x30\x03junk") is None


_NAMES = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)


@given(
    theirs=st.lists(st.text(max_size=80), max_size=3),
    mode=st.sampled_from(ALL_MODES),
    mutual=st.booleans(),
)
def test_a_client_s_header_reaches_the_backend_only_in_the_forwarding_modes(
    theirs: list[str], mode: ForwardClientCert, mutual: bool
) -> None:
    client = CLIENT if mutual else None
    seen = xfcc_of(plan_forwarded_client_cert(head(*theirs), mode, client))
    forwards = mode is ForwardClientCert.ALWAYS_FORWARD_ONLY or (
        mutual and mode in (ForwardClientCert.FORWARD_ONLY, ForwardClientCert.APPEND_FORWARD)
    )
    if not forwards:
        # SANITIZE and SANITIZE_SET, and any mode but ALWAYS_FORWARD_ONLY without mutual TLS: nothing of theirs
        assert seen == ([edge_element(CLIENT)] if mutual and mode is ForwardClientCert.SANITIZE_SET else [])
    elif mode is ForwardClientCert.APPEND_FORWARD and theirs:
        assert seen == [",".join([*theirs, edge_element(CLIENT)])]
    elif mode is ForwardClientCert.APPEND_FORWARD:
        assert seen == [edge_element(CLIENT)]
    else:
        assert seen == theirs


@given(
    subject=_NAMES,
    uris=st.lists(_NAMES, max_size=3),
    dns=st.lists(_NAMES, max_size=3),
    by=st.lists(_NAMES, max_size=2),
)
def test_no_certificate_name_can_split_the_element_or_the_header(
    subject: str, uris: list[str], dns: list[str], by: list[str]
) -> None:
    client = ClientCertificate("cd" * 32, "pem", subject, tuple(uris), tuple(dns), tuple(by))
    value = xfcc_of(plan_forwarded_client_cert(head(FORGED), ForwardClientCert.SANITIZE_SET, client))[0]
    assert all(" " <= c <= "~" for c in value)  # no CR, LF, NUL or anything a header line could break on
    (element,) = parse_xfcc(value)  # exactly one element: a name with "," or ";" cannot add another
    keys = [k for k, _ in element]
    assert keys == ["By"] * len(by) + ["Hash", "Cert", "Subject"] + (["URI"] * len(uris) or ["URI"]) + ["DNS"] * len(
        dns
    )
    values = dict(element)
    assert values["Hash"] == "cd" * 32
    printable = [u for u in uris if all(" " <= c <= "~" for c in u)]
    got_uris = [v for k, v in element if k == "URI"]
    for uri in printable:  # printable names come through exactly as the certificate holds them
        assert uri in got_uris


# --- where the mode comes from ---------------------------------------------------------------------------------


def gateway(annotation: str | None = None, infrastructure: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "edge", "namespace": "in-edge"}
    spec: dict[str, Any] = {
        "gatewayClassName": "istio",
        "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}],
    }
    if annotation is not None:
        meta["annotations"] = {"proxy.istio.io/config": annotation}
    if infrastructure is not None:
        spec["infrastructure"] = {"annotations": {"proxy.istio.io/config": infrastructure}}
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": meta, "spec": spec}


FORWARD_ONLY = json.dumps({"gatewayTopology": {"forwardClientCertDetails": "FORWARD_ONLY"}})
SAN = ForwardClientCert.SANITIZE


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("SANITIZE", ForwardClientCert.SANITIZE),
        ("APPEND_FORWARD", ForwardClientCert.APPEND_FORWARD),
        ("ALWAYS_FORWARD_ONLY", ForwardClientCert.ALWAYS_FORWARD_ONLY),
        (2, ForwardClientCert.FORWARD_ONLY),
        (4, ForwardClientCert.SANITIZE_SET),
        ("UNDEFINED", None),
        (0, None),
        (None, None),
    ],
)
def test_forward_client_cert_details_is_read_by_name_or_number(value: object, want: ForwardClientCert | None) -> None:
    assert forward_client_cert({"gatewayTopology": {"forwardClientCertDetails": value}}, "defaultConfig") == want
    assert forward_client_cert({"gateway_topology": {"forward_client_cert_details": value}}, "x") == want


@pytest.mark.parametrize("value", ["sanitize", "SANITISE", 6, -1, True, 1.0, [], {}])
def test_a_mode_istio_does_not_name_is_an_error_naming_the_field(value: object) -> None:
    with pytest.raises(ValueError, match=r"defaultConfig\.gatewayTopology\.forwardClientCertDetails"):
        forward_client_cert({"gatewayTopology": {"forwardClientCertDetails": value}}, "defaultConfig")


@pytest.mark.parametrize(
    ("obj", "mesh", "want"),
    [
        (gateway(), None, None),
        (gateway(), ForwardClientCert.SANITIZE, ForwardClientCert.SANITIZE),
        (gateway(FORWARD_ONLY), ForwardClientCert.SANITIZE, ForwardClientCert.FORWARD_ONLY),
        (
            gateway(FORWARD_ONLY, "gatewayTopology: {forwardClientCertDetails: SANITIZE}"),
            None,
            ForwardClientCert.SANITIZE,
        ),
        # the annotation sets only the count: the mesh's mode stays (field by field, as istiod merges ProxyConfig)
        (gateway("gatewayTopology: {numTrustedProxies: 1}"), SAN, SAN),
        # a bad annotation cannot make the gateway forward more than the mesh says
        (
            gateway("gatewayTopology: {forwardClientCertDetails: ALWAYS}"),
            ForwardClientCert.SANITIZE,
            ForwardClientCert.SANITIZE,
        ),
        (gateway("{{{ not yaml"), None, None),
    ],
)
def test_a_gateway_s_mode_comes_from_its_annotation_then_the_mesh_default(
    obj: dict[str, Any], mesh: ForwardClientCert | None, want: ForwardClientCert | None
) -> None:
    assert gateway_forward_client_cert(obj, mesh) == want


def test_the_mesh_default_config_gives_the_mode_and_a_bad_one_is_a_mesh_config_error() -> None:
    text = "defaultConfig:\n  gatewayTopology:\n    forwardClientCertDetails: APPEND_FORWARD\n"
    assert parse_mesh_config(text).forward_client_cert is ForwardClientCert.APPEND_FORWARD
    assert parse_mesh_config("defaultConfig: {}\n").forward_client_cert is None
    with pytest.raises(MeshConfigError, match="forwardClientCertDetails"):
        parse_mesh_config("defaultConfig:\n  gatewayTopology:\n    forwardClientCertDetails: EVERYTHING\n")


def translated(*gateways: dict[str, Any], mesh: str | None = None) -> dict[str, ForwardClientCert]:
    config_maps = []
    if mesh is not None:
        config_maps.append({"metadata": {"name": "istio", "namespace": "istio-system"}, "data": {"mesh": mesh}})
    translation = translate_all(
        pods=(),
        services=(),
        endpoint_slices=(),
        namespaces=[{"metadata": {"name": "in-edge"}}, {"metadata": {"name": "istio-system"}}],
        gateways=list(gateways),
        config_maps=config_maps,
    )
    return {c.gateway: c.forward_client_cert for c in translation.gateway_configs}


def test_the_translation_gives_each_gateway_sanitize_set_unless_told_otherwise() -> None:
    other = gateway(FORWARD_ONLY)
    other["metadata"] = {**other["metadata"], "name": "partner"}
    assert translated(gateway(), other) == {
        "in-edge/edge": ForwardClientCert.SANITIZE_SET,
        "in-edge/partner": ForwardClientCert.FORWARD_ONLY,
    }
    mesh = "defaultConfig:\n  gatewayTopology:\n    forwardClientCertDetails: SANITIZE\n"
    assert translated(gateway(), other, mesh=mesh) == {
        "in-edge/edge": ForwardClientCert.SANITIZE,
        "in-edge/partner": ForwardClientCert.FORWARD_ONLY,
    }


@pytest.mark.parametrize("mode", ALL_MODES)
def test_the_mode_travels_to_the_gateway_over_xds(mode: ForwardClientCert) -> None:
    config = GatewayConfig("in-edge/edge", forward_client_cert=mode)
    assert decode_gateway_config("in-edge/edge", pack_gateway_config(gateway_config_to_proto(config))) == config


def test_an_unspecified_mode_is_sanitize_set_and_an_unknown_number_is_refused() -> None:
    message = gateway_config_to_proto(GatewayConfig("in-edge/edge"))
    message.forward_client_cert = 0  # type: ignore[assignment]
    decoded = decode_gateway_config("in-edge/edge", pack_gateway_config(message))
    assert decoded.forward_client_cert is ForwardClientCert.SANITIZE_SET
    message.forward_client_cert = 42  # type: ignore[assignment]
    with pytest.raises(XdsConversionError, match="forward_client_cert"):
        decode_gateway_config("in-edge/edge", pack_gateway_config(message))

"""DestinationRule → the policy each waypoint applies to each Service it serves
(:mod:`ambit.controlplane.translate.destinationrules`): upstream's objects (istio tests/integration/ambient
baseline_test.go TestServerRouting, TestDestinationRule) verbatim, istiod's lookup order, exportTo, host forms and
merging, subsets resolved to workload uids, and bad rules skipped with a clear note, never a traceback."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.controlplane.translate import translate_all
from ambit.controlplane.translate.destinationrules import (
    DestinationRuleIndex,
    destination_policies,
    parse_destination_rule,
    parse_destination_rules,
)
from ambit.controlplane.translate.skips import Skipped
from ambit.model.destination_policy import (
    ClientTls,
    ConnectionPool,
    ConsistentHash,
    H2Upgrade,
    LoadBalancer,
    LoadBalancerType,
    OutlierDetection,
    PortTrafficPolicy,
    ProxyProtocolVersion,
    TlsMode,
    TrafficPolicy,
)
from ambit.model.workload import Service

ROOT = "istio-system"
DOMAIN = "cluster.local"
HOST = "reviews.app.svc.cluster.local"

# Upstream's objects, with "{{.Host}}" / "{{.Destination}}" rendered as the test renders them (the Service's
# short name) and applied in the test's namespace.
SUBSET_ROUTING = """
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata:
  name: route
  namespace:
spec:
  host: "reviews"
  subsets:
  - labels:
      version: v1
    name: v1
  - labels:
      version: v2
    name: v2
"""
TLS = """
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata:
  name: "reviews"
spec:
  host: "reviews"
  trafficPolicy:
    tls:
      mode: SIMPLE
      insecureSkipVerify: true
"""
SUBSET_POLICY = """
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata:
  name: "reviews"
spec:
  host: "reviews"
  subsets:
  - labels:
      version: v1
    name: v1
    trafficPolicy:
      connectionPool:
        http:
          h2UpgradePolicy: UPGRADE
"""
USE_CLIENT_PROTOCOL = """
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata:
  name: use-client-protocol
spec:
  host: reviews
  trafficPolicy:
    tls:
      mode: DISABLE
    connectionPool:
      http:
        useClientProtocol: true
"""
PROXY = """
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata:
  name: "reviews"
spec:
  host: "reviews"
  trafficPolicy:
    proxyProtocol:
      version: V1
"""
PORT_LEVEL_TLS = """
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata:
  name: "reviews"
spec:
  host: "reviews"
  trafficPolicy:
    portLevelSettings:
    - port:
        number: 443
      tls:
        mode: SIMPLE
        insecureSkipVerify: true
"""
ISTIO_MUTUAL_AND_PROXY = """
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata:
  name: "reviews"
spec:
  host: "reviews"
  trafficPolicy:
    tls:
      mode: ISTIO_MUTUAL
    proxyProtocol:
      version: V1
"""


def upstream(text: str, namespace: str = "app") -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load(text)
    obj["metadata"]["namespace"] = namespace
    return obj


def rule(spec: dict[str, Any], namespace: str = "app", name: str = "dr", created: str = "") -> dict[str, Any]:
    meta = {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}", "creationTimestamp": created}
    return {"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule", "metadata": meta, "spec": spec}


def parse(obj: dict[str, Any], secrets: dict[tuple[str, str], Any] | None = None) -> tuple[Any, list[Skipped]]:
    skips: list[Skipped] = []
    parsed = parse_destination_rule(
        obj, domain=DOMAIN, skips=skips, find_secret=lambda ns, name: (secrets or {}).get((ns, name))
    )
    return parsed, skips


def service(hostname: str = HOST, namespace: str = "app") -> Service:
    return Service(name=hostname.partition(".")[0], namespace=namespace, hostname=hostname)


def find(objs: list[dict[str, Any]], waypoint_namespace: str = "app", svc: Service | None = None) -> str | None:
    skips: list[Skipped] = []
    rules = parse_destination_rules(objs, domain=DOMAIN, skips=skips, find_secret=lambda ns, name: None)
    found = DestinationRuleIndex(rules, root_namespace=ROOT).find(waypoint_namespace, svc or service())
    return found.key if found is not None else None


def test_upstream_tls_rule_reads_as_simple_tls_without_verification() -> None:
    parsed, skips = parse(upstream(TLS))
    assert skips == [] and parsed.host == HOST
    assert parsed.traffic_policy == TrafficPolicy(tls=ClientTls(TlsMode.SIMPLE, insecure_skip_verify=True))


def test_upstream_subset_policy_rule_reads_as_an_h2_upgrade_on_subset_v1() -> None:
    parsed, skips = parse(upstream(SUBSET_POLICY))
    assert skips == []
    (v1,) = parsed.subsets
    assert v1.name == "v1" and v1.labels == (("version", "v1"),)
    assert v1.traffic_policy == TrafficPolicy(connection_pool=ConnectionPool(h2_upgrade=H2Upgrade.UPGRADE))


def test_upstream_use_client_protocol_rule_reads_as_the_clients_version_upstream() -> None:
    """istio tests/integration/pilot/common routing.go useClientProtocolCases (template
    useClientProtocolDestinationRuleTmpl)."""
    parsed, skips = parse(upstream(USE_CLIENT_PROTOCOL))
    assert skips == []
    assert parsed.traffic_policy == TrafficPolicy(
        connection_pool=ConnectionPool(use_client_protocol=True), tls=ClientTls(TlsMode.DISABLE)
    )


def test_use_client_protocol_that_is_not_a_boolean_skips_the_rule_naming_the_field() -> None:
    spec = {"host": "reviews", "trafficPolicy": {"connectionPool": {"http": {"useClientProtocol": "yes"}}}}
    parsed, skips = parse(rule(spec))
    assert parsed is None
    assert [s.field for s in skips] == ["spec.trafficPolicy.connectionPool.http.useClientProtocol"]


@pytest.mark.parametrize(
    ("text", "policy"),
    [
        (PROXY, TrafficPolicy(proxy_protocol=ProxyProtocolVersion.V1)),
        (
            PORT_LEVEL_TLS,
            TrafficPolicy(
                port_level=(PortTrafficPolicy(443, tls=ClientTls(TlsMode.SIMPLE, insecure_skip_verify=True)),)
            ),
        ),
        (
            ISTIO_MUTUAL_AND_PROXY,
            TrafficPolicy(tls=ClientTls(TlsMode.ISTIO_MUTUAL), proxy_protocol=ProxyProtocolVersion.V1),
        ),
    ],
    ids=["PROXY", "port level TLS", "ISTIO_MUTUAL and PROXY"],
)
def test_upstream_rules_read_field_for_field(text: str, policy: TrafficPolicy) -> None:
    parsed, skips = parse(upstream(text))
    assert skips == [] and parsed.traffic_policy == policy


def test_every_setting_a_waypoint_honours_is_read() -> None:
    parsed, skips = parse(
        rule(
            {
                "host": HOST,
                "trafficPolicy": {
                    "loadBalancer": {"simple": "ROUND_ROBIN", "consistentHash": {"httpHeaderName": "X-User"}},
                    "connectionPool": {
                        "tcp": {"maxConnections": 3, "connectTimeout": "250ms"},
                        "http": {
                            "http1MaxPendingRequests": 4,
                            "http2MaxRequests": 5,
                            "maxRequestsPerConnection": 6,
                            "h2UpgradePolicy": "DO_NOT_UPGRADE",
                        },
                    },
                    "outlierDetection": {"consecutive5xxErrors": 2, "interval": "1s", "baseEjectionTime": "1m"},
                    "tls": {"mode": "SIMPLE", "sni": "reviews.example.com", "subjectAltNames": ["a.example.com"]},
                },
            }
        )
    )
    assert skips == []
    assert parsed.traffic_policy == TrafficPolicy(
        load_balancer=LoadBalancer(LoadBalancerType.ROUND_ROBIN, ConsistentHash(header_name="x-user")),
        connection_pool=ConnectionPool(3, 0.25, 4, 5, 6, H2Upgrade.DO_NOT_UPGRADE),
        outlier_detection=OutlierDetection(2, 1.0, 60.0, 10),
        tls=ClientTls(TlsMode.SIMPLE, sni="reviews.example.com", subject_alt_names=("a.example.com",)),
    )


def test_a_credential_names_a_secret_whose_ca_is_sent_and_file_paths_are_noted_and_ignored() -> None:
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    secret = {"data": {"ca.crt": base64.b64encode(pem.encode()).decode()}}
    tls = {"mode": "SIMPLE", "credentialName": "backend-ca", "caCertificates": "/etc/ca.pem"}
    parsed, skips = parse(rule({"host": HOST, "trafficPolicy": {"tls": tls}}), {("app", "backend-ca"): secret})
    assert parsed.traffic_policy.tls == ClientTls(TlsMode.SIMPLE, ca_certificates=pem)
    assert [(s.field, s.reason) for s in skips] == [
        ("spec.trafficPolicy.tls.caCertificates", "credentialName is set: the file is not read")
    ]
    parsed, skips = parse(rule({"host": HOST, "trafficPolicy": {"tls": {"mode": "SIMPLE", "credentialName": "x"}}}))
    assert parsed.traffic_policy.tls == ClientTls(TlsMode.SIMPLE, trust_unresolved=True)  # refused, not system CAs
    assert [s.reason for s in skips] == ["Secret app/x not found"]


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({}, "spec.host"),
        ({"host": HOST, "subsets": [{"name": "v1"}, {"name": "v1"}]}, "spec.subsets[1].name"),
        ({"host": HOST, "subsets": [{"name": "V_1"}]}, "spec.subsets[0].name"),
        ({"host": HOST, "subsets": [{"name": "v1", "labels": {"a": 1}}]}, "spec.subsets[0].labels"),
        (
            {"host": HOST, "trafficPolicy": {"loadBalancer": {"simple": "FASTEST"}}},
            "spec.trafficPolicy.loadBalancer.simple",
        ),
        ({"host": HOST, "trafficPolicy": {"tls": {"mode": "sometimes"}}}, "spec.trafficPolicy.tls.mode"),
        (
            {"host": HOST, "trafficPolicy": {"connectionPool": {"tcp": {"maxConnections": -1}}}},
            "spec.trafficPolicy.connectionPool.tcp.maxConnections",
        ),
        (
            {"host": HOST, "trafficPolicy": {"connectionPool": {"tcp": {"connectTimeout": "soon"}}}},
            "spec.trafficPolicy.connectionPool.tcp.connectTimeout",
        ),
        (
            {"host": HOST, "trafficPolicy": {"portLevelSettings": [{"port": {"number": 0}}]}},
            "spec.trafficPolicy.portLevelSettings[0].port.number",
        ),
        ({"host": HOST, "trafficPolicy": []}, "spec.trafficPolicy"),
    ],
)
def test_a_bad_rule_is_skipped_whole_naming_the_field(spec: dict[str, Any], field: str) -> None:
    parsed, skips = parse(rule(spec))
    assert parsed is None
    assert [(s.kind, s.name, s.field) for s in skips] == [("DestinationRule", "dr", field)]


CERT = "-----BEGIN CERTIFICATE-----\nMIIC\n-----END CERTIFICATE-----\n"
KEY_PEM = "-----BEGIN PRIVATE KEY-----\nsecret-key-bytes\n-----END PRIVATE KEY-----\n"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize(
    "data",
    [
        {"tls.crt": b64(CERT), "tls.key": b64(KEY_PEM), "ca.crt": b64(CERT)},
        {"cert": b64(CERT), "key": b64(KEY_PEM), "cacert": b64(CERT)},
    ],
    ids=["kubernetes.io/tls", "generic"],
)
def test_mutual_with_a_credential_sends_the_secrets_certificate_key_and_ca(data: dict[str, str]) -> None:
    tls = {"mode": "MUTUAL", "credentialName": "client", "clientCertificate": "/etc/c.pem"}
    parsed, skips = parse(rule({"host": HOST, "trafficPolicy": {"tls": tls}}), {("app", "client"): {"data": data}})
    assert parsed.traffic_policy.tls == ClientTls(
        TlsMode.MUTUAL, ca_certificates=CERT, client_certificate=CERT, private_key=KEY_PEM
    )
    assert [s.field for s in skips] == ["spec.trafficPolicy.tls.clientCertificate"]
    assert KEY_PEM not in repr(parsed) and "secret-key-bytes" not in repr(skips)


def test_mutual_with_file_paths_keeps_the_paths_for_the_waypoint() -> None:
    tls = {"mode": "MUTUAL", "clientCertificate": "/c.pem", "privateKey": "/k.pem", "caCertificates": "/ca.pem"}
    parsed, skips = parse(rule({"host": HOST, "trafficPolicy": {"tls": tls}}))
    assert skips == []
    assert parsed.traffic_policy.tls == ClientTls(
        TlsMode.MUTUAL, ca_certificates_path="/ca.pem", client_certificate_path="/c.pem", private_key_path="/k.pem"
    )


@pytest.mark.parametrize(
    ("tls", "secret", "reason"),
    [
        ({"mode": "MUTUAL", "clientCertificate": "/c.pem"}, None, "MUTUAL needs credentialName, or"),
        ({"mode": "MUTUAL", "credentialName": "s"}, None, "Secret app/s not found"),
        ({"mode": "MUTUAL", "credentialName": "s"}, {"tls.crt": b64(CERT)}, "Secret app/s: MUTUAL needs tls.crt"),
        ({"mode": "MUTUAL", "credentialName": "s"}, {"tls.crt": b64(CERT), "tls.key": "!!"}, "Secret app/s: tls.key"),
    ],
)
def test_mutual_without_usable_material_is_noted_and_sent_without_it(
    tls: dict[str, Any], secret: dict[str, str] | None, reason: str
) -> None:
    secrets = {("app", "s"): {"data": secret}} if secret is not None else {}
    parsed, skips = parse(rule({"host": HOST, "trafficPolicy": {"tls": tls}}), secrets)
    got = parsed.traffic_policy.tls
    assert got.mode is TlsMode.MUTUAL and not got.private_key
    assert any(s.reason.startswith(reason) for s in skips), skips


def test_a_secrets_key_goes_only_to_waypoints_of_the_secrets_namespace() -> None:
    data = {"tls.crt": b64(CERT), "tls.key": b64(KEY_PEM)}
    tls = {"mode": "MUTUAL", "credentialName": "client"}
    spec = {
        "host": HOST,
        "trafficPolicy": {"tls": tls, "portLevelSettings": [{"port": {"number": 443}, "tls": tls}]},
        "subsets": [{"name": "v1", "labels": {"version": "v1"}, "trafficPolicy": {"tls": tls}}],
    }
    parsed, _ = parse(rule(spec), {("app", "client"): {"data": data}})
    index = DestinationRuleIndex([parsed], root_namespace=ROOT)
    (own,) = destination_policies(index, "app", [service()], {})
    (other,) = destination_policies(index, "infra", [service()], {})
    assert own.traffic_policy.tls.private_key == KEY_PEM and own.subsets[0].traffic_policy.tls.private_key == KEY_PEM
    assert own.traffic_policy.port_level[0].tls.private_key == KEY_PEM
    stripped = (other.traffic_policy.tls, other.traffic_policy.port_level[0].tls, other.subsets[0].traffic_policy.tls)
    assert stripped == (ClientTls(TlsMode.MUTUAL),) * 3


def test_a_workload_selector_rule_never_applies_at_a_waypoint_and_hides_wider_rules_in_its_namespace() -> None:
    selected = rule({"host": HOST, "workloadSelector": {"matchLabels": {"app": "x"}}}, name="selected")
    wide = rule({"host": "*"}, namespace=ROOT, name="wide")
    assert find([selected]) is None
    assert find([selected, wide], "app") is None  # istiod: the waypoint namespace's match decides, and gives none
    assert find([selected, wide], "wp") == f"{ROOT}/wide"  # not exported: elsewhere the root's rule applies
    plain = rule({"host": HOST}, name="plain")
    assert find([selected, plain], "app") == "app/plain"


@pytest.mark.parametrize(
    ("host", "namespace", "applies"),
    [
        ("reviews", "app", True),
        ("reviews", ROOT, False),  # the short name means reviews.istio-system.svc.cluster.local
        (HOST, ROOT, True),
        ("*.app.svc.cluster.local", "app", True),
        ("*.svc.cluster.local", "app", True),
        ("*", "app", True),
        ("*.other.svc.cluster.local", "app", False),
        ("reviews.app", "app", False),  # not a short name, not the FQDN: taken as written
    ],
)
def test_host_forms_resolve_as_istiod_resolves_them(host: str, namespace: str, applies: bool) -> None:
    assert (find([rule({"host": host}, namespace=namespace)]) is not None) is applies


def test_an_exact_host_wins_over_a_wildcard_and_the_longer_wildcard_wins() -> None:
    rules = [
        rule({"host": "*"}, name="all"),
        rule({"host": "*.svc.cluster.local"}, name="svc"),
        rule({"host": "*.app.svc.cluster.local"}, name="app"),
    ]
    assert find(rules) == "app/app"
    assert find([*rules, rule({"host": "reviews"}, name="exact")]) == "app/exact"


def test_lookup_order_is_the_waypoints_namespace_then_the_services_then_the_root() -> None:
    in_root = rule({"host": HOST}, namespace=ROOT, name="root")
    in_service = rule({"host": HOST}, namespace="app", name="svc")
    in_waypoint = rule({"host": HOST}, namespace="wp", name="own")
    assert find([in_root], "wp") == f"{ROOT}/root"
    assert find([in_root, in_service], "wp") == "app/svc"
    assert find([in_root, in_service, in_waypoint], "wp") == "wp/own"


def test_export_to_limits_who_sees_a_rule() -> None:
    private = rule({"host": HOST, "exportTo": ["."]}, namespace="app", name="private")
    assert find([private], "app") == "app/private"
    assert find([private], "wp") is None
    to_wp = rule({"host": HOST, "exportTo": ["wp"]}, namespace="app", name="to-wp")
    assert find([to_wp], "wp") == "app/to-wp"
    assert find([to_wp], "other") is None
    # A rule exported away from its own namespace is not local there.
    assert find([to_wp], "app") is None
    root_private = rule({"host": HOST, "exportTo": ["."]}, namespace=ROOT, name="rp")
    assert find([root_private], ROOT) == f"{ROOT}/rp"
    assert find([root_private], "wp") is None


def test_the_mesh_default_export_to_applies_to_rules_without_one_but_not_to_generated_ones() -> None:
    plain = rule({"host": HOST}, namespace="app", name="plain")
    spread = rule({"host": HOST, "exportTo": ["*"]}, namespace="app", name="spread")

    def lookup(objs: list[dict[str, Any]], where: str, generated: tuple[dict[str, Any], ...] = ()) -> str | None:
        rules = parse_destination_rules(
            objs,
            domain=DOMAIN,
            skips=[],
            find_secret=lambda ns, name: None,
            default_export_to=(".",),
            generated=generated,
        )
        found = DestinationRuleIndex(rules, root_namespace=ROOT).find(where, service())
        return found.key if found is not None else None

    assert lookup([plain], "app") == "app/plain"
    assert lookup([plain], "wp") is None  # exported only to its own namespace, by the mesh default
    assert lookup([spread], "wp") == "app/spread"
    assert lookup([], "wp", generated=(plain,)) == "app/plain"  # a BackendTLSPolicy's rule keeps istiod's ``*``


def test_rules_for_one_host_merge_oldest_first() -> None:
    old = rule(
        {"host": HOST, "subsets": [{"name": "v1", "labels": {"version": "v1"}}]},
        name="b-old",
        created="2026-01-01T00:00:00Z",
    )
    new = rule(
        {
            "host": HOST,
            "trafficPolicy": {"loadBalancer": {"simple": "RANDOM"}},
            "subsets": [{"name": "v1", "labels": {"version": "x"}}, {"name": "v2", "labels": {"version": "v2"}}],
        },
        name="a-new",
        created="2026-02-01T00:00:00Z",
    )
    skips: list[Skipped] = []
    rules = parse_destination_rules([new, old], domain=DOMAIN, skips=skips, find_secret=lambda ns, n: None)
    found = DestinationRuleIndex(rules, root_namespace=ROOT).find("app", service())
    assert found is not None and found.key == "app/b-old, app/a-new"
    assert [(s.name, s.labels) for s in found.subsets] == [("v1", (("version", "v1"),)), ("v2", (("version", "v2"),))]
    # The first rule has no top-level policy: the next one's is taken.
    assert found.traffic_policy == TrafficPolicy(load_balancer=LoadBalancer(LoadBalancerType.RANDOM))


# Through translate_all: the waypoint's config carries the policy with subsets resolved to workload uids.


def _cluster(
    pods: list[dict[str, Any]], rules: list[dict[str, Any]], entries: list[dict[str, Any]] | None = None
) -> Any:
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "app"}}
    gateway_class = {"metadata": {"name": "istio-waypoint"}, "spec": {"controllerName": "istio.io/mesh-controller"}}
    gateway = {
        "metadata": {"name": "waypoint", "namespace": "app"},
        "spec": {
            "gatewayClassName": "istio-waypoint",
            "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}],
        },
        "status": {"addresses": [{"type": "Hostname", "value": "waypoint.app.svc.cluster.local"}]},
    }
    svc = {
        "metadata": {"name": "reviews", "namespace": "app", "labels": {"istio.io/use-waypoint": "waypoint"}},
        "spec": {"clusterIP": "10.96.0.10", "selector": {"app": "reviews"}, "ports": [{"name": "http", "port": 80}]},
    }
    other = {
        "metadata": {"name": "ratings", "namespace": "app"},
        "spec": {"clusterIP": "10.96.0.11", "selector": {"app": "ratings"}, "ports": [{"name": "http", "port": 80}]},
    }
    return translate_all(
        pods,
        [svc, other],
        [],
        [namespace],
        gateways=[gateway],
        gateway_classes=[gateway_class],
        destination_rules=rules,
        service_entries=entries or [],
    )


def pod(name: str, ip: str, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "app", "uid": f"uid-{name}", "labels": labels},
        "spec": {"nodeName": "n1"},
        "status": {"phase": "Running", "podIP": ip},
    }


def test_translate_all_resolves_upstream_subsets_to_the_services_workloads() -> None:
    pods = [
        pod("reviews-v1", "198.18.1.10", app="reviews", version="v1"),
        pod("reviews-v2", "198.18.1.11", app="reviews", version="v2"),
        pod("ratings-v1", "198.18.1.12", app="ratings", version="v1"),
    ]
    ratings_rule = rule({"host": "ratings", "subsets": [{"name": "v1", "labels": {"version": "v1"}}]}, name="ratings")
    translation = _cluster(pods, [upstream(SUBSET_ROUTING), ratings_rule])
    (config,) = translation.waypoint_configs
    (policy,) = config.destination_rules  # ratings does not use this waypoint
    assert policy.service_key == "app/" + HOST and policy.rule == "app/route"
    uids = {w.name: w.uid for w in translation.config.workloads}
    assert [(s.name, s.workloads) for s in policy.subsets] == [
        ("v1", frozenset({uids["reviews-v1"]})),
        ("v2", frozenset({uids["reviews-v2"]})),
    ]
    # Relabelling a pod changes the config.
    pods[1]["metadata"]["labels"]["version"] = "v1"
    (config,) = _cluster(pods, [upstream(SUBSET_ROUTING)]).waypoint_configs
    assert config.destination_rules[0].subsets[0].workloads == frozenset({uids["reviews-v1"], uids["reviews-v2"]})
    assert config.destination_rules[0].subsets[1].workloads == frozenset()


# A ServiceEntry with inline endpoints labelled by version, bound to the waypoint, and subsets of it.
EXTERNAL = "api.example.com"
INLINE_ENTRY = {
    "apiVersion": "networking.istio.io/v1",
    "kind": "ServiceEntry",
    "metadata": {"name": "api", "namespace": "app", "labels": {"istio.io/use-waypoint": "waypoint"}},
    "spec": {
        "hosts": [EXTERNAL],
        "addresses": ["240.240.0.1"],
        "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
        "resolution": "STATIC",
        "endpoints": [
            {"address": "198.18.5.1", "labels": {"version": "v1"}},
            {"address": "198.18.5.2", "labels": {"version": "v2", "zone": "b"}},
            {"address": "198.18.5.3"},
        ],
    },
}


def test_subsets_select_a_service_entrys_inline_endpoints_by_their_labels() -> None:
    subsets = [
        {"name": "v1", "labels": {"version": "v1"}},
        {"name": "v2b", "labels": {"version": "v2", "zone": "b"}},
        {"name": "none", "labels": {"version": "v3"}},
    ]
    rules = [rule({"host": EXTERNAL, "subsets": subsets}, name="api")]
    translation = _cluster([], rules, entries=[INLINE_ENTRY])
    (config,) = translation.waypoint_configs
    (policy,) = config.destination_rules
    assert policy.service_key == f"app/{EXTERNAL}" and policy.rule == "app/api"
    prefix = "Kubernetes/networking.istio.io/ServiceEntry/app/api/"
    assert [(s.name, s.workloads) for s in policy.subsets] == [
        ("v1", frozenset({prefix + "198.18.5.1"})),
        ("v2b", frozenset({prefix + "198.18.5.2"})),
        ("none", frozenset()),
    ]
    relabelled = json.loads(json.dumps(INLINE_ENTRY))
    relabelled["spec"]["endpoints"][2]["labels"] = {"version": "v1"}
    (config,) = _cluster([], rules, entries=[relabelled]).waypoint_configs
    assert config.destination_rules[0].subsets[0].workloads == {prefix + "198.18.5.1", prefix + "198.18.5.3"}


def test_translate_all_reports_a_bad_rule_and_keeps_the_others() -> None:
    translation = _cluster([], [rule({"host": HOST, "subsets": "v1"}, name="bad"), upstream(TLS)])
    (config,) = translation.waypoint_configs
    assert [d.rule for d in config.destination_rules] == ["app/reviews"]
    assert [(s.name, s.field) for s in translation.skipped if s.kind == "DestinationRule"] == [("bad", "spec.subsets")]


SPEC_KEYS = [
    "host",
    "trafficPolicy",
    "subsets",
    "name",
    "labels",
    "tls",
    "mode",
    "loadBalancer",
    "simple",
    "connectionPool",
    "tcp",
    "http",
    "h2UpgradePolicy",
    "maxConnections",
    "portLevelSettings",
    "port",
    "number",
    "outlierDetection",
    "proxyProtocol",
    "version",
    "exportTo",
    "consistentHash",
    "httpHeaderName",
    "sni",
    "credentialName",
    "clientCertificate",
    "privateKey",
    "caCertificates",
    "insecureSkipVerify",
    "workloadSelector",
    "localityLbSetting",
    "enabled",
    "distribute",
    "failover",
    "failoverPriority",
    "from",
    "to",
    "us",
    "us/a",
]
json_values: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 70000)
    | st.sampled_from(["", "v1", "SIMPLE", "MUTUAL", "UPGRADE", "1s", "*", "/c.pem", "us/*", "eu", "us/a"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(SPEC_KEYS), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["host", "trafficPolicy", "subsets", "exportTo"]), json_values) | json_values)
def test_arbitrary_rule_content_is_translated_or_skipped_never_raised(spec: Any) -> None:
    parsed, skips = parse(rule(spec) if isinstance(spec, dict) else {"metadata": {"name": "x"}, "spec": spec})
    assert parsed is not None or skips
    if parsed is not None:
        index = DestinationRuleIndex([parsed], root_namespace=ROOT)
        index.find("app", service())

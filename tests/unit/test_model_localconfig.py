"""The node proxy's local config file: parsing, defaults, errors that name the field, and render round trips."""

from __future__ import annotations

import ipaddress
import textwrap

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ambit.errors import AmbitError
from ambit.model.localconfig import LocalConfig, LocalConfigError, parse_local_config, render_local_config
from ambit.model.policy import (
    Action,
    Clause,
    Match,
    Policy,
    Rule,
    Scope,
    ServiceAccountMatch,
    StringMatch,
    StringMatchKind,
)
from ambit.model.routing_preference import MAX_ROUTING_SCOPES
from ambit.model.workload import (
    AppProtocol,
    HealthPolicy,
    HealthStatus,
    IPFamilies,
    LoadBalancingMode,
    Locality,
    NetworkAddress,
    NetworkMode,
    PortMapping,
    RoutingScope,
    Service,
    TunnelProtocol,
    Workload,
)

EXAMPLE = textwrap.dedent(
    """\
    workloads:
    - uid: Kubernetes//Pod/apps/web-0
      name: web-0
      namespace: apps
      workloadIps: [198.18.1.5, "fd00:18::5"]
      protocol: HBONE
      serviceAccount: web
      trustDomain: cluster.local
      node: ab12-node1
      network: ""
      canonicalName: web
      canonicalRevision: v1
      workloadName: web
      workloadType: pod
      clusterId: Kubernetes
      status: Healthy
      services:
        apps/web.apps.svc.cluster.local: {80: 8080, 9090: 0}
    services:
    - name: web
      namespace: apps
      hostname: web.apps.svc.cluster.local
      vips: ["/198.19.0.10", "net-b/fd00:19::10"]
      ports: {80: 8080}
      subjectAltNames: ["spiffe://cluster.local/ns/apps/sa/web"]
      healthPolicy: AllowAll
    """
)

MINIMAL_WORKLOAD = "workloads:\n- {uid: u1, name: web-0, namespace: apps}\n"


def test_the_example_file_parses_into_workloads_and_services() -> None:
    config = parse_local_config(EXAMPLE)
    assert config.workloads == (
        Workload(
            uid="Kubernetes//Pod/apps/web-0",
            name="web-0",
            namespace="apps",
            addresses=(ipaddress.ip_address("198.18.1.5"), ipaddress.ip_address("fd00:18::5")),
            tunnel_protocol=TunnelProtocol.HBONE,
            service_account="web",
            node="ab12-node1",
            canonical_name="web",
            canonical_revision="v1",
            workload_name="web",
            services={"apps/web.apps.svc.cluster.local": (PortMapping(80, 8080), PortMapping(9090, 0))},
        ),
    )
    assert config.services == (
        Service(
            name="web",
            namespace="apps",
            hostname="web.apps.svc.cluster.local",
            vips=(
                NetworkAddress("", ipaddress.ip_address("198.19.0.10")),
                NetworkAddress("net-b", ipaddress.ip_address("fd00:19::10")),
            ),
            ports=(PortMapping(80, 8080),),
            subject_alt_names=("spiffe://cluster.local/ns/apps/sa/web",),
            health_policy=HealthPolicy.ALLOW_ALL,
        ),
    )


def test_missing_optional_keys_take_the_model_defaults() -> None:
    text = MINIMAL_WORKLOAD + "services:\n- {name: web, namespace: apps, hostname: web.apps.svc.cluster.local}\n"
    config = parse_local_config(text)
    assert config.workloads == (Workload("u1", "web-0", "apps", ()),)
    assert config.services == (Service("web", "apps", "web.apps.svc.cluster.local"),)
    workload = config.workloads[0]
    assert workload.tunnel_protocol is TunnelProtocol.NONE
    assert workload.status is HealthStatus.HEALTHY
    assert str(workload.identity) == "spiffe://cluster.local/ns/apps/sa/default"


def test_explicit_nulls_take_the_defaults_too() -> None:
    text = "workloads:\n- {uid: u1, name: n, namespace: apps, protocol: null, workloadIps: null, services: ~}\n"
    assert parse_local_config(text).workloads == (Workload("u1", "n", "apps", ()),)


def test_tcp_protocol_means_no_tunnel() -> None:
    text = "workloads:\n- {uid: u1, name: n, namespace: apps, protocol: TCP}\n"
    assert parse_local_config(text).workloads[0].tunnel_protocol is TunnelProtocol.NONE


def test_empty_proto3_style_identity_fields_are_accepted_and_mean_the_defaults() -> None:
    text = 'workloads:\n- {uid: u1, name: n, namespace: apps, trustDomain: "", serviceAccount: ""}\n'
    workload = parse_local_config(text).workloads[0]
    assert str(workload.identity) == "spiffe://cluster.local/ns/apps/sa/default"


@pytest.mark.parametrize("text", ["", "   \n", "# only a comment\n", "---\n", "workloads:\nservices: []\n"])
def test_an_empty_document_is_an_empty_config(text: str) -> None:
    assert parse_local_config(text) == LocalConfig((), ())


def test_json_style_string_port_keys_are_accepted() -> None:
    text = '{"services": [{"name": "w", "namespace": "a", "hostname": "h", "ports": {"80": 8080}}]}'
    assert parse_local_config(text).services[0].ports == (PortMapping(80, 8080),)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- a\n", r"^\(top level\): expected a mapping, got list"),
        ("policy: []\n", r"^\(top level\): unknown key\(s\) 'policy'"),
        ("workloads: {}\n", r"^workloads: expected a list"),
        ("policies: [{namespace: a}]\n", r"^policies\[0\]\.name: required"),
        ("policies: [{name: p, namespace: a, scope: POD}]\n", r"^policies\[0\]\.scope: expected one of GLOBAL"),
        ("policies: [{name: p, namespace: a, action: AUDIT}]\n", r"^policies\[0\]\.action: expected one of ALLOW"),
        ("policies: [{name: p, namespace: a, dryRun: yes please}]\n", r"^policies\[0\]\.dryRun: expected true"),
        (
            "policies: [{name: p, namespace: a, rules: [{clauses: [{matches: [{sourceIps: [10.0.0.1/8]}]}]}]}]\n",
            r"^policies\[0\]\.rules\[0\]\.clauses\[0\]\.matches\[0\]\.sourceIps\[0\]: not a CIDR with host bits clear",
        ),
        (
            "policies: [{name: p, namespace: a, rules: [{clauses: [{matches: [{destinationPorts: [0]}]}]}]}]\n",
            r"^policies\[0\]\.rules\[0\]\.clauses\[0\]\.matches\[0\]\.destinationPorts\[0\]: expected a port",
        ),
        (
            "policies: [{name: p, namespace: a, rules: [{clauses: [{matches: [{serviceAccounts: [sa]}]}]}]}]\n",
            r"^policies\[0\]\.rules\[0\]\.clauses\[0\]\.matches\[0\]\.serviceAccounts\[0\]: 'sa' is not",
        ),
        (
            "policies: [{name: p, namespace: a, rules: [{clauses: [{matches: "
            "[{principals: [{exact: a, prefix: b}]}]}]}]}]\n",
            r"^policies\[0\]\.rules\[0\]\.clauses\[0\]\.matches\[0\]\.principals\[0\]: expected a pattern string",
        ),
        (
            "policies: [{name: p, namespace: a, rules: [{clauses: [{matches: [{ports: [80]}]}]}]}]\n",
            r"^policies\[0\]\.rules\[0\]\.clauses\[0\]\.matches\[0\]: unknown key\(s\) 'ports'",
        ),
        ("policies: [{name: p, namespace: a}, {name: p, namespace: a}]\n", r"^policies\[1\]: duplicate policy"),
        ("workloads: [3]\n", r"^workloads\[0\]: expected a mapping, got int 3"),
        ("workloads:\n- {name: n, namespace: a}\n", r"^workloads\[0\]\.uid: required"),
        ("workloads:\n- {uid: u, namespace: a}\n", r"^workloads\[0\]\.name: required"),
        ("workloads:\n- {uid: u, name: n}\n", r"^workloads\[0\]\.namespace: required"),
        ('workloads:\n- {uid: u, name: "", namespace: a}\n', r"^workloads\[0\]\.name: must not be empty"),
        ("workloads:\n- {uid: u, name: 12, namespace: a}\n", r"^workloads\[0\]\.name: expected a string, got int"),
        ('workloads:\n- {uid: "a\\tb", name: n, namespace: a}\n', r"^workloads\[0\]\.uid: has unprintable"),
        (
            MINIMAL_WORKLOAD + "- {uid: u2, name: n, namespace: a, podIP: x}\n",
            r"^workloads\[1\]: unknown key\(s\) 'podIP'",
        ),
        (
            "workloads:\n- {uid: u, name: n, namespace: a, workloadIps: [1.2.3.4, x]}\n",
            r"^workloads\[0\]\.workloadIps\[1\]: not an IP address: 'x'$",
        ),
        (
            "workloads:\n- {uid: u, name: n, namespace: a, workloadIps: [7]}\n",
            r"^workloads\[0\]\.workloadIps\[0\]: expected a string, got int 7",
        ),
        (
            'workloads:\n- {uid: u, name: n, namespace: a, workloadIps: ["fe80::1%eth0"]}\n',
            r"^workloads\[0\]\.workloadIps\[0\]: IP address has a zone id",
        ),
        (
            "workloads:\n- {uid: u, name: n, namespace: a, workloadIps: 1.2.3.4}\n",
            r"^workloads\[0\]\.workloadIps: expected a list",
        ),
        (
            "workloads:\n- {uid: u, name: n, namespace: a, protocol: mtls}\n",
            r"^workloads\[0\]\.protocol: expected one of HBONE, TCP",
        ),
        (
            "workloads:\n- {uid: u, name: n, namespace: a, status: Ready}\n",
            r"^workloads\[0\]\.status: expected one of Healthy, Unhealthy",
        ),
        (
            "workloads:\n- {uid: u, name: n, namespace: a, workloadType: Pod}\n",
            r"^workloads\[0\]\.workloadType: expected one of",
        ),
        (
            "workloads:\n- {uid: u, name: n, namespace: a b}\n",
            r"^workloads\[0\]\.namespace: namespace 'a b' has characters",
        ),
        (
            "workloads:\n- {uid: u, name: n, namespace: a, serviceAccount: a/b}\n",
            r"^workloads\[0\]\.serviceAccount: service account",
        ),
        (
            "workloads:\n- {uid: u, name: n, namespace: a, trustDomain: Big.TD}\n",
            r"^workloads\[0\]\.trustDomain: trust domain",
        ),
        ("workloads:\n- {uid: u, name: n, namespace: a, network: 3}\n", r"^workloads\[0\]\.network: expected a string"),
        (
            "workloads:\n- {uid: u, name: n, namespace: a, services: {web: {80: 8080}}}\n",
            r"^workloads\[0\]\.services: key 'web' is not 'namespace/hostname'",
        ),
        (
            "workloads:\n- {uid: u, name: n, namespace: a, services: {a/web: [80]}}\n",
            r"^workloads\[0\]\.services\[a/web\]: expected a mapping, got list",
        ),
        (
            "workloads:\n- {uid: u, name: n, namespace: a, services: {a/web: {80: 70000}}}\n",
            r"^workloads\[0\]\.services\[a/web\]\[80\]: expected a port number 0\.\.65535, got int 70000",
        ),
        (
            "workloads:\n- {uid: u, name: n, namespace: a, services: {a/web: {0: 80}}}\n",
            r"^workloads\[0\]\.services\[a/web\]\[0\]: service port: expected a port number 1\.\.65535",
        ),
        (
            "workloads:\n- {uid: u, name: n, namespace: a, services: {a/web: {80: true}}}\n",
            r"^workloads\[0\]\.services\[a/web\]\[80\]: expected a port number 0\.\.65535, got bool True",
        ),
        (
            "workloads:\n- {uid: u, name: n, namespace: a, services: {a/web: {'80': 1, 80: 2}}}\n",
            r"^workloads\[0\]\.services\[a/web\]: a service port is given twice",
        ),
        (
            MINIMAL_WORKLOAD + "- {uid: u1, name: other, namespace: apps}\n",
            r"^workloads\[1\]\.uid: duplicate uid 'u1' \(first at workloads\[0\]\)",
        ),
        ("services:\n- {namespace: a, hostname: h}\n", r"^services\[0\]\.name: required"),
        ("services:\n- {name: s, namespace: a}\n", r"^services\[0\]\.hostname: required"),
        (
            "services:\n- {name: s, namespace: a, hostname: h, selector: {}}\n",
            r"^services\[0\]: unknown key\(s\) 'selector'",
        ),
        (
            "services:\n- {name: s, namespace: a, hostname: h, vips: [/x]}\n",
            r"^services\[0\]\.vips\[0\]: not an IP address: 'x'",
        ),
        (
            "services:\n- {name: s, namespace: a, hostname: h, vips: [{a: 1}]}\n",
            r"^services\[0\]\.vips\[0\]: expected a string",
        ),
        (
            "services:\n- {name: s, namespace: a, hostname: h, ports: {80: -1}}\n",
            r"^services\[0\]\.ports\[80\]: expected a port number",
        ),
        (
            "services:\n- {name: s, namespace: a, hostname: h, ports: {http: 80}}\n",
            r"^services\[0\]\.ports\['http'\]: service port",
        ),
        (
            "services:\n- {name: s, namespace: a, hostname: h, healthPolicy: Any}\n",
            r"^services\[0\]\.healthPolicy: expected one of OnlyHealthy, AllowAll",
        ),
        (
            'services:\n- {name: s, namespace: a, hostname: h, subjectAltNames: [""]}\n',
            r"^services\[0\]\.subjectAltNames\[0\]: must not be empty",
        ),
        (
            "services:\n- {name: s, namespace: a, hostname: h, subjectAltNames: x}\n",
            r"^services\[0\]\.subjectAltNames: expected a list",
        ),
        (
            "services:\n- {name: s, namespace: a, hostname: h, routingPreferences: [Zone, Rack]}\n",
            r"^services\[0\]\.routingPreferences\[1\]: expected one of Region, Zone, Subzone, Node, Cluster, Network",
        ),
        (
            "services:\n- {name: s, namespace: a, hostname: h, routingPreferences: Zone}\n",
            r"^services\[0\]\.routingPreferences: expected a list",
        ),
        (
            "services:\n- {name: s, namespace: a, hostname: h, routingPreferences: [" + "Zone, " * 7 + "Zone]}\n",
            r"^services\[0\]\.routingPreferences: 8 scopes, more than 6",
        ),
        (
            "services:\n- {name: s, namespace: a, hostname: h}\n- {name: t, namespace: a, hostname: h}\n",
            r"^services\[1\]: duplicate service namespace/hostname 'a/h' \(first at services\[0\]\)",
        ),
    ],
)
def test_bad_input_is_rejected_naming_the_field(text: str, message: str) -> None:
    with pytest.raises(LocalConfigError, match=message):
        parse_local_config(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("workloads: [\n  {uid: a\n", r"^YAML line \d+, column \d+: "),
        ("workloads:\n  - uid: a\n   name: b\n", r"^YAML line 3, column \d+: "),
        ("a: b: c\n", r"^YAML line 1, column 5: "),
        ("workloads:\n- {uid: a, uid: b}\n", r"^YAML line 2, column 12: duplicate key 'uid'"),
        ("x: *nothing\n", r"^YAML line 1, column 4: YAML aliases are not allowed"),
        ("a: &a [1]\nb: *a\n", r"^YAML line 2, column 4: YAML aliases are not allowed"),
        ("x: !!python/object:os.system {}\n", r"^YAML line 1, column 4: "),
        ("x: 2020-13-45\n", r"^YAML: month must be in 1\.\.12"),
        ("x: \x00\n", r"^YAML"),
        ("[" * 5000 + "]" * 5000, r"^YAML"),
    ],
)
def test_yaml_syntax_errors_are_local_config_errors_with_the_line(text: str, message: str) -> None:
    with pytest.raises(LocalConfigError, match=message):
        parse_local_config(text)


def test_local_config_error_is_an_ambit_error() -> None:
    assert issubclass(LocalConfigError, AmbitError)


def test_the_example_round_trips_through_render() -> None:
    config = parse_local_config(EXAMPLE)
    assert parse_local_config(render_local_config(config)) == config


def test_render_writes_camel_case_keys_in_file_order() -> None:
    rendered = yaml.safe_load(render_local_config(parse_local_config(EXAMPLE)))
    assert list(rendered) == ["workloads", "services"]
    assert list(rendered["workloads"][0])[:4] == ["uid", "name", "namespace", "workloadIps"]
    assert rendered["workloads"][0]["services"] == {"apps/web.apps.svc.cluster.local": {80: 8080, 9090: 0}}
    assert rendered["services"][0]["vips"] == ["/198.19.0.10", "net-b/fd00:19::10"]


def test_render_refuses_ports_a_mapping_cannot_hold() -> None:
    config = LocalConfig((), (Service("s", "a", "h", ports=(PortMapping(80, 1), PortMapping(80, 2))),))
    with pytest.raises(LocalConfigError, match="given twice"):
        render_local_config(config)


def test_an_empty_config_renders_and_parses_back() -> None:
    assert parse_local_config(render_local_config(LocalConfig((), ()))) == LocalConfig((), ())


# Hypothesis: the parser never lets a foreign exception out, and render/parse round-trip.


def _parse_or_local_config_error(text: str) -> None:
    """Parse ``text``; a LocalConfigError is fine, anything else fails, and what parses must round-trip."""
    try:
        config = parse_local_config(text)
    except LocalConfigError:
        return
    assert parse_local_config(render_local_config(config)) == config


@given(st.text())
def test_random_text_parses_or_raises_local_config_error(text: str) -> None:
    _parse_or_local_config_error(text)


@given(st.binary())
def test_random_bytes_decoded_parse_or_raise_local_config_error(data: bytes) -> None:
    _parse_or_local_config_error(data.decode("utf-8", errors="replace"))


_FIELD_NAMES = [
    "uid", "name", "namespace", "workloadIps", "protocol", "serviceAccount", "trustDomain", "node", "network",
    "status", "services", "hostname", "vips", "ports", "subjectAltNames", "healthPolicy", "workloadType", "bogus",
    "networkMode", "locality", "region", "zone", "subzone", "canonical", "ipFamilies", "targetPort", "appProtocol",
]  # fmt: skip
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-10, 70000),
    st.floats(allow_nan=False),
    st.sampled_from(["HBONE", "TCP", "Healthy", "AllowAll", "a/b", "/1.2.3.4", "::1", "1.2.3.4", "", "x y", "pod"]),
    st.sampled_from(["HostNetwork", "Standard", "Dual", "IPv6Only", "HTTP11", "GRPC", "Unknown"]),
    st.text(max_size=8),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.one_of(st.sampled_from(_FIELD_NAMES), st.integers(-1, 70000), st.text(max_size=5)), inner, max_size=5
        ),
    ),
    max_leaves=20,
)
_POLICY_NAMES = [
    "name", "namespace", "scope", "action", "dryRun", "rules", "clauses", "matches", "principals", "notPrincipals",
    "namespaces", "serviceAccounts", "sourceIps", "notDestinationIps", "destinationPorts", "exact", "prefix",
    "presence", "GLOBAL", "DENY",
]  # fmt: skip
_policy_values = st.recursive(
    st.one_of(_scalars, st.sampled_from(["10.0.0.0/8", "1.2.3.4/8", "ns/sa", "*", "a*", "DENY", "NAMESPACE"])),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(st.sampled_from(_POLICY_NAMES), st.text(max_size=5)), inner, max_size=5),
    ),
    max_leaves=25,
)
_documents = st.fixed_dictionaries(
    {},
    optional={
        "workloads": st.lists(_values, max_size=3),
        "services": st.lists(_values, max_size=3),
        "policies": st.lists(_policy_values, max_size=3),
    },
)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(_documents)
def test_structurally_plausible_documents_parse_or_raise_local_config_error(document: dict[str, object]) -> None:
    _parse_or_local_config_error(yaml.safe_dump(document))


_printable = st.text(st.characters(categories=("L", "N", "P", "S"), include_characters=" "), max_size=12)
_names = _printable.filter(bool)
_segments = st.from_regex(r"[A-Za-z0-9._-]{1,12}", fullmatch=True).filter(lambda s: s not in {".", ".."})
_ips = st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6))
_port_lists = st.lists(
    st.builds(PortMapping, st.integers(1, 65535), st.integers(0, 65535), st.sampled_from(AppProtocol)),
    max_size=3,
    unique_by=lambda p: p.service_port,
).map(tuple)
_service_keys = st.builds(lambda ns, host: f"{ns}/{host}", _segments, _names)
_workloads = st.builds(
    Workload,
    uid=_names,
    name=_names,
    namespace=_segments,
    addresses=st.lists(_ips, max_size=3).map(tuple),
    network=_printable,
    tunnel_protocol=st.sampled_from(TunnelProtocol),
    trust_domain=st.one_of(st.just(""), st.from_regex(r"[a-z0-9._-]{1,12}", fullmatch=True)),
    service_account=st.one_of(st.just(""), _segments),
    node=_printable,
    canonical_name=_printable,
    canonical_revision=_printable,
    workload_name=_printable,
    workload_type=st.sampled_from(["deployment", "cronjob", "pod", "job"]),
    cluster_id=_printable,
    status=st.sampled_from(HealthStatus),
    services=st.dictionaries(_service_keys, _port_lists, max_size=3),
    network_mode=st.sampled_from(NetworkMode),
    locality=st.builds(Locality, _printable, _printable, _printable),
    capacity=st.integers(0, 0xFFFFFFFF),
)
_services = st.builds(
    Service,
    name=_names,
    namespace=_segments,
    hostname=_names,
    vips=st.lists(st.builds(NetworkAddress, _printable, _ips), max_size=3).map(tuple),
    ports=_port_lists,
    subject_alt_names=st.lists(_names, max_size=2).map(tuple),
    health_policy=st.sampled_from(HealthPolicy),
    canonical=st.booleans(),
    ip_families=st.sampled_from(IPFamilies),
    load_balancing_mode=st.sampled_from(LoadBalancingMode),
    routing_preference=st.lists(st.sampled_from(RoutingScope), max_size=MAX_ROUTING_SCOPES).map(tuple),
)
_string_matches = st.one_of(
    st.just(StringMatch.presence()),
    st.builds(
        StringMatch, st.sampled_from([k for k in StringMatchKind if k is not StringMatchKind.PRESENCE]), _printable
    ),
)
_cidrs = st.one_of(
    st.builds(lambda ip, n: ipaddress.ip_network(f"{ip}/{n % 33}", strict=False), st.ip_addresses(v=4), st.integers(0)),
    st.builds(
        lambda ip, n: ipaddress.ip_network(f"{ip}/{n % 129}", strict=False), st.ip_addresses(v=6), st.integers(0)
    ),
)
_accounts = st.builds(ServiceAccountMatch, _segments, _names)
_policy_ports = st.lists(st.integers(1, 65535), max_size=2).map(tuple)


def _few(strategy: st.SearchStrategy[object]) -> st.SearchStrategy[tuple[object, ...]]:
    return st.lists(strategy, max_size=2).map(tuple)


_matches = st.builds(
    Match,
    namespaces=_few(_string_matches),
    not_namespaces=_few(_string_matches),
    service_accounts=_few(_accounts),
    not_service_accounts=_few(_accounts),
    principals=_few(_string_matches),
    not_principals=_few(_string_matches),
    source_ips=_few(_cidrs),
    not_source_ips=_few(_cidrs),
    destination_ips=_few(_cidrs),
    not_destination_ips=_few(_cidrs),
    destination_ports=_policy_ports,
    not_destination_ports=_policy_ports,
)
_rules = st.builds(Rule, _few(st.builds(Clause, _few(_matches))))
_policies = st.builds(
    Policy,
    name=_names,
    namespace=_names,
    scope=st.sampled_from([Scope.GLOBAL, Scope.NAMESPACE, Scope.WORKLOAD_SELECTOR]),
    action=st.sampled_from([Action.ALLOW, Action.DENY]),
    rules=_few(_rules),
    dry_run=st.booleans(),
)
_configs = st.builds(
    LocalConfig,
    st.lists(_workloads, max_size=4, unique_by=lambda w: w.uid).map(tuple),
    st.lists(_services, max_size=4, unique_by=lambda s: s.key).map(tuple),
    st.lists(_policies, max_size=3, unique_by=lambda p: p.key).map(tuple),
)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(_configs)
def test_every_config_round_trips_through_render_and_parse(config: LocalConfig) -> None:
    assert parse_local_config(render_local_config(config)) == config


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(_configs, st.data())
def test_a_valid_file_with_one_field_replaced_parses_or_raises_local_config_error(
    config: LocalConfig, data: st.DataObject
) -> None:
    document = yaml.safe_load(render_local_config(config))
    items = [item for section in ("workloads", "services", "policies") for item in document.get(section, ())]
    if items:
        item = data.draw(st.sampled_from(items))
        key = data.draw(st.sampled_from([*item, "bogus"]))
        item[key] = data.draw(_values)
    _parse_or_local_config_error(yaml.safe_dump(document))


def test_policies_render_in_pattern_form_and_an_exact_value_with_a_star_as_a_mapping() -> None:
    policy = Policy(
        "p",
        "ns",
        Scope.NAMESPACE,
        Action.DENY,
        (Rule((Clause((Match(principals=(StringMatch.of_pattern("*/sa/x"), StringMatch.exact("a*"))),)),)),),
    )
    text = render_local_config(LocalConfig((), (), (policy,)))
    assert "- '*/sa/x'" in text and "exact: a*" in text
    assert parse_local_config(text).policies == (policy,)


def test_a_port_with_an_app_protocol_is_a_mapping_and_a_bare_number_is_unknown() -> None:
    config = parse_local_config(
        textwrap.dedent(
            """\
            services:
            - name: web
              namespace: shop
              hostname: web.shop.svc.cluster.local
              ports: {80: 8080, 9090: {targetPort: 0, appProtocol: GRPC}}
              canonical: true
              ipFamilies: Dual
            workloads:
            - uid: Kubernetes//Pod/shop/host-1
              name: host-1
              namespace: shop
              networkMode: HostNetwork
              locality: {region: r1, zone: z1}
            """
        )
    )
    (service,) = config.services
    assert service.ports == (PortMapping(80, 8080), PortMapping(9090, 0, AppProtocol.GRPC))
    assert service.canonical and service.ip_families is IPFamilies.DUAL
    (workload,) = config.workloads
    assert workload.network_mode is NetworkMode.HOST_NETWORK and workload.locality == Locality("r1", "z1", "")


@pytest.mark.parametrize(
    ("fragment", "message"),
    [
        ("ports: {80: {targetPort: 1, appProtocol: SPDY}}", r"services\[0\].ports\[80\].appProtocol: expected one of"),
        ("ports: {80: {appProtocol: HTTP11}}", r"services\[0\].ports\[80\].targetPort: required"),
        ("ports: {80: {targetPort: 1, bogus: 2}}", r"services\[0\].ports\[80\]: unknown key"),
        ("ipFamilies: IPv5", r"services\[0\].ipFamilies: expected one of"),
        ("canonical: yes please", r"services\[0\].canonical: expected true or false"),
    ],
)
def test_bad_new_service_fields_are_rejected_naming_the_field(fragment: str, message: str) -> None:
    text = "services:\n- {name: web, namespace: shop, hostname: web.shop}\n"
    document = yaml.safe_load(text)
    document["services"][0].update(yaml.safe_load(fragment))
    with pytest.raises(LocalConfigError, match=message):
        parse_local_config(yaml.safe_dump(document))


@pytest.mark.parametrize(
    ("fragment", "message"),
    [
        ("networkMode: Host", r"workloads\[0\].networkMode: expected one of Standard, HostNetwork"),
        ("locality: {region: r, planet: earth}", r"workloads\[0\].locality: unknown key"),
        ("locality: us-east", r"workloads\[0\].locality: expected a mapping"),
        ("locality: {zone: 3}", r"workloads\[0\].locality.zone: expected a string"),
    ],
)
def test_bad_new_workload_fields_are_rejected_naming_the_field(fragment: str, message: str) -> None:
    document = {"workloads": [{"uid": "u", "name": "n", "namespace": "ns", **yaml.safe_load(fragment)}]}
    with pytest.raises(LocalConfigError, match=message):
        parse_local_config(yaml.safe_dump(document))


def test_a_routing_preference_is_written_in_ztunnels_spelling_only_when_set() -> None:
    text = (
        "services:\n- {name: s, namespace: a, hostname: h, loadBalancingMode: Failover,"
        " routingPreferences: [Network, Region, Zone]}\n"
    )
    (service,) = parse_local_config(text).services
    assert service.routing_preference == (RoutingScope.NETWORK, RoutingScope.REGION, RoutingScope.ZONE)
    assert service.load_balancing_mode is LoadBalancingMode.FAILOVER
    assert "routingPreferences:\n  - Network\n  - Region\n  - Zone" in render_local_config(LocalConfig((), (service,)))
    plain = Service(name="s", namespace="a", hostname="h")
    assert "routingPreferences" not in render_local_config(LocalConfig((), (plain,)))

"""The WaypointConfig codec (:mod:`ambit.xds.routes`): model → proto → model is the identity (hypothesis), and a
peer's bad resource is refused with one clear error naming the field, never a traceback."""

from __future__ import annotations

import contextlib
import re
from typing import Any

import pytest
from google.protobuf import any_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.api import waypoint_pb2 as pb
from ambit.model import destination_policy as dr
from ambit.model.locality_lb import LocalityDistribute, LocalityFailover, LocalityLbSetting
from ambit.model.route_matches import (
    PSEUDO_HEADERS,
    ClaimMatch,
    PathMatch,
    PathMatchType,
    RouteMatch,
    ValueMatch,
    ValueMatchType,
)
from ambit.model.routes import (
    BackendService,
    CorsPolicy,
    DirectResponse,
    Fault,
    HeaderModifier,
    PathModifier,
    PathModifierType,
    RegexRewrite,
    RequestMirror,
    RequestRedirect,
    RetryPolicy,
    RouteRule,
    RouteTable,
    Timeouts,
    URLRewrite,
    WaypointConfig,
    WeightedBackend,
)
from ambit.xds.errors import XdsConversionError
from ambit.xds.route_reader import MAX_CORS_AGE
from ambit.xds.routes import (
    WAYPOINT_CONFIG_TYPE_URL,
    decode_waypoint_config,
    pack_waypoint_config,
    waypoint_config_to_proto,
)

TOKEN = st.text("abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=1, max_size=12)
PRINTABLE = st.text(st.characters(codec="utf-8", categories=["L", "N", "P", "S"], include_characters=" "), max_size=16)
"""What the decoder calls printable (str.isprintable: of the spaces only " "; U+00A0 is not)."""
HEADER_VALUE = st.text(st.characters(codec="utf-8", exclude_characters="\r\n\x00"), max_size=16)
SECONDS = st.integers(0, 10_000_000).map(lambda ms: ms / 1000)
REGEXES = st.sampled_from(["/api/v[0-9]+", "^[a-f0-9]+$", ".*", "/[^/]+/Echo", "a|b"])
PORT = st.integers(1, 65535)

backends = st.builds(
    BackendService, TOKEN, TOKEN.map(lambda t: f"{t}.app.svc.cluster.local"), PORT, st.sampled_from(["", "v1", "v-2"])
)
header_modifiers = st.builds(
    HeaderModifier,
    set=st.lists(st.tuples(TOKEN, HEADER_VALUE), max_size=2).map(tuple),
    add=st.lists(st.tuples(TOKEN, HEADER_VALUE), max_size=2).map(tuple),
    remove=st.lists(TOKEN, max_size=2).map(tuple),
)
path_matches = st.one_of(
    st.builds(
        PathMatch, st.sampled_from([PathMatchType.EXACT, PathMatchType.PATH_PREFIX]), TOKEN.map(lambda t: "/" + t)
    ),
    st.builds(PathMatch, st.just(PathMatchType.REGULAR_EXPRESSION), REGEXES),
    st.builds(PathMatch, st.just(PathMatchType.PREFIX), PRINTABLE),
)
value_matches = st.one_of(
    st.builds(ValueMatch, TOKEN, HEADER_VALUE, st.sampled_from([ValueMatchType.EXACT, ValueMatchType.PREFIX])),
    st.builds(ValueMatch, TOKEN, st.just(""), st.just(ValueMatchType.PRESENT)),
    st.builds(ValueMatch, TOKEN, REGEXES, st.just(ValueMatchType.REGULAR_EXPRESSION)),
)
header_matches = value_matches | st.builds(
    ValueMatch, st.sampled_from(sorted(PSEUDO_HEADERS)), HEADER_VALUE, st.just(ValueMatchType.EXACT)
)
claim_matches = st.builds(
    ClaimMatch,
    st.lists(TOKEN, min_size=1, max_size=3).map(tuple),
    HEADER_VALUE,
    st.sampled_from([ValueMatchType.EXACT, ValueMatchType.PREFIX, ValueMatchType.PRESENT]),
) | st.builds(
    ClaimMatch,
    st.lists(TOKEN, min_size=1, max_size=3).map(tuple),
    REGEXES,
    st.just(ValueMatchType.REGULAR_EXPRESSION),
)
matches = st.builds(
    RouteMatch,
    path=st.none() | path_matches,
    headers=st.lists(header_matches, max_size=2).map(tuple),
    query_params=st.lists(value_matches, max_size=2).map(tuple),
    method=st.none() | st.sampled_from(["GET", "POST", "DELETE"]),
    ignore_path_case=st.booleans(),
    without_headers=st.lists(header_matches, max_size=2).map(tuple),
    claims=st.lists(claim_matches, max_size=2).map(tuple),
    without_claims=st.lists(claim_matches, max_size=2).map(tuple),
)
PERCENT = st.floats(0.0, 100.0, allow_nan=False)
faults = st.builds(Fault, SECONDS, PERCENT, st.just(0) | st.integers(200, 599), PERCENT) | st.builds(
    Fault, SECONDS, PERCENT, st.just(0), PERCENT, st.integers(0, 16)
)
direct_responses = st.builds(DirectResponse, st.integers(200, 599), st.binary(max_size=32))
path_modifiers = st.builds(PathModifier, st.sampled_from(list(PathModifierType)), TOKEN.map(lambda t: "/" + t))
origin_matches = st.one_of(
    st.builds(
        ValueMatch,
        st.just("origin"),
        HEADER_VALUE.filter(bool),
        st.sampled_from([ValueMatchType.EXACT, ValueMatchType.PREFIX]),
    ),
    st.builds(ValueMatch, st.just("origin"), REGEXES, st.just(ValueMatchType.REGULAR_EXPRESSION)),
)
cors_policies = st.builds(
    CorsPolicy,
    allow_origins=st.lists(origin_matches, max_size=3).map(tuple),
    allow_methods=HEADER_VALUE,
    allow_headers=HEADER_VALUE,
    expose_headers=HEADER_VALUE,
    max_age=st.none() | st.integers(0, MAX_CORS_AGE),
    allow_credentials=st.booleans(),
    forward_unmatched_preflights=st.booleans(),
)
redirects = st.builds(
    RequestRedirect,
    scheme=st.none() | st.sampled_from(["http", "https"]),
    hostname=st.none() | TOKEN,
    path=st.none() | path_modifiers,
    port=st.none() | PORT,
    status_code=st.sampled_from([301, 302, 303, 307, 308]),
    keeps_host_port=st.booleans(),
)
weighted = st.builds(
    WeightedBackend,
    st.none() | backends,
    st.integers(0, 1000),
    st.none() | header_modifiers,
    st.none() | header_modifiers,
)
rules = st.builds(
    RouteRule,
    route=TOKEN.map(lambda t: f"HTTPRoute/app/{t}"),
    match=matches,
    backends=st.lists(weighted, max_size=3).map(tuple),
    request_headers=st.none() | header_modifiers,
    response_headers=st.none() | header_modifiers,
    redirect=st.none() | redirects,
    rewrite=st.none() | st.builds(URLRewrite, st.none() | TOKEN, st.none() | path_modifiers),
    mirrors=st.lists(st.builds(RequestMirror, backends, st.floats(0.0, 100.0, allow_nan=False)), max_size=2).map(tuple),
    timeouts=st.builds(Timeouts, st.none() | SECONDS, st.none() | SECONDS),
    retry=st.builds(
        RetryPolicy,
        st.integers(0, 10),
        st.lists(st.integers(100, 599), max_size=3).map(tuple),
        SECONDS,
        st.booleans(),
    ),
    rule_name=st.just("") | TOKEN,
    fault=st.none() | faults,
    direct_response=st.none() | direct_responses,
    missing_backend_status=st.sampled_from([500, 503]),
    regex_rewrite=st.none() | st.builds(RegexRewrite, REGEXES, PRINTABLE),
    cors=st.none() | cors_policies,
)
tables = st.builds(
    RouteTable,
    service_key=TOKEN.map(lambda t: f"app/{t}.app.svc.cluster.local"),
    port=PORT,
    http=st.lists(rules, max_size=3).map(tuple),
    tcp_backends=st.lists(weighted, max_size=2).map(tuple),
    hostnames=st.lists(TOKEN, max_size=2).map(tuple),
)
configs = st.builds(
    WaypointConfig,
    st.just("app/waypoint"),
    st.lists(tables, max_size=3).map(tuple),
    xfcc_client_identity=st.booleans(),
    services=st.lists(TOKEN.map(lambda t: f"app/{t}.app.svc.cluster.local"), max_size=3, unique=True).map(
        lambda keys: tuple(sorted(keys))
    ),
    race_first_connect=st.lists(TOKEN.map(lambda t: f"app/{t}.example.com"), max_size=3, unique=True).map(
        lambda keys: tuple(sorted(keys))
    ),
    dynamic_dns=st.lists(TOKEN.map(lambda t: f"app/*.{t}.example.com"), max_size=3, unique=True).map(
        lambda keys: tuple(sorted(keys))
    ),
)


@settings(max_examples=100, deadline=None)
@given(configs)
def test_model_to_proto_and_back_is_the_identity(config: WaypointConfig) -> None:
    body = pack_waypoint_config(waypoint_config_to_proto(config))
    assert body.type_url == WAYPOINT_CONFIG_TYPE_URL
    assert decode_waypoint_config("app/waypoint", body) == config


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_fail_with_a_conversion_error(raw: bytes) -> None:
    with contextlib.suppress(XdsConversionError):
        decode_waypoint_config("app/waypoint", any_pb2.Any(type_url=WAYPOINT_CONFIG_TYPE_URL, value=raw))


def encoded(**rule: Any) -> any_pb2.Any:
    message = pb.WaypointConfig(
        waypoint="app/waypoint",
        tables=[pb.RouteTable(service_key="app/r.app.svc.cluster.local", port=80, http=[pb.RouteRule(**rule)])],
    )
    return any_pb2.Any(type_url=WAYPOINT_CONFIG_TYPE_URL, value=message.SerializeToString())


@pytest.mark.parametrize(
    ("rule", "field"),
    [
        ({"match": pb.RouteMatch(path=pb.PathMatch(kind=pb.PATH_REGULAR_EXPRESSION, value="(["))}, "match.path.value"),
        ({"match": pb.RouteMatch(path=pb.PathMatch(kind=pb.PATH_EXACT, value="x"))}, "match.path.value"),
        ({"match": pb.RouteMatch(path=pb.PathMatch(value="/"))}, "match.path.kind"),
        ({"match": pb.RouteMatch(headers=[pb.ValueMatch(name="bad name", value="v")])}, "match.headers[0].name"),
        ({"match": pb.RouteMatch(headers=[pb.ValueMatch(name=":status", value="200")])}, "match.headers[0].name"),
        ({"match": pb.RouteMatch(headers=[pb.ValueMatch(name="x-team\n", value="v")])}, "match.headers[0].name"),
        ({"request_headers": pb.HeaderModifier(remove=["x-team\n"])}, "request_headers.remove[0]"),
        ({"match": pb.RouteMatch(claims=[pb.ClaimMatch(value="x")])}, "match.claims[0].path"),
        ({"match": pb.RouteMatch(claims=[pb.ClaimMatch(path=["a"] * 17)])}, "match.claims[0].path"),
        ({"match": pb.RouteMatch(without_claims=[pb.ClaimMatch(path=["a", ""])])}, "match.without_claims[0].path[1]"),
        (
            {"match": pb.RouteMatch(claims=[pb.ClaimMatch(path=["a"], value="(", kind=pb.VALUE_REGULAR_EXPRESSION)])},
            "match.claims[0].value",
        ),
        ({"match": pb.RouteMatch(claims=[pb.ClaimMatch(path=["a"], kind=9)])}, "match.claims[0].kind"),
        (
            {"request_headers": pb.HeaderModifier(set=[pb.HeaderValue(name="x", value="a\r\nb: c")])},
            "request_headers.set[0].value",
        ),
        ({"redirect": pb.RequestRedirect(status_code=200)}, "redirect.status_code"),
        (
            {"backends": [pb.WeightedBackend(backend=pb.BackendService(namespace="app", hostname="h"))]},
            "backends[0].backend.port",
        ),
        (
            {
                "mirrors": [
                    pb.RequestMirror(backend=pb.BackendService(namespace="a", hostname="h", port=1), percent=101)
                ]
            },
            "mirrors[0].percent",
        ),
        (
            {
                "backends": [
                    pb.WeightedBackend(backend=pb.BackendService(namespace="a", hostname="h", port=1, subset="V1"))
                ]
            },
            "backends[0].backend.subset",
        ),
        ({"fault": pb.Fault(abort_status=700)}, "fault.abort_status"),
        ({"fault": pb.Fault(delay_percent=-1)}, "fault.delay_percent"),
        ({"fault": pb.Fault(abort_grpc_status=17)}, "fault.abort_grpc_status"),
        ({"fault": pb.Fault(abort_status=503, abort_grpc_status=14)}, "fault.abort_grpc_status"),
        ({"direct_response": pb.DirectResponse(status=99)}, "direct_response.status"),
        ({"direct_response": pb.DirectResponse(status=200, body=b"x" * 70_000)}, "direct_response.body"),
        ({"missing_backend_status": 404}, "missing_backend_status"),
        ({"regex_rewrite": pb.RegexRewrite(pattern="([", substitution="x")}, "regex_rewrite.pattern"),
        (
            {"cors": pb.CorsPolicy(allow_origins=[pb.ValueMatch(name="origin", kind=pb.VALUE_PRESENT)])},
            "cors.allow_origins[0].value",
        ),
        (
            {
                "cors": pb.CorsPolicy(
                    allow_origins=[pb.ValueMatch(name="origin", value="(", kind=pb.VALUE_REGULAR_EXPRESSION)]
                )
            },
            "cors.allow_origins[0].value",
        ),
        (
            {"cors": pb.CorsPolicy(allow_origins=[pb.ValueMatch(name="origin", kind=9, value="x")])},
            "cors.allow_origins[0].kind",
        ),
        ({"cors": pb.CorsPolicy(allow_methods="GET\r\nSet-Cookie: a=b")}, "cors.allow_methods"),
        ({"cors": pb.CorsPolicy(expose_headers="x\n")}, "cors.expose_headers"),
        ({"cors": pb.CorsPolicy(max_age=MAX_CORS_AGE + 1)}, "cors.max_age"),
        (
            {"match": pb.RouteMatch(without_headers=[pb.ValueMatch(name="a b", kind=pb.VALUE_PRESENT)])},
            "match.without_headers[0].name",
        ),
    ],
)
def test_bad_fields_are_refused_by_name(rule: dict[str, Any], field: str) -> None:
    with pytest.raises(XdsConversionError) as caught:
        decode_waypoint_config("app/waypoint", encoded(**rule))
    assert caught.value.field == f"tables[0].http[0].{field}"


@pytest.mark.parametrize(
    ("services", "problem"),
    [
        ([""], "services[0]: required"),
        (["echo.app.svc.cluster.local"], "services[0]: expected namespace/hostname"),
        (["app/"], "services[0]: expected namespace/hostname"),
        (["/echo.app.svc.cluster.local"], "services[0]: expected namespace/hostname"),
        (["app/echo/x"], "services[0]: expected namespace/hostname"),
        (["app/echo\n"], "services[0]: has unprintable characters"),
        (["app/a", "app/b", "app/a"], "services[2]: 'app/a' is given twice"),
    ],
)
def test_bad_service_listings_are_refused_by_name(services: list[str], problem: str) -> None:
    """A listing is what lets the waypoint serve a Service: a malformed one NACKs the config (the old one stays)."""
    body = pack_waypoint_config(pb.WaypointConfig(waypoint="app/waypoint", services=services))
    with pytest.raises(XdsConversionError, match=re.escape(problem)):
        decode_waypoint_config("app/waypoint", body)


def test_a_service_listing_is_kept_sorted_whatever_order_it_came_in() -> None:
    body = pack_waypoint_config(pb.WaypointConfig(waypoint="app/waypoint", services=["app/b", "app/a", "other/a"]))
    assert decode_waypoint_config("app/waypoint", body).services == ("app/a", "app/b", "other/a")


def test_a_racing_listing_is_read_as_the_service_listing_is() -> None:
    body = pack_waypoint_config(pb.WaypointConfig(waypoint="app/waypoint", race_first_connect=["app/b", "app/a"]))
    assert decode_waypoint_config("app/waypoint", body).race_first_connect == ("app/a", "app/b")
    body = pack_waypoint_config(pb.WaypointConfig(waypoint="app/waypoint", race_first_connect=["app"]))
    with pytest.raises(XdsConversionError, match=re.escape("race_first_connect[0]: expected namespace/hostname")):
        decode_waypoint_config("app/waypoint", body)


def test_a_dynamic_dns_listing_is_read_as_the_service_listing_is() -> None:
    keys = ["app/*.b.example.com", "app/*.a.example.com"]
    body = pack_waypoint_config(pb.WaypointConfig(waypoint="app/waypoint", dynamic_dns=keys))
    assert decode_waypoint_config("app/waypoint", body).dynamic_dns == ("app/*.a.example.com", "app/*.b.example.com")
    for bad in (["*.example.com"], ["app/*.a.example.com", "app/*.a.example.com"], ["app/a\nb"]):
        body = pack_waypoint_config(pb.WaypointConfig(waypoint="app/waypoint", dynamic_dns=bad))
        with pytest.raises(XdsConversionError, match=re.escape("dynamic_dns[")):
            decode_waypoint_config("app/waypoint", body)


def test_a_resource_named_for_another_waypoint_is_refused() -> None:
    body = pack_waypoint_config(waypoint_config_to_proto(WaypointConfig("other/waypoint")))
    with pytest.raises(XdsConversionError, match="describes 'other/waypoint'"):
        decode_waypoint_config("app/waypoint", body)


def test_a_body_of_another_type_is_refused() -> None:
    with pytest.raises(XdsConversionError, match=r"expected type\.googleapis\.com/ambit\.waypoint\.v1\.WaypointConfig"):
        decode_waypoint_config("app/waypoint", any_pb2.Any(type_url="type.googleapis.com/x", value=b""))


def test_a_caller_sees_only_the_waypoint_configs_its_check_allows() -> None:
    from ambit.api import discovery_pb2 as dpb
    from ambit.xds.callers import Caller, CallerView
    from ambit.xds.session import ServerSession
    from ambit.xds.table import WaypointConfigTable

    table = WaypointConfigTable()
    configs = {key: waypoint_config_to_proto(WaypointConfig(key)) for key in ("app/waypoint", "other/waypoint")}
    table.replace({key: ("v1", message) for key, message in configs.items()})
    owner = "system:serviceaccount:app:waypoint"

    def check(caller: Caller, name: str) -> bool:
        return name == "app/waypoint" and caller.name == owner

    own = CallerView(table, check, Caller(owner))
    forged = CallerView(table, check, Caller("system:serviceaccount:app:intruder"))
    assert set(own.current.by_name) == {"app/waypoint"}
    assert forged.current.by_name == {}

    # The forged caller opens wildcard, then subscribes by name: empty answers, the name reported as absent.
    session = ServerSession()
    opened = session.receive(dpb.DeltaDiscoveryRequest(type_url=WAYPOINT_CONFIG_TYPE_URL), forged.current)
    assert [list(r.resources) for r in opened.responses] == [[]]
    later = session.receive(
        dpb.DeltaDiscoveryRequest(type_url=WAYPOINT_CONFIG_TYPE_URL, resource_names_subscribe=["app/waypoint"]),
        forged.current,
    )
    (response,) = later.responses
    assert list(response.resources) == [] and list(response.removed_resources) == ["app/waypoint"]

    # A change is pushed to the owner only; the view is rebuilt when the table's set is replaced.
    table.replace(
        {"app/waypoint": ("v2", configs["app/waypoint"]), "other/waypoint": ("v1", configs["other/waypoint"])}
    )
    assert session.push(WAYPOINT_CONFIG_TYPE_URL, forged.current, {"app/waypoint"}).responses == ()
    owner_session = ServerSession()
    owner_session.receive(
        dpb.DeltaDiscoveryRequest(type_url=WAYPOINT_CONFIG_TYPE_URL, resource_names_subscribe=["app/waypoint"]),
        own.current,
    )
    assert owner_session.held(WAYPOINT_CONFIG_TYPE_URL) == {"app/waypoint": "v2"}


# DestinationRules (WaypointConfig field 6, :mod:`ambit.xds.destinationrules`).


DURATION = st.integers(1, 10_000_000).map(lambda ms: ms / 1000)
LABEL = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,8}[a-z0-9])?", fullmatch=True)
load_balancers = st.builds(
    dr.LoadBalancer,
    st.sampled_from(list(dr.LoadBalancerType)),
    st.none()
    | st.one_of(
        st.builds(dr.ConsistentHash, header_name=TOKEN.map(str.lower)),
        st.builds(dr.ConsistentHash, query_parameter=TOKEN),
        st.just(dr.ConsistentHash(use_source_ip=True)),
    ),
    st.none()
    | st.sampled_from(
        [
            LocalityLbSetting(enabled=False),
            LocalityLbSetting(distribute=(LocalityDistribute("us/*", (("us/a", 70), ("eu", 30))),)),
            LocalityLbSetting(
                failover=(LocalityFailover("us", "eu"),), failover_priority=("topology.istio.io/network",)
            ),
            LocalityLbSetting(failover_priority=("kubernetes.io/hostname=n1", "topology.kubernetes.io/zone")),
        ]
    ),
)
pools = st.builds(
    dr.ConnectionPool,
    st.integers(0, 2**32 - 1),
    st.none() | DURATION,
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**32 - 1),
    st.sampled_from(list(dr.H2Upgrade)),
    st.booleans(),
)
outliers = st.builds(dr.OutlierDetection, st.integers(0, 1000), DURATION, DURATION, st.integers(0, 100))
tls_settings = st.builds(
    dr.ClientTls,
    st.sampled_from(list(dr.TlsMode)),
    st.just("") | LABEL.map(lambda t: f"{t}.example.com"),
    st.booleans(),
    st.just("") | st.just("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"),
    st.lists(LABEL.map(lambda t: f"{t}.example.com"), max_size=2).map(tuple),
    st.just("") | st.just("-----BEGIN CERTIFICATE-----\nMIIC\n-----END CERTIFICATE-----\n"),
    st.just("") | st.just("-----BEGIN EC PRIVATE KEY-----\nMHc\n-----END EC PRIVATE KEY-----\n"),
    st.just("") | st.just("/etc/ca.pem"),
    st.just("") | st.just("/etc/client/tls.crt"),
    st.just("") | st.just("/etc/client/tls.key"),
)
port_levels = st.lists(
    st.builds(
        dr.PortTrafficPolicy,
        PORT,
        st.none() | load_balancers,
        st.none() | pools,
        st.none() | outliers,
        st.none() | tls_settings,
    ),
    max_size=2,
    unique_by=lambda p: p.port,
).map(tuple)
traffic_policies = st.builds(
    dr.TrafficPolicy,
    st.none() | load_balancers,
    st.none() | pools,
    st.none() | outliers,
    st.none() | tls_settings,
    st.none() | st.sampled_from(list(dr.ProxyProtocolVersion)),
    port_levels,
)
subsets = st.lists(
    st.builds(
        dr.Subset,
        LABEL,
        st.frozensets(TOKEN.map(lambda t: f"Kubernetes//Pod/app/{t}"), max_size=3),
        st.none() | traffic_policies,
    ),
    max_size=3,
    unique_by=lambda s: s.name,
).map(tuple)
destination_policies = st.lists(
    st.builds(
        dr.DestinationPolicy,
        TOKEN.map(lambda t: f"app/{t}.app.svc.cluster.local"),
        st.just("") | TOKEN.map(lambda t: f"app/{t}"),
        st.none() | traffic_policies,
        subsets,
    ),
    max_size=3,
    unique_by=lambda d: d.service_key,
).map(tuple)


@settings(max_examples=100, deadline=None)
@given(destination_policies)
def test_destination_rules_go_to_proto_and_back_unchanged(rules: tuple[dr.DestinationPolicy, ...]) -> None:
    config = WaypointConfig("app/waypoint", destination_rules=rules)
    assert decode_waypoint_config("app/waypoint", pack_waypoint_config(waypoint_config_to_proto(config))) == config


def _bad_distribute(weight: int) -> pb.LocalityLbSetting:
    """A ``distribute`` entry whose weights add up to ``weight``."""
    to = [pb.LocalityWeight(locality="us/a", weight=weight)]
    return pb.LocalityLbSetting(distribute=[pb.LocalityDistribute(source="us", to=to)])


def encoded_rule(**fields: Any) -> any_pb2.Any:
    fields.setdefault("service_key", "app/r.app.svc.cluster.local")
    message = pb.WaypointConfig(waypoint="app/waypoint", destination_rules=[pb.DestinationPolicy(**fields)])
    return any_pb2.Any(type_url=WAYPOINT_CONFIG_TYPE_URL, value=message.SerializeToString())


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"service_key": ""}, "service_key"),
        ({"subsets": [pb.Subset(name="V1")]}, "subsets[0].name"),
        ({"subsets": [pb.Subset(name="v1"), pb.Subset(name="v1")]}, "subsets"),
        ({"subsets": [pb.Subset(name=f"s{i}") for i in range(300)]}, "subsets"),
        ({"subsets": [pb.Subset(name="v1", workloads=["x" * 600])]}, "subsets[0].workloads[0]"),
        ({"subsets": [pb.Subset(name="v1", workloads=["a\nb"])]}, "subsets[0].workloads[0]"),
        (
            {"traffic_policy": pb.TrafficPolicy(port_level=[pb.PortTrafficPolicy(port=0)])},
            "traffic_policy.port_level[0].port",
        ),
        (
            {
                "traffic_policy": pb.TrafficPolicy(
                    port_level=[pb.PortTrafficPolicy(port=80), pb.PortTrafficPolicy(port=80)]
                )
            },
            "traffic_policy.port_level",
        ),
        (
            {"traffic_policy": pb.TrafficPolicy(load_balancer=pb.LoadBalancer(simple=99))},
            "traffic_policy.load_balancer.simple",
        ),
        (
            {"traffic_policy": pb.TrafficPolicy(load_balancer=pb.LoadBalancer(consistent_hash=pb.ConsistentHash()))},
            "traffic_policy.load_balancer.consistent_hash",
        ),
        (
            {"traffic_policy": pb.TrafficPolicy(load_balancer=pb.LoadBalancer(locality=_bad_distribute(90)))},
            "traffic_policy.load_balancer.locality.distribute[0].to",
        ),
        (
            {
                "traffic_policy": pb.TrafficPolicy(
                    load_balancer=pb.LoadBalancer(
                        locality=pb.LocalityLbSetting(failover=[pb.LocalityFailover(source="us", to="us")])
                    )
                )
            },
            "traffic_policy.load_balancer.locality.failover[0]",
        ),
        (
            {
                "traffic_policy": pb.TrafficPolicy(
                    load_balancer=pb.LoadBalancer(
                        locality=pb.LocalityLbSetting(
                            failover=[pb.LocalityFailover(source="us", to="eu")],
                            failover_priority=["topology.kubernetes.io/zone"],
                        )
                    )
                )
            },
            "traffic_policy.load_balancer.locality.failoverPriority[0]",
        ),
        (
            {
                "traffic_policy": pb.TrafficPolicy(
                    load_balancer=pb.LoadBalancer(
                        locality=pb.LocalityLbSetting(distribute=[pb.LocalityDistribute(source="*")] * 65)
                    )
                )
            },
            "traffic_policy.load_balancer.locality.distribute",
        ),
        ({"traffic_policy": pb.TrafficPolicy(tls=pb.ClientTls(mode=7))}, "traffic_policy.tls.mode"),
        ({"traffic_policy": pb.TrafficPolicy(tls=pb.ClientTls(sni="a b"))}, "traffic_policy.tls.sni"),
        (
            {"traffic_policy": pb.TrafficPolicy(tls=pb.ClientTls(ca_certificates="junk"))},
            "traffic_policy.tls.ca_certificates",
        ),
        (
            {
                "traffic_policy": pb.TrafficPolicy(
                    tls=pb.ClientTls(ca_certificates="-----BEGIN CERTIFICATE-----" * 20_000)
                )
            },
            "traffic_policy.tls.ca_certificates",
        ),
        (
            {"traffic_policy": pb.TrafficPolicy(tls=pb.ClientTls(client_certificate="junk"))},
            "traffic_policy.tls.client_certificate",
        ),
        ({"traffic_policy": pb.TrafficPolicy(tls=pb.ClientTls(private_key="junk"))}, "traffic_policy.tls.private_key"),
        (
            {"traffic_policy": pb.TrafficPolicy(tls=pb.ClientTls(private_key="PRIVATE KEY-----" * 5000))},
            "traffic_policy.tls.private_key",
        ),
        (
            {"traffic_policy": pb.TrafficPolicy(tls=pb.ClientTls(private_key_path="relative/key.pem"))},
            "traffic_policy.tls.private_key_path",
        ),
        (
            {"traffic_policy": pb.TrafficPolicy(tls=pb.ClientTls(ca_certificates_path="/a\nb"))},
            "traffic_policy.tls.ca_certificates_path",
        ),
        ({"traffic_policy": pb.TrafficPolicy(proxy_protocol=9)}, "traffic_policy.proxy_protocol"),
        (
            {"traffic_policy": pb.TrafficPolicy(connection_pool=pb.ConnectionPool(h2_upgrade=5))},
            "traffic_policy.connection_pool.h2_upgrade",
        ),
        (
            {"traffic_policy": pb.TrafficPolicy(outlier_detection=pb.OutlierDetection(max_ejection_percent=101))},
            "traffic_policy.outlier_detection.max_ejection_percent",
        ),
        (
            {"traffic_policy": pb.TrafficPolicy(outlier_detection=pb.OutlierDetection(max_ejection_percent=10))},
            "traffic_policy.outlier_detection.interval",
        ),
    ],
)
def test_bad_destination_rule_fields_are_refused_by_name(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(XdsConversionError) as caught:
        decode_waypoint_config("app/waypoint", encoded_rule(**fields))
    assert caught.value.field == f"destination_rules[0].{field}"


def test_a_subset_merges_over_the_rule_field_by_field_and_a_port_entry_replaces_wholesale() -> None:
    simple = dr.ClientTls(dr.TlsMode.SIMPLE, insecure_skip_verify=True)
    upgrade = dr.ConnectionPool(h2_upgrade=dr.H2Upgrade.UPGRADE)
    rr = dr.LoadBalancer(dr.LoadBalancerType.ROUND_ROBIN)
    policy = dr.DestinationPolicy(
        "app/r.app.svc.cluster.local",
        traffic_policy=dr.TrafficPolicy(load_balancer=rr, tls=simple, proxy_protocol=dr.ProxyProtocolVersion.V1),
        subsets=(
            dr.Subset("v1", traffic_policy=dr.TrafficPolicy(connection_pool=upgrade)),
            dr.Subset(
                "v2", traffic_policy=dr.TrafficPolicy(port_level=(dr.PortTrafficPolicy(443, connection_pool=upgrade),))
            ),
        ),
    )
    assert policy.policy_for(80, "v1") == dr.TrafficPolicy(rr, upgrade, None, simple, dr.ProxyProtocolVersion.V1)
    assert policy.policy_for(80, "v2") == dr.TrafficPolicy(rr, None, None, simple, dr.ProxyProtocolVersion.V1)
    # The subset's port entry: the four settings replaced (not inherited), the rule's proxy protocol kept.
    assert policy.policy_for(443, "v2") == dr.TrafficPolicy(None, upgrade, None, None, dr.ProxyProtocolVersion.V1)
    assert policy.policy_for(80) == dr.TrafficPolicy(rr, None, None, simple, dr.ProxyProtocolVersion.V1)

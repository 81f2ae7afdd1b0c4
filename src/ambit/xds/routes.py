"""Model route tables ↔ the ``ambit.waypoint.v1.WaypointConfig`` resource (``proto/waypoint.proto``).

Theory of operation: :func:`waypoint_config_to_proto` encodes a :class:`~ambit.model.routes.WaypointConfig` field
for field (the control plane's side; a route rule's parts: :mod:`ambit.xds.route_encoding`).
:func:`decode_waypoint_config` is where a waypoint judges what it was sent, as :mod:`ambit.xds.convert` does for
addresses: the first problem raises :class:`XdsConversionError` naming the resource and the field (e.g.
``app/waypoint: tables[0].http[2].match.path.value: invalid regular expression``), so that the client NACKs that one
resource and keeps the rest. The route tables are read by
:class:`~ambit.xds.route_reader.RouteReader`; the other parts by the readers the rules below name.

Rules:

1. The resource name is the body's ``waypoint`` (``namespace/name``); a resource whose name disagrees is refused.
2. Ports (table, backend, redirect) are 1..65535; a redirect's status code is 301, 302, 303, 307 or 308; a mirror's
   percent is 0..100; durations are non-negative.
3. A path match has a known type and a value; an Exact or PathPrefix value starts with ``/`` (a plain
   string Prefix may be any string); a regular
   expression (path, header, query param) compiles and is at most 1024 characters. A header name is a token
   (a header match may also name one of :data:`~ambit.model.route_matches.PSEUDO_HEADERS`); a claim match has 1 to
   :data:`~ambit.model.route_matches.MAX_CLAIM_PATH` printable names in its path;
   header values carry no CR, LF or NUL (they are written into requests and responses as they are).
4. Enum values this build does not know are refused (they would change what a rule matches).
5. An absent ``retry`` is Istio's default policy; an absent ``timeouts`` or duration is no limit; an absent
   ``backend`` of a weighted backend is an unresolved one (answers 500).
6. Durations travel as ``google.protobuf.Duration``; seconds given in milliseconds come back exactly.
7. Nothing but :class:`XdsConversionError` escapes decoding.
8. ``policies`` (the AuthorizationPolicies bound to the waypoint) are judged by :mod:`ambit.xds.waypoint_policies`.
9. ``request_authentications`` (field 4) are judged by :mod:`ambit.xds.requestauth`.
10. A fault's percents are 0..100 and its abort status 200..599 (0: no abort), or its gRPC abort status 0..16
    (never both); a direct response's status is 200..599 and its body at most
    :data:`~ambit.model.routes.MAX_DIRECT_BODY` bytes; ``missing_backend_status`` is 0 (500) or 500..599.
11. ``destination_rules`` (field 6) are judged by :mod:`ambit.xds.destinationrules`.
12. ``metrics`` (field 7, the Telemetry API's overrides) are judged by :mod:`ambit.xds.metric_overrides`.
13. ``services`` (field 8, the Services bound to the waypoint) are printable ``namespace/hostname`` keys, each
    given once; they are kept sorted. ``race_first_connect`` (field 9) and ``dynamic_dns`` (field 10) are read the
    same way.
14. A CORS policy's origin matches are Exact, Prefix or RegularExpression (rule 3's limits) with a value; its
    header values carry no CR, LF or NUL; ``max_age`` is at most :data:`~ambit.xds.route_reader.MAX_CORS_AGE`
    seconds.
15. ``envoy_patches`` (field 11, the EnvoyFilter patches the waypoint honours) are judged by
    :mod:`ambit.xds.envoy_patches`.
16. ``default_retry`` and ``default_per_try_timeout`` (fields 12, 13: the mesh config's ``defaultHttpRetryPolicy``)
    give the retries of the waypoint's default route; both absent is Istio's default (rule 5), a timeout alone
    joins Istio's default policy.
17. ``mesh_locality_lb`` (field 14, the mesh config's ``localityLbSetting``) is judged by
    :mod:`ambit.xds.destinationrules` (its rule 8); absent, Istio's default.
"""

from __future__ import annotations

from google.protobuf import any_pb2
from google.protobuf.message import DecodeError

from ambit.api import waypoint_pb2 as pb
from ambit.model.routes import RetryPolicy, RouteRule, WaypointConfig
from ambit.xds.authorization import PolicyReader
from ambit.xds.destinationrules import DestinationPolicyReader, destination_policy_to_proto, mesh_locality_to_proto
from ambit.xds.envoy_patches import EnvoyPatchesReader, envoy_patches_to_proto
from ambit.xds.errors import XdsConversionError
from ambit.xds.metric_overrides import MetricOverridesReader, service_metrics_to_proto
from ambit.xds.requestauth import RequestAuthReader, request_authentication_to_proto
from ambit.xds.route_encoding import duration_to_proto, retry_to_proto, rule_to_proto, weighted_to_proto
from ambit.xds.route_reader import RouteReader
from ambit.xds.waypoint_policies import waypoint_policy_from_proto, waypoint_policy_to_proto

__all__ = [
    "WAYPOINT_CONFIG_TYPE_URL",
    "decode_waypoint_config",
    "pack_waypoint_config",
    "waypoint_config_from_proto",
    "waypoint_config_to_proto",
]

WAYPOINT_CONFIG_TYPE_URL = "type.googleapis.com/ambit.waypoint.v1.WaypointConfig"


def waypoint_config_to_proto(config: WaypointConfig) -> pb.WaypointConfig:
    """``config`` as the wire message. A rule shared by several tables (a VirtualService for many hosts) is built
    once."""
    built: dict[int, pb.RouteRule] = {}

    def rule(item: RouteRule) -> pb.RouteRule:
        found = built.get(id(item))
        if found is None:
            found = built[id(item)] = rule_to_proto(item)
        return found

    return pb.WaypointConfig(
        waypoint=config.waypoint,
        tables=[
            pb.RouteTable(
                service_key=t.service_key,
                port=t.port,
                http=[rule(r) for r in t.http],
                tcp_backends=[weighted_to_proto(b) for b in t.tcp_backends],
                hostnames=list(t.hostnames),
            )
            for t in config.tables
        ],
        policies=[waypoint_policy_to_proto(p) for p in config.policies],
        request_authentications=[request_authentication_to_proto(p) for p in config.request_authentications],
        xfcc_client_identity=config.xfcc_client_identity,
        destination_rules=[destination_policy_to_proto(d) for d in config.destination_rules],
        metrics=[service_metrics_to_proto(m) for m in config.metrics],
        services=list(config.services),
        race_first_connect=list(config.race_first_connect),
        dynamic_dns=list(config.dynamic_dns),
        envoy_patches=envoy_patches_to_proto(config.envoy_patches) if config.envoy_patches else None,
        # Istio's default travels as an absent field, so configs without a mesh default keep their bytes.
        default_retry=retry_to_proto(config.default_retry.policy)
        if config.default_retry.policy != RetryPolicy()
        else None,
        default_per_try_timeout=None
        if config.default_retry.per_try_timeout is None
        else duration_to_proto(config.default_retry.per_try_timeout),
        mesh_locality_lb=mesh_locality_to_proto(config.mesh_locality),
    )


def pack_waypoint_config(message: pb.WaypointConfig) -> any_pb2.Any:
    """``message`` as a google.protobuf.Any with the WaypointConfig type URL (deterministic bytes)."""
    return any_pb2.Any(type_url=WAYPOINT_CONFIG_TYPE_URL, value=message.SerializeToString(deterministic=True))


def waypoint_config_from_proto(message: pb.WaypointConfig, name: str) -> WaypointConfig:
    """Judge and convert a WaypointConfig received as resource ``name`` (rules 1-17)."""
    reader = RouteReader(name)
    if message.waypoint != name:
        raise reader.fail("waypoint", f"the resource is named {name!r} but describes {message.waypoint!r}")
    authn = RequestAuthReader(name)
    try:
        return WaypointConfig(
            waypoint=message.waypoint,
            tables=tuple(reader.table(f"tables[{i}]", t) for i, t in enumerate(message.tables)),
            policies=tuple(
                waypoint_policy_from_proto(PolicyReader(name), f"policies[{i}]", p)
                for i, p in enumerate(message.policies)
            ),
            request_authentications=tuple(
                authn.request_authentication(f"request_authentications[{i}]", p)
                for i, p in enumerate(message.request_authentications)
            ),
            xfcc_client_identity=message.xfcc_client_identity,
            destination_rules=DestinationPolicyReader(name).destination_rules(list(message.destination_rules)),
            metrics=MetricOverridesReader(name).all("metrics", message.metrics),
            services=reader.services("services", message.services),
            race_first_connect=reader.services("race_first_connect", message.race_first_connect),
            dynamic_dns=reader.services("dynamic_dns", message.dynamic_dns),
            envoy_patches=EnvoyPatchesReader(name).patches("envoy_patches", message.envoy_patches),
            default_retry=reader.default_retry(message),
            mesh_locality=DestinationPolicyReader(name).mesh_locality(
                "mesh_locality_lb", message.mesh_locality_lb, present=message.HasField("mesh_locality_lb")
            ),
        )
    except XdsConversionError:
        raise
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise reader.fail("(message)", f"cannot be read: {exc}") from None


def decode_waypoint_config(name: str, body: any_pb2.Any) -> WaypointConfig:
    """Unpack and convert one xDS resource body of type :data:`WAYPOINT_CONFIG_TYPE_URL`."""
    if body.type_url != WAYPOINT_CONFIG_TYPE_URL:
        raise XdsConversionError(
            name, "resource.type_url", f"expected {WAYPOINT_CONFIG_TYPE_URL}, got {body.type_url!r}"
        )
    message = pb.WaypointConfig()
    try:
        message.ParseFromString(body.value)
    except (DecodeError, ValueError, RecursionError) as exc:
        raise XdsConversionError(name, "resource.value", f"not a valid WaypointConfig message: {exc}") from None
    return waypoint_config_from_proto(message, name)

"""The validating webhook's pure parts: per-kind validators, the AdmissionReview decision, the registration object."""

from __future__ import annotations

import base64
import contextlib
import json
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from json_strategies import json_values
from tests.upstream_objects import customize_metrics_spec

from ambit.controlplane.webhook import (
    VALIDATORS,
    FieldError,
    MalformedReviewError,
    UnknownKindError,
    answer,
    parse_review,
    validate,
    webhook_configuration,
)


def obj(kind: str, spec: Any, **metadata: Any) -> dict[str, Any]:
    return {"kind": kind, "metadata": {"name": "x", "namespace": "default", **metadata}, "spec": spec}


def errors(kind: str, spec: Any, **metadata: Any) -> list[FieldError]:
    return [e for e in validate(kind, obj(kind, spec, **metadata)) if not e.warning]


VALID: list[tuple[str, Any]] = [
    ("AuthorizationPolicy", {}),
    ("AuthorizationPolicy", {"action": "ALLOW"}),
    (
        "AuthorizationPolicy",
        {
            "selector": {"matchLabels": {"app": "web"}},
            "action": "DENY",
            "rules": [
                {
                    "from": [
                        {
                            "source": {
                                "principals": ["cluster.local/ns/a/sa/b"],
                                "notNamespaces": ["kube-system"],
                                "ipBlocks": ["10.0.0.0/8", "192.168.1.1", "2001:db8::/32"],
                            }
                        }
                    ],
                    "to": [{"operation": {"ports": ["8080", "443"], "methods": ["GET"], "paths": ["/api/*"]}}],
                    "when": [
                        {"key": "source.ip", "values": ["10.1.2.3/32"]},
                        {"key": "request.headers[x-token]", "notValues": ["bad"]},
                        {"key": "destination.port", "values": ["80"]},
                    ],
                }
            ],
        },
    ),
    ("AuthorizationPolicy", {"action": "CUSTOM", "provider": {"name": "ext-authz"}, "rules": [{}]}),
    ("AuthorizationPolicy", {"rules": [{"from": [{"source": {"not_principals": ["*"]}}]}]}),
    ("AuthorizationPolicy", {"rules": [{"from": [{"source": {"serviceAccounts": ["ns/sa", "sa"]}}]}]}),
    (
        "AuthorizationPolicy",
        {"rules": [{"to": [{"operation": {"paths": ["/a/{*}/b", "/c/{**}", "/x*"], "notPaths": ["/{**}/z"]}}]}]},
    ),
    (
        "AuthorizationPolicy",
        {"targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "waypoint"}]},
    ),
    ("AuthorizationPolicy", {"targetRef": {"kind": "Service", "group": "", "name": "web"}}),
    ("PeerAuthentication", {"mtls": {"mode": "STRICT"}}),
    ("PeerAuthentication", {}),
    (
        "PeerAuthentication",
        {
            "selector": {"matchLabels": {"app": "db"}},
            "mtls": {"mode": "PERMISSIVE"},
            "portLevelMtls": {"5432": {"mode": "STRICT"}},
        },
    ),
    (
        "RequestAuthentication",
        {
            "selector": {"matchLabels": {"app": "web"}},
            "jwtRules": [
                {
                    "issuer": "https://issuer.example.com",
                    "jwksUri": "https://issuer.example.com/jwks",
                    "fromHeaders": [{"name": "x-jwt", "prefix": "Bearer "}],
                    "outputClaimToHeaders": [{"header": "x-sub", "claim": "sub"}],
                    "forwardOriginalToken": True,
                    "timeout": "5s",
                }
            ],
        },
    ),
    (
        "ServiceEntry",
        {
            "hosts": ["api.example.com"],
            "ports": [{"number": 443, "name": "https", "protocol": "TLS"}],
            "resolution": "DNS",
            "location": "MESH_EXTERNAL",
        },
    ),
    (
        "ServiceEntry",
        {
            "hosts": ["db.internal"],
            "addresses": ["240.0.0.1"],
            "ports": [{"number": 5432, "name": "tcp-pg", "protocol": "TCP", "targetPort": 15432}],
            "resolution": "STATIC",
            "endpoints": [{"address": "198.18.200.5", "ports": {"tcp-pg": 5433}, "labels": {"app": "pg"}}],
        },
    ),
    ("ServiceEntry", {"hosts": ["*.example.com"], "ports": [{"number": 80, "name": "http"}]}),
    (
        "ServiceEntry",
        {
            "hosts": ["*.example.com", "*.example.org"],
            "ports": [
                {"number": 80, "name": "http", "protocol": "HTTP"},
                {"number": 443, "name": "tls", "protocol": "TLS"},
            ],
            "location": "MESH_EXTERNAL",
            "resolution": "DYNAMIC_DNS",
        },
    ),
    (
        "ServiceEntry",
        {"hosts": ["vm.svc"], "resolution": "STATIC", "workloadSelector": {"labels": {"app": "vm"}}},
    ),
    ("WorkloadEntry", {"address": "198.18.200.9", "ports": {"http": 8080}, "serviceAccount": "vm"}),
    ("WorkloadEntry", {"network": "network-2", "labels": {"app": "vm"}}),
    ("WorkloadEntry", {"address": "vm1.example.com", "weight": 3}),
    (
        "DestinationRule",
        {
            "host": "web.default.svc.cluster.local",
            "trafficPolicy": {"tls": {"mode": "ISTIO_MUTUAL"}, "loadBalancer": {"simple": "ROUND_ROBIN"}},
            "subsets": [{"name": "v1", "labels": {"version": "v1"}}],
        },
    ),
    (
        "VirtualService",
        {"hosts": ["web"], "http": [{"route": [{"destination": {"host": "web", "subset": "v1"}, "weight": 100}]}]},
    ),
    ("Sidecar", {"egress": [{"hosts": ["./*", "istio-system/*"]}], "outboundTrafficPolicy": {"mode": "ALLOW_ANY"}}),
    (
        "EnvoyFilter",
        {
            "targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "waypoint"}],
            "configPatches": [
                {
                    "applyTo": "VIRTUAL_HOST",
                    "match": {"context": "SIDECAR_INBOUND", "proxy": {"proxyVersion": r"^1\.2[0-9].*"}},
                    "patch": {"operation": "MERGE", "value": {"request_headers_to_add": []}},
                },
                {"applyTo": "HTTP_ROUTE", "patch": {"operation": "REMOVE"}},
                {
                    "applyTo": "CLUSTER",
                    "match": {"proxy": {"proxyVersion": "1" * 1025}},
                    "patch": {"operation": "MERGE", "value": {}},
                },
            ],
        },
    ),
    (
        "Gateway",
        {
            "gatewayClassName": "istio-waypoint",
            "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}],
        },
    ),
    (
        "Gateway",
        {
            "gatewayClassName": "istio",
            "listeners": [
                {"name": "http", "port": 80, "protocol": "HTTP", "hostname": "*.example.com"},
                {"name": "https", "port": 443, "protocol": "HTTPS", "tls": {"mode": "Terminate"}},
            ],
        },
    ),
    (
        "HTTPRoute",
        {
            "parentRefs": [{"name": "waypoint", "kind": "Gateway", "group": "gateway.networking.k8s.io"}],
            "hostnames": ["web.example.com"],
            "rules": [
                {
                    "matches": [
                        {
                            "path": {"type": "PathPrefix", "value": "/api"},
                            "headers": [{"name": "x-v", "value": "2"}],
                            "method": "GET",
                        }
                    ],
                    "backendRefs": [{"name": "web-v2", "port": 80, "weight": 90}],
                }
            ],
        },
    ),
    (
        "GRPCRoute",
        {
            "parentRefs": [{"name": "waypoint"}],
            "rules": [
                {"matches": [{"method": {"service": "echo.Echo"}}], "backendRefs": [{"name": "e", "port": 7070}]}
            ],
        },
    ),
    (
        "TCPRoute",
        {
            "parentRefs": [{"group": "", "kind": "Service", "name": "db", "port": 5432}],
            "rules": [{"name": "all", "backendRefs": [{"name": "db-v1", "port": 5432, "weight": 90}]}],
        },
    ),
    (
        "TLSRoute",
        {
            "parentRefs": [{"name": "waypoint"}],
            "hostnames": ["api.example.com", "*.example.org"],
            "rules": [{"backendRefs": [{"name": "api", "port": 443}, {"name": "api-v2", "port": 443, "weight": 0}]}],
        },
    ),
    (  # upstream's TestCustomizeMetrics
        "Telemetry",
        customize_metrics_spec(),
    ),
    ("Telemetry", {"metrics": [{"overrides": [{"match": {"mode": "SERVER"}, "disabled": True}]}], "tracing": [{}]}),
]


@pytest.mark.parametrize(("kind", "spec"), VALID, ids=[f"{k}-{i}" for i, (k, _) in enumerate(VALID)])
def test_valid_objects_have_no_errors(kind: str, spec: Any) -> None:
    assert errors(kind, spec) == []


INVALID: list[tuple[str, Any, str, str]] = [
    # EnvoyFilter
    ("EnvoyFilter", {"configPatches": [None]}, "spec.configPatches[0]", "null config patch"),
    (
        "EnvoyFilter",
        {"configPatches": [{"patch": {"operation": "ADD"}}]},
        "spec.configPatches[0].applyTo",
        "missing applyTo",
    ),
    ("EnvoyFilter", {"configPatches": [{"applyTo": "CLUSTER"}]}, "spec.configPatches[0].patch", "missing patch"),
    (
        "EnvoyFilter",
        {"configPatches": [{"applyTo": "CLUSTER", "patch": {"value": {}}}]},
        "spec.configPatches[0].patch.operation",
        "missing patch operation",
    ),
    (
        "EnvoyFilter",
        {"configPatches": [{"applyTo": "CLUSTER", "patch": {"operation": "MERGE"}}]},
        "spec.configPatches[0].patch.value",
        "missing patch value",
    ),
    (
        "EnvoyFilter",
        {
            "configPatches": [
                {"applyTo": "CLUSTER", "match": {"proxy": {"proxyVersion": "1.(2"}}, "patch": {"operation": "REMOVE"}}
            ]
        },
        "spec.configPatches[0].match.proxy.proxyVersion",
        "invalid regex for proxy version",
    ),
    (
        "EnvoyFilter",
        {
            "configPatches": [
                {"applyTo": "CLUSTER", "match": {"proxy": {"proxyVersion": "(?!1)"}}, "patch": {"operation": "REMOVE"}}
            ]
        },
        "spec.configPatches[0].match.proxy.proxyVersion",
        "look-ahead",
    ),
    (
        "EnvoyFilter",
        {"configPatches": [{"applyTo": "ROUTES", "patch": {"operation": "REMOVE"}}]},
        "spec.configPatches[0].applyTo",
        "unsupported value",
    ),
    # AuthorizationPolicy
    ("AuthorizationPolicy", {"action": "REJECT"}, "spec.action", "unsupported value 'REJECT'"),
    ("AuthorizationPolicy", {"action": "CUSTOM", "rules": [{}]}, "spec.provider.name", "required"),
    ("AuthorizationPolicy", {"action": "CUSTOM", "provider": {"name": "x"}}, "spec.rules", "never triggers"),
    ("AuthorizationPolicy", {"action": "DENY", "provider": {"name": "x"}}, "spec.provider", "only be set"),
    (
        "AuthorizationPolicy",
        {
            "selector": {"matchLabels": {"a": "b"}},
            "targetRefs": [{"kind": "Gateway", "name": "w", "group": "gateway.networking.k8s.io"}],
        },
        "spec.selector",
        "only one of selector or targetRefs",
    ),
    (
        "AuthorizationPolicy",
        {"targetRef": {"kind": "Service", "name": "a"}, "targetRefs": [{"kind": "Service", "name": "b"}]},
        "spec.targetRef",
        "only one of targetRef or targetRefs",
    ),
    ("AuthorizationPolicy", {"targetRefs": [{"kind": "Pod", "name": "p"}]}, "spec.targetRefs[0].kind", "unsupported"),
    ("AuthorizationPolicy", {"targetRefs": [{"kind": "Service"}]}, "spec.targetRefs[0].name", "required"),
    (
        "AuthorizationPolicy",
        {"targetRefs": [{"kind": "Service", "name": "s", "namespace": "other"}]},
        "spec.targetRefs[0].namespace",
        "cross-namespace",
    ),
    ("AuthorizationPolicy", {"rules": [{"from": [{}]}]}, "spec.rules[0].from[0].source", "required"),
    ("AuthorizationPolicy", {"rules": [{"from": [{"source": {}}]}]}, "spec.rules[0].from[0].source", "at least one"),
    ("AuthorizationPolicy", {"rules": [{"to": [{"operation": {}}]}]}, "spec.rules[0].to[0].operation", "at least one"),
    (
        "AuthorizationPolicy",
        {"rules": [{"to": [{"operation": {"ports": ["8080", "http"]}}]}]},
        "spec.rules[0].to[0].operation.ports[1]",
        "not a port number",
    ),
    (
        "AuthorizationPolicy",
        {"rules": [{"to": [{"operation": {"notPorts": ["0"]}}]}]},
        "spec.rules[0].to[0].operation.notPorts[0]",
        "not a port number",
    ),
    (
        "AuthorizationPolicy",
        {"rules": [{"to": [{"operation": {"ports": ["65536"]}}]}]},
        "spec.rules[0].to[0].operation.ports[0]",
        "not a port number",
    ),
    (
        "AuthorizationPolicy",
        {"rules": [{"to": [{"operation": {"ports": [8080]}}]}]},
        "spec.rules[0].to[0].operation.ports[0]",
        "ports are strings",
    ),
    (
        "AuthorizationPolicy",
        {"rules": [{"from": [{"source": {"principals": [""]}}]}]},
        "spec.rules[0].from[0].source.principals[0]",
        "must not be empty",
    ),
    (
        "AuthorizationPolicy",
        {"rules": [{"from": [{"source": {"namespaces": ["ok", 3]}}]}]},
        "spec.rules[0].from[0].source.namespaces[1]",
        "expected a string",
    ),
    (
        "AuthorizationPolicy",
        {"rules": [{"from": [{"source": {"ipBlocks": ["10.0.0.0/33"]}}]}]},
        "spec.rules[0].from[0].source.ipBlocks[0]",
        "not an IP address or CIDR",
    ),
    (
        "AuthorizationPolicy",
        {"rules": [{"from": [{"source": {"notRemoteIpBlocks": ["example.com"]}}]}]},
        "spec.rules[0].from[0].source.notRemoteIpBlocks[0]",
        "not an IP address",
    ),
    (
        "AuthorizationPolicy",
        {"rules": [{"from": [{"source": {"serviceAccounts": ["a"], "principals": ["p"]}}]}]},
        "spec.rules[0].from[0].source.serviceAccounts",
        "cannot be set together",
    ),
    (
        "AuthorizationPolicy",
        {"rules": [{"to": [{"operation": {"paths": ["/ok", "/{**}/{*}"]}}]}]},
        "spec.rules[0].to[0].operation.paths[1]",
        "{**} is not the last operator",
    ),
    (
        "AuthorizationPolicy",
        {"rules": [{"to": [{"operation": {"notPaths": ["/foo/{buzz}"]}}]}]},
        "spec.rules[0].to[0].operation.notPaths[0]",
        "beyond a supported path template",
    ),
    (
        "AuthorizationPolicy",
        {"rules": [{"from": [{"source": {"serviceAccounts": ["a/b/c"]}}]}]},
        "spec.rules[0].from[0].source.serviceAccounts[0]",
        "not a service account",
    ),
    ("AuthorizationPolicy", {"rules": [{"when": [{"values": ["x"]}]}]}, "spec.rules[0].when[0].key", "required"),
    (
        "AuthorizationPolicy",
        {"rules": [{"when": [{"key": "source.ip"}]}]},
        "spec.rules[0].when[0]",
        "values or notValues",
    ),
    (
        "AuthorizationPolicy",
        {"rules": [{"when": [{"key": "request.colour", "values": ["x"]}]}]},
        "spec.rules[0].when[0].key",
        "unknown attribute",
    ),
    (
        "AuthorizationPolicy",
        {"rules": [{"when": [{"key": "destination.ip", "values": ["nope"]}]}]},
        "spec.rules[0].when[0].values[0]",
        "not an IP",
    ),
    (
        "AuthorizationPolicy",
        {"rules": [{"when": [{"key": "destination.port", "notValues": ["99999"]}]}]},
        "spec.rules[0].when[0].notValues[0]",
        "not a port",
    ),
    ("AuthorizationPolicy", {"rules": [{"form": []}]}, "spec.rules[0].form", "unknown field"),
    ("AuthorizationPolicy", {"actions": "DENY"}, "spec.actions", "unknown field"),
    ("AuthorizationPolicy", {"rules": {"from": []}}, "spec.rules", "expected an array"),
    ("AuthorizationPolicy", "allow-all", "spec", "expected an object"),
    # PeerAuthentication
    ("PeerAuthentication", {"mtls": {"mode": "ON"}}, "spec.mtls.mode", "unsupported value 'ON'"),
    (
        "PeerAuthentication",
        {"portLevelMtls": {"80": {"mode": "DISABLE"}}},
        "spec.portLevelMtls",
        "needs a spec.selector",
    ),
    (
        "PeerAuthentication",
        {"selector": {"matchLabels": {"a": "b"}}, "portLevelMtls": {"http": {"mode": "DISABLE"}}},
        "spec.portLevelMtls[http]",
        "not a port number",
    ),
    (
        "PeerAuthentication",
        {"selector": {"matchLabels": {"a": "b"}}, "portLevelMtls": {"0": {"mode": "DISABLE"}}},
        "spec.portLevelMtls[0]",
        "not a port number",
    ),
    (
        "PeerAuthentication",
        {"selector": {"matchLabels": {"a": "b"}}, "portLevelMtls": {"80": {"mode": "OFF"}}},
        "spec.portLevelMtls[80].mode",
        "unsupported",
    ),
    (
        "PeerAuthentication",
        {"selector": {"matchLabels": {"a": 1}}},
        "spec.selector.matchLabels[a]",
        "expected a string",
    ),
    ("PeerAuthentication", {"mtls": {"mode": "STRICT", "strict": True}}, "spec.mtls.strict", "unknown field"),
    # RequestAuthentication
    ("RequestAuthentication", {"jwtRules": [{"jwksUri": "https://x/jwks"}]}, "spec.jwtRules[0].issuer", "required"),
    (
        "RequestAuthentication",
        {"jwtRules": [{"issuer": "i", "jwksUri": "ftp://x"}]},
        "spec.jwtRules[0].jwksUri",
        "http",
    ),
    (
        "RequestAuthentication",
        {"jwtRules": [{"issuer": "i", "fromHeaders": [{"prefix": "Bearer "}]}]},
        "spec.jwtRules[0].fromHeaders[0].name",
        "required",
    ),
    (
        "RequestAuthentication",
        {"jwtRules": [{"issuer": "i", "fromHeaders": [{"name": "x-jwt\n"}]}]},
        "spec.jwtRules[0].fromHeaders[0].name",
        "not a valid HTTP header name",
    ),
    (
        "RequestAuthentication",
        {"jwtRules": [{"issuer": "i", "outputClaimToHeaders": [{"header": "x-sub\n", "claim": "sub"}]}]},
        "spec.jwtRules[0].outputClaimToHeaders[0].header",
        "not a valid HTTP header name",
    ),
    (
        "RequestAuthentication",
        {"jwtRules": [{"issuer": "i", "timeout": "soon"}]},
        "spec.jwtRules[0].timeout",
        "duration",
    ),
    # ServiceEntry
    ("ServiceEntry", {"ports": [{"number": 80, "name": "http"}]}, "spec.hosts", "required"),
    ("ServiceEntry", {"hosts": []}, "spec.hosts", "must not be empty"),
    ("ServiceEntry", {"hosts": ["*"]}, "spec.hosts[0]", "only '*'"),
    ("ServiceEntry", {"hosts": ["bad host"]}, "spec.hosts[0]", "not a DNS name"),
    ("ServiceEntry", {"hosts": ["a.com"], "addresses": ["1.2.3"]}, "spec.addresses[0]", "not an IP"),
    ("ServiceEntry", {"hosts": ["a.com"], "ports": [{"name": "http"}]}, "spec.ports[0].number", "required"),
    (
        "ServiceEntry",
        {"hosts": ["a.com"], "ports": [{"number": 0, "name": "x"}]},
        "spec.ports[0].number",
        "out of range",
    ),
    ("ServiceEntry", {"hosts": ["a.com"], "ports": [{"number": 80}]}, "spec.ports[0].name", "required"),
    (
        "ServiceEntry",
        {"hosts": ["a.com"], "ports": [{"number": 80, "name": "x", "protocol": "SMTP"}]},
        "spec.ports[0].protocol",
        "unsupported protocol",
    ),
    (
        "ServiceEntry",
        {"hosts": ["a.com"], "ports": [{"number": 80, "name": "a"}, {"number": 80, "name": "b"}]},
        "spec.ports[1].number",
        "not unique",
    ),
    (
        "ServiceEntry",
        {"hosts": ["a.com"], "ports": [{"number": 80, "name": "a"}, {"number": 81, "name": "a"}]},
        "spec.ports[1].name",
        "not unique",
    ),
    ("ServiceEntry", {"hosts": ["a.com"], "resolution": "MAGIC"}, "spec.resolution", "unsupported"),
    ("ServiceEntry", {"hosts": ["*.a.com", "b.com"], "resolution": "DYNAMIC_DNS"}, "spec.hosts[1]", "wildcard"),
    (
        "ServiceEntry",
        {"hosts": ["*.a.com"], "resolution": "DYNAMIC_DNS", "addresses": ["240.0.0.1"]},
        "spec.addresses",
        "DYNAMIC_DNS",
    ),
    (
        "ServiceEntry",
        {"hosts": ["*.a.com"], "resolution": "DYNAMIC_DNS", "endpoints": [{"address": "1.1.1.1"}]},
        "spec.endpoints",
        "DYNAMIC_DNS",
    ),
    (
        "ServiceEntry",
        {"hosts": ["*.a.com"], "resolution": "DYNAMIC_DNS", "ports": [{"number": 5432, "name": "pg"}]},
        "spec.ports[0].protocol",
        "not TCP",
    ),
    ("ServiceEntry", {"hosts": ["a.com"], "location": "MARS"}, "spec.location", "unsupported"),
    ("ServiceEntry", {"hosts": ["a.com"], "resolution": "STATIC"}, "spec.endpoints", "needs endpoints"),
    (
        "ServiceEntry",
        {"hosts": ["a.com"], "resolution": "STATIC", "endpoints": [{"address": "db.example.com"}]},
        "spec.endpoints[0].address",
        "not an IP address",
    ),
    (
        "ServiceEntry",
        {"hosts": ["a.com"], "resolution": "NONE", "endpoints": [{"address": "1.1.1.1"}]},
        "spec.endpoints",
        "resolution NONE",
    ),
    (
        "ServiceEntry",
        {
            "hosts": ["a.com"],
            "resolution": "STATIC",
            "workloadSelector": {"labels": {"app": "a"}},
            "endpoints": [{"address": "1.1.1.1"}],
        },
        "spec.workloadSelector",
        "only one of workloadSelector or endpoints",
    ),
    ("ServiceEntry", {"hosts": ["*.a.com"], "resolution": "DNS"}, "spec.hosts[0]", "needs endpoints"),
    (
        "ServiceEntry",
        {"hosts": ["a.com"], "resolution": "DNS_ROUND_ROBIN", "endpoints": [{"address": "x.a"}, {"address": "y.a"}]},
        "spec.endpoints",
        "at most one",
    ),
    (
        "ServiceEntry",
        {
            "hosts": ["a.com"],
            "ports": [{"number": 80, "name": "http"}],
            "resolution": "STATIC",
            "endpoints": [{"address": "1.1.1.1", "ports": {"grpc": 9090}}],
        },
        "spec.endpoints[0].ports[grpc]",
        "not one of the service entry's port names",
    ),
    (
        "ServiceEntry",
        {"hosts": ["a.com"], "resolution": "STATIC", "endpoints": [{"labels": {}}]},
        "spec.endpoints[0].address",
        "required unless network",
    ),
    ("ServiceEntry", {"hosts": ["a.com"], "exportTo": ["Not_A_Namespace"]}, "spec.exportTo[0]", "namespace"),
    ("ServiceEntry", {"hosts": ["a.com"], "host": "b.com"}, "spec.host", "unknown field"),
    # WorkloadEntry
    ("WorkloadEntry", {"ports": {"http": 80}}, "spec.address", "required unless network"),
    ("WorkloadEntry", {"address": "not an address!"}, "spec.address", "not an IP address or a DNS name"),
    ("WorkloadEntry", {"address": "1.1.1.1", "ports": {"http": 70000}}, "spec.ports[http]", "out of range"),
    ("WorkloadEntry", {"address": "1.1.1.1", "ports": {"http": "x"}}, "spec.ports[http]", "expected an integer"),
    ("WorkloadEntry", {"address": "1.1.1.1", "ports": [80]}, "spec.ports", "expected an object"),
    ("WorkloadEntry", {"address": "unix://relative"}, "spec.address", "absolute path"),
    ("WorkloadEntry", {"address": "1.1.1.1", "weight": -1}, "spec.weight", "out of range"),
    ("WorkloadEntry", None, "spec", "required"),
    # DestinationRule, VirtualService, Sidecar
    ("DestinationRule", {"subsets": []}, "spec.host", "required"),
    (
        "DestinationRule",
        {"host": "a", "trafficPolicy": {"tls": {"mode": "ON"}}},
        "spec.trafficPolicy.tls.mode",
        "unsupported",
    ),
    ("DestinationRule", {"host": "a", "subsets": [{"labels": {}}]}, "spec.subsets[0].name", "required"),
    ("DestinationRule", {"host": "a", "subsets": [{"name": "V_1"}]}, "spec.subsets[0].name", "not a DNS label"),
    (
        "DestinationRule",
        {"host": "a", "trafficPolicy": {"portLevelSettings": [{"port": {"number": 0}}]}},
        "spec.trafficPolicy.portLevelSettings[0].port.number",
        "out of range",
    ),
    ("VirtualService", {"http": []}, "spec.hosts", "required"),
    ("VirtualService", {"hosts": ["a"], "http": [{"match": []}]}, "spec.http[0]", "needs one of route"),
    (
        "VirtualService",
        {"hosts": ["a"], "http": [{"route": [{"destination": {}}]}]},
        "spec.http[0].route[0].destination.host",
        "required",
    ),
    (
        "VirtualService",
        {"hosts": ["a"], "tcp": [{"route": [{"destination": {"host": "b", "port": {"number": 99999}}}]}]},
        "spec.tcp[0].route[0].destination.port.number",
        "out of range",
    ),
    (
        "VirtualService",
        {"hosts": ["a"], "tls": [{"route": [{"destination": {"host": "b"}}]}]},
        "spec.tls[0].match",
        "required",
    ),
    ("Sidecar", {"egress": [{"hosts": ["*"]}]}, "spec.egress[0].hosts[0]", "namespace/host"),
    ("Sidecar", {"egress": [{}]}, "spec.egress[0].hosts", "required"),
    ("Sidecar", {"ingress": [{"defaultEndpoint": "127.0.0.1:8080"}]}, "spec.ingress[0].port", "required"),
    ("Sidecar", {"outboundTrafficPolicy": {"mode": "DENY"}}, "spec.outboundTrafficPolicy.mode", "unsupported"),
    # Gateway
    ("Gateway", {"listeners": [{"name": "a", "port": 80, "protocol": "HTTP"}]}, "spec.gatewayClassName", "required"),
    ("Gateway", {"gatewayClassName": "istio"}, "spec.listeners", "required"),
    (
        "Gateway",
        {"gatewayClassName": "istio", "listeners": [{"name": "a", "protocol": "HTTP"}]},
        "spec.listeners[0].port",
        "required",
    ),
    (
        "Gateway",
        {"gatewayClassName": "istio", "listeners": [{"name": "a", "port": 0, "protocol": "HTTP"}]},
        "spec.listeners[0].port",
        "out of range",
    ),
    (
        "Gateway",
        {"gatewayClassName": "istio", "listeners": [{"name": "a", "port": "80", "protocol": "HTTP"}]},
        "spec.listeners[0].port",
        "expected an integer",
    ),
    (
        "Gateway",
        {"gatewayClassName": "istio", "listeners": [{"name": "a", "port": 80, "protocol": "GO PHER"}]},
        "spec.listeners[0].protocol",
        "invalid protocol",
    ),
    (
        "Gateway",
        {"gatewayClassName": "istio", "listeners": [{"name": "a", "port": 80, "protocol": "a" * 256}]},
        "spec.listeners[0].protocol",
        "longer than 255 characters",
    ),
    (
        "Gateway",
        {"gatewayClassName": "istio", "listeners": [{"name": "a", "port": 443, "protocol": "HTTPS"}]},
        "spec.listeners[0].tls",
        "required for protocol HTTPS",
    ),
    (
        "Gateway",
        {"gatewayClassName": "istio", "listeners": [{"name": "a", "port": 9, "protocol": "TCP", "hostname": "a.b"}]},
        "spec.listeners[0].hostname",
        "must not be set",
    ),
    (
        "Gateway",
        {
            "gatewayClassName": "istio",
            "listeners": [{"name": "a", "port": 80, "protocol": "HTTP"}, {"name": "a", "port": 81, "protocol": "HTTP"}],
        },
        "spec.listeners[1].name",
        "not unique",
    ),
    (
        "Gateway",
        {
            "gatewayClassName": "istio",
            "listeners": [{"name": "a", "port": 80, "protocol": "HTTP"}, {"name": "b", "port": 80, "protocol": "HTTP"}],
        },
        "spec.listeners[1]",
        "must be unique",
    ),
    (
        "Gateway",
        {
            "gatewayClassName": "istio",
            "listeners": [{"name": "a", "port": 80, "protocol": "HTTP"}],
            "addresses": [{"value": "nope"}],
        },
        "spec.addresses[0].value",
        "not an IP",
    ),
    # HTTPRoute
    ("HTTPRoute", {"parentRefs": [{"port": 80}]}, "spec.parentRefs[0].name", "required"),
    ("HTTPRoute", {"parentRefs": [{"name": "g", "port": 70000}]}, "spec.parentRefs[0].port", "out of range"),
    ("HTTPRoute", {"hostnames": ["10.0.0.1"]}, "spec.hostnames[0]", "IP addresses are not"),
    ("HTTPRoute", {"hostnames": ["*"]}, "spec.hostnames[0]", "not a DNS name"),
    (
        "HTTPRoute",
        {"rules": [{"backendRefs": [{"name": "web"}]}]},
        "spec.rules[0].backendRefs[0].port",
        "required for a Service",
    ),
    ("HTTPRoute", {"rules": [{"backendRefs": [{"port": 80}]}]}, "spec.rules[0].backendRefs[0].name", "required"),
    (
        "HTTPRoute",
        {"rules": [{"backendRefs": [{"name": "w", "port": 80, "weight": -1}]}]},
        "spec.rules[0].backendRefs[0].weight",
        "out of range",
    ),
    (
        "HTTPRoute",
        {"rules": [{"matches": [{"path": {"type": "Exact", "value": "api"}}]}]},
        "spec.rules[0].matches[0].path.value",
        "start with '/'",
    ),
    (
        "HTTPRoute",
        {"rules": [{"matches": [{"path": {"type": "Glob", "value": "/"}}]}]},
        "spec.rules[0].matches[0].path.type",
        "unsupported",
    ),
    (
        "HTTPRoute",
        {"rules": [{"matches": [{"headers": [{"value": "x"}]}]}]},
        "spec.rules[0].matches[0].headers[0].name",
        "required",
    ),
    ("HTTPRoute", {"rules": [{"matches": [{"method": "FETCH"}]}]}, "spec.rules[0].matches[0].method", "unsupported"),
    (
        "HTTPRoute",
        {"rules": [{"filters": [{"type": "RequestRedirect"}]}]},
        "spec.rules[0].filters[0].requestRedirect",
        "required",
    ),
    (
        "HTTPRoute",
        {
            "rules": [
                {
                    "filters": [{"type": "RequestRedirect", "requestRedirect": {"port": 8443}}],
                    "backendRefs": [{"name": "w", "port": 80}],
                }
            ]
        },
        "spec.rules[0].backendRefs",
        "must be empty",
    ),
    ("HTTPRoute", {"rules": [{"backendRefs": [{"name": "w", "port": 80}]}] * 17}, "spec.rules", "at most 16"),
    # GRPCRoute
    (
        "GRPCRoute",
        {"rules": [{"matches": [{"method": {"type": "Exact"}}]}]},
        "spec.rules[0].matches[0].method",
        "one or both",
    ),
    (
        "GRPCRoute",
        {"rules": [{"backendRefs": [{"name": "e"}]}]},
        "spec.rules[0].backendRefs[0].port",
        "required for a Service",
    ),
    (
        "GRPCRoute",
        {"rules": [{"filters": [{"type": "URLRewrite", "urlRewrite": {}}]}]},
        "spec.rules[0].filters[0].type",
        "unsupported",
    ),
    # TCPRoute
    ("TCPRoute", {"parentRefs": [{"name": "w"}]}, "spec.rules", "required field is missing"),
    ("TCPRoute", {"rules": []}, "spec.rules", "must not be empty"),
    ("TCPRoute", {"rules": [{}]}, "spec.rules[0].backendRefs", "required field is missing"),
    ("TCPRoute", {"rules": [{"backendRefs": [{"name": "db"}]}]}, "spec.rules[0].backendRefs[0].port", "required"),
    ("TCPRoute", {"rules": [{"backendRefs": [{"name": "d", "port": 1}]}] * 17}, "spec.rules", "at most 16"),
    (
        "TCPRoute",
        {"rules": [{"name": "a", "backendRefs": [{"name": "d", "port": 1}]}] * 2},
        "spec.rules[1].name",
        "not unique",
    ),
    (
        "TCPRoute",
        {"rules": [{"backendRefs": [{"name": "d", "port": 1, "weight": -1}]}]},
        "spec.rules[0].backendRefs[0].weight",
        "",
    ),
    # TLSRoute
    ("TLSRoute", {"hostnames": ["10.0.0.1"], "rules": [{}]}, "spec.hostnames[0]", "not a DNS name"),
    ("TLSRoute", {"rules": [{"backendRefs": []}]}, "spec.rules[0].backendRefs", "must not be empty"),
    ("TLSRoute", {"rules": [{"backendRefs": [{"name": "d", "port": 1}] * 17}]}, "spec.rules[0].backendRefs", "16"),
    ("TLSRoute", {"parentRefs": [{"name": "w", "port": 0}], "rules": [{}]}, "spec.parentRefs[0].port", ""),
    # Telemetry
    ("Telemetry", {"metric": []}, "spec.metric", "unknown field"),
    (
        "Telemetry",
        {"selector": {"matchLabels": {"a": "b"}}, "targetRefs": [{"kind": "Service", "name": "s"}]},
        "spec.selector",
        "only one",
    ),
    ("Telemetry", {"targetRefs": [{"kind": "Pod", "name": "p"}]}, "spec.targetRefs[0].kind", "unsupported target"),
    ("Telemetry", {"metrics": [{"providers": [{}]}]}, "spec.metrics[0].providers[0].name", "required"),
    (
        "Telemetry",
        {"metrics": [{"overrides": [{"match": {"metric": "X"}}]}]},
        "spec.metrics[0].overrides[0].match.metric",
        "unsupported value",
    ),
    (
        "Telemetry",
        {"metrics": [{"overrides": [{"match": {"mode": "BOTH"}}]}]},
        "spec.metrics[0].overrides[0].match.mode",
        "",
    ),
    (
        "Telemetry",
        {"metrics": [{"overrides": [{"disabled": "no"}]}]},
        "spec.metrics[0].overrides[0].disabled",
        "boolean",
    ),
    (
        "Telemetry",
        {"metrics": [{"overrides": [{"tagOverrides": {"a": {}}}]}]},
        "spec.metrics[0].overrides[0].tagOverrides[a].value",
        "must be set",
    ),
    (
        "Telemetry",
        {"metrics": [{"overrides": [{"tagOverrides": {"a": {"operation": "DROP"}}}]}]},
        "spec.metrics[0].overrides[0].tagOverrides[a].operation",
        "unsupported value",
    ),
]


@pytest.mark.parametrize(
    ("kind", "spec", "path", "message"), INVALID, ids=[f"{k}-{i}-{p}" for i, (k, _, p, _) in enumerate(INVALID)]
)
def test_invalid_objects_name_the_field(kind: str, spec: Any, path: str, message: str) -> None:
    found = errors(kind, spec)
    assert any(e.path == path and message in e.message for e in found), found


def test_every_kind_has_valid_and_invalid_cases() -> None:
    kinds = {kind for _, kind in VALIDATORS}
    assert {k for k, _ in VALID} == kinds
    assert {k for k, *_ in INVALID} == kinds


def test_snake_case_field_names_are_accepted_like_protobuf_json() -> None:
    spec = {"port_level_mtls": {"80": {"mode": "STRICT"}}, "selector": {"match_labels": {"a": "b"}}}
    assert errors("PeerAuthentication", spec) == []


def test_deny_without_rules_is_accepted_with_a_warning() -> None:
    found = validate("AuthorizationPolicy", obj("AuthorizationPolicy", {"action": "DENY"}))
    assert found == [FieldError("spec.rules", "a DENY policy without rules matches nothing", warning=True)]


def test_bad_dry_run_annotation_is_refused() -> None:
    found = errors("AuthorizationPolicy", {}, annotations={"istio.io/dry-run": "yes"})
    assert [e.path for e in found] == ["metadata.annotations[istio.io/dry-run]"]


def test_several_errors_are_all_reported() -> None:
    spec = {"action": "NOPE", "rules": [{"to": [{"operation": {"ports": ["x", "0"]}}]}]}
    assert [e.path for e in errors("AuthorizationPolicy", spec)] == [
        "spec.action",
        "spec.rules[0].to[0].operation.ports[0]",
        "spec.rules[0].to[0].operation.ports[1]",
    ]


ISTIO_GATEWAY_SERVER = {"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["apps/*.example.com"]}
HTTPS_PORT = {"number": 443, "name": "https", "protocol": "HTTPS"}


@pytest.mark.parametrize(
    ("spec", "path", "message"),
    [
        ({"selector": {"istio": "ingressgateway"}, "servers": [ISTIO_GATEWAY_SERVER]}, "", ""),
        (
            {
                "servers": [
                    {**ISTIO_GATEWAY_SERVER, "port": HTTPS_PORT, "tls": {"mode": "SIMPLE", "credentialName": "c"}}
                ]
            },
            "",
            "",
        ),
        ({"servers": [{**ISTIO_GATEWAY_SERVER, "tls": {"httpsRedirect": True}}]}, "", ""),
        ({"servers": [{**ISTIO_GATEWAY_SERVER, "port": HTTPS_PORT}]}, "spec.servers[0].tls", "needs TLS settings"),
        (
            {"servers": [{**ISTIO_GATEWAY_SERVER, "port": HTTPS_PORT, "tls": {"mode": "SIMPLE"}}]},
            "spec.servers[0].tls.credentialName",
            "SIMPLE TLS needs credentialName",
        ),
        (
            {"servers": [{**ISTIO_GATEWAY_SERVER, "tls": {"mode": "SIMPLE", "credentialName": "c"}}]},
            "spec.servers[0].tls",
            "HTTP server cannot have TLS settings",
        ),
        (
            {"servers": [{**ISTIO_GATEWAY_SERVER, "port": {**HTTPS_PORT, "protocol": "QUIC"}}]},
            "spec.servers[0].port.protocol",
            "'QUIC' is not one of",
        ),
        (
            {"servers": [{**ISTIO_GATEWAY_SERVER, "port": {"number": 80, "protocol": "HTTP"}}]},
            "spec.servers[0].port.name",
            "required",
        ),
        (
            {
                "servers": [
                    {**ISTIO_GATEWAY_SERVER, "port": {**HTTPS_PORT, "targetPort": 8443}, "tls": {"mode": "PASSTHROUGH"}}
                ]
            },
            "spec.servers[0].port.targetPort",
            "no effect",
        ),
        (
            {
                "servers": [
                    {**ISTIO_GATEWAY_SERVER, "port": HTTPS_PORT, "tls": {"mode": "ISTIO_MUTUAL", "credentialName": "c"}}
                ]
            },
            "spec.servers[0].tls",
            "ISTIO_MUTUAL",
        ),
        ({"servers": [{**ISTIO_GATEWAY_SERVER, "hosts": ["*"]}]}, "", ""),
        ({"selector": {"istio": "ingressgateway"}}, "spec.servers", "required"),
        ({"servers": "all"}, "spec.servers", "expected"),
        ({"servers": [{"hosts": ["*"]}]}, "spec.servers[0].port", "required"),
        (
            {"servers": [{**ISTIO_GATEWAY_SERVER, "port": {"number": 0, "protocol": "HTTP"}}]},
            "spec.servers[0].port.number",
            "",
        ),
        ({"servers": [{**ISTIO_GATEWAY_SERVER, "hosts": []}]}, "spec.servers[0].hosts", "must not be empty"),
        ({"servers": [{**ISTIO_GATEWAY_SERVER, "hosts": ["a b"]}]}, "spec.servers[0].hosts[0]", "not a DNS name"),
        ({"servers": [{**ISTIO_GATEWAY_SERVER, "hosts": ["No_Such/x"]}]}, "spec.servers[0].hosts[0]", "namespace"),
        ({"servers": [{**ISTIO_GATEWAY_SERVER, "tls": {"mode": "LOOSE"}}]}, "spec.servers[0].tls.mode", "LOOSE"),
        ({"selector": {"istio": 1}, "servers": [ISTIO_GATEWAY_SERVER]}, "spec.selector[istio]", "expected a string"),
    ],
)
def test_istio_s_own_gateway_is_validated_by_its_group(spec: Any, path: str, message: str) -> None:
    found = [e for e in validate("Gateway", obj("Gateway", spec), group="networking.istio.io") if not e.warning]
    if not path:
        assert found == []
    else:
        assert any(e.path == path and message in e.message for e in found), found


@settings(max_examples=300, deadline=None)
@given(value=json_values())
def test_istio_s_gateway_validator_yields_only_field_errors_for_any_json(value: Any) -> None:
    servers = {"servers": [value, {"port": value, "hosts": value, "tls": value}], "selector": value}
    for candidate in (value, {"metadata": value, "spec": value}, {"spec": servers}):
        found = validate("Gateway", candidate, group="networking.istio.io")
        assert all(isinstance(e, FieldError) and e.path for e in found)


def test_a_gateway_of_no_named_group_is_gateway_api_s() -> None:
    istio_spec = {"selector": {"istio": "ingressgateway"}, "servers": [ISTIO_GATEWAY_SERVER]}
    assert validate("Gateway", obj("Gateway", istio_spec), group="networking.istio.io") == []
    assert any(e.path == "spec.gatewayClassName" for e in validate("Gateway", obj("Gateway", istio_spec)))


def test_unknown_kind_is_our_error() -> None:
    with pytest.raises(UnknownKindError, match="Pod"):
        validate("Pod", {})
    with pytest.raises(UnknownKindError):
        validate("Gateway", {}, group="example.com")


def test_non_object_is_one_field_error() -> None:
    assert validate("Gateway", [1, 2]) == [FieldError("<object>", "expected a JSON object")]


KINDS = sorted(kind for _, kind in VALIDATORS)


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(KINDS), value=json_values())
def test_any_json_yields_only_field_errors(kind: str, value: Any) -> None:
    for candidate in (value, {"metadata": value, "spec": value}):
        found = validate(kind, candidate)
        assert all(isinstance(e, FieldError) and e.path for e in found)


def _nested(leaves: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    names = st.sampled_from(
        ["rules", "from", "to", "when", "source", "operation", "ports", "key", "values", "hosts", "endpoints",
         "address", "listeners", "port", "protocol", "backendRefs", "matches", "path", "mtls", "mode",
         "portLevelMtls", "selector", "matchLabels", "targetRefs", "jwtRules", "resolution", "http", "route",
         "destination", "egress", "tls", "name", "kind", "network", "ipBlocks", "parentRefs", "method"]
    )  # fmt: skip
    return st.recursive(
        leaves, lambda children: st.lists(children, max_size=3) | st.dictionaries(names, children, max_size=4)
    )


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(KINDS), spec=_nested(st.none() | st.booleans() | st.integers() | st.text(max_size=8)))
def test_specs_built_from_field_names_yield_only_field_errors(kind: str, spec: Any) -> None:
    found = validate(kind, {"metadata": {"namespace": "default"}, "spec": spec})
    assert all(isinstance(e, FieldError) for e in found)


# -- AdmissionReview ------------------------------------------------------------------------------------------


def review(kind: str, spec: Any, operation: str = "CREATE", group: str | None = None, **metadata: Any) -> bytes:
    group = group if group is not None else next(g for g, k in VALIDATORS if k == kind)
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "1234",
                "kind": {"group": group, "version": "v1", "kind": kind},
                "operation": operation,
                "object": obj(kind, spec, **metadata),
            },
        }
    ).encode()


def test_invalid_object_is_denied_with_every_field_in_the_message() -> None:
    response = answer(parse_review(review("AuthorizationPolicy", {"action": "NOPE"})))["response"]
    assert response["uid"] == "1234"
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert response["status"]["message"].startswith("configuration is invalid: spec.action: unsupported value 'NOPE'")


def test_valid_object_is_allowed_and_warnings_come_back() -> None:
    out = answer(parse_review(review("AuthorizationPolicy", {"action": "DENY"})))
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["kind"] == "AdmissionReview"
    assert out["response"] == {
        "uid": "1234",
        "allowed": True,
        "warnings": ["spec.rules: a DENY policy without rules matches nothing"],
    }


def test_delete_is_not_checked() -> None:
    body = json.loads(review("Gateway", {}))
    body["request"].update(operation="DELETE", object=None)
    assert answer(parse_review(json.dumps(body).encode()))["response"] == {"uid": "1234", "allowed": True}


def test_always_reject_annotation_rejects_a_valid_object() -> None:
    raw = review("PeerAuthentication", {}, annotations={"internal.istio.io/webhook-always-reject": "true"})
    response = answer(parse_review(raw))["response"]
    assert response["allowed"] is False
    assert "always reject" in response["status"]["message"]


def test_unrecognized_type_is_denied() -> None:
    response = answer(parse_review(review("Gateway", {}, group="example.com")))["response"]
    assert response["allowed"] is False
    assert response["status"]["message"] == "unrecognized type Gateway.example.com"


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"{not json", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[]", "expected a JSON object"),
        (b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}', "expected apiVersion"),
        (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}', "request is missing"),
        (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}', "request.uid"),
        (
            b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u", "operation": '
            b'"CREATE", "kind": {"group": "g", "kind": "K"}}}',
            "request.object",
        ),
    ],
)
def test_malformed_reviews_are_our_error(body: bytes, why: str) -> None:
    with pytest.raises(MalformedReviewError, match=why):
        parse_review(body)


@settings(max_examples=200, deadline=None)
@given(value=json_values())
def test_parse_review_raises_only_our_error(value: Any) -> None:
    wrapped = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": value}
    for candidate in (value, wrapped):
        with contextlib.suppress(MalformedReviewError):
            answer(parse_review(json.dumps(candidate).encode()))


@settings(max_examples=200, deadline=None)
@given(kind=st.sampled_from(KINDS), operation=st.sampled_from(["CREATE", "UPDATE", "DELETE"]), value=json_values())
def test_well_formed_reviews_of_any_object_always_get_an_answer(kind: str, operation: str, value: Any) -> None:
    body = json.loads(review(kind, {}))
    body["request"].update(operation=operation, object={"metadata": value, "spec": value})
    response = answer(parse_review(json.dumps(body).encode()))["response"]
    assert response["uid"] == "1234" and isinstance(response["allowed"], bool)


# -- registration ---------------------------------------------------------------------------------------------


def test_webhook_configuration_covers_every_kind_and_fails_closed() -> None:
    config = webhook_configuration("https://127.0.0.1:15017/validate", b"PEM")
    assert config["metadata"]["name"] == "istio-validator-ambit"
    [hook] = config["webhooks"]
    assert hook["clientConfig"] == {
        "url": "https://127.0.0.1:15017/validate",
        "caBundle": base64.b64encode(b"PEM").decode(),
    }
    assert (hook["failurePolicy"], hook["sideEffects"], hook["admissionReviewVersions"]) == ("Fail", "None", ["v1"])
    resources = {(rule["apiGroups"][0], r) for rule in hook["rules"] for r in rule["resources"]}
    assert len(resources) == len(VALIDATORS)
    assert ("security.istio.io", "authorizationpolicies") in resources
    assert ("gateway.networking.k8s.io", "grpcroutes") in resources
    assert ("gateway.networking.k8s.io", "tcproutes") in resources
    assert ("gateway.networking.k8s.io", "tlsroutes") in resources
    assert all(rule["operations"] == ["CREATE", "UPDATE"] for rule in hook["rules"])


def test_a_dynamic_dns_entry_inside_the_mesh_cannot_be_bound_to_a_waypoint() -> None:
    spec = {"hosts": ["*.a.com"], "resolution": "DYNAMIC_DNS", "location": "MESH_INTERNAL"}
    bound = errors("ServiceEntry", spec, labels={"istio.io/use-waypoint": "egress"})
    assert [e.path for e in bound] == ["spec.location"]
    for labels in ({}, {"istio.io/use-waypoint": "None"}):
        assert errors("ServiceEntry", spec, labels=labels) == []


def test_an_envoy_filter_is_admitted_with_istiods_warnings() -> None:
    patch = {"applyTo": "CLUSTER", "match": {"proxy": {"proxyVersion": "1" * 1025}}, "patch": {"operation": "REMOVE"}}
    out = answer(parse_review(review("EnvoyFilter", {"configPatches": [patch]})))["response"]
    assert out["allowed"] is True
    assert out["warnings"][0].startswith("spec: EnvoyFilter exposes internal implementation details")
    assert "exceeds 1024 characters and will be ignored" in out["warnings"][1]


def test_a_huge_protocol_is_refused_without_searching_it() -> None:
    """The protocol pattern's nested repetitions take time quadratic in the length (16 KiB took 10 s): a listener
    protocol of a megabyte is refused by its length at once."""
    started = time.monotonic()
    listener = {"name": "a", "port": 80, "protocol": "a" * 1_000_000 + "-"}
    found = errors("Gateway", {"gatewayClassName": "istio", "listeners": [listener]})
    assert time.monotonic() - started < 1.0
    assert any("longer than 255" in e.message for e in found), found


ROUTE_TO_REVIEWS = [{"route": [{"destination": {"host": "reviews"}}]}]
SERVICE_ENTRY_PORTS = [{"number": 443, "name": "tls", "protocol": "TLS"}]
# (kind, the spec holding a value, a value that passes, the path its error names). The API server and istiod match
# these fields with Go patterns, whose ``$`` is the end of the text: "reviews\n" is no DNS name there.
TRAILING_NEWLINE: list[tuple[str, Any, str, str]] = [
    ("VirtualService", lambda v: {"hosts": [v], "http": ROUTE_TO_REVIEWS}, "reviews.example.com", "spec.hosts[0]"),
    ("DestinationRule", lambda v: {"host": v}, "reviews.app.svc.cluster.local", "spec.host"),
    ("DestinationRule", lambda v: {"host": "reviews", "subsets": [{"name": v}]}, "v1", "spec.subsets[0].name"),
    (
        "ServiceEntry",
        lambda v: {"hosts": [v], "ports": SERVICE_ENTRY_PORTS, "resolution": "DNS"},
        "api.example.com",
        "spec.hosts[0]",
    ),
    ("HTTPRoute", lambda v: {"parentRefs": [{"name": "g"}], "hostnames": [v]}, "a.example", "spec.hostnames[0]"),
    (
        "Gateway",
        lambda v: {"gatewayClassName": "istio", "listeners": [{"name": "a", "port": 80, "protocol": v}]},
        "HTTP",
        "spec.listeners[0].protocol",
    ),
    (
        "Gateway",
        lambda v: {"gatewayClassName": "istio", "listeners": [{"name": "a", "port": 80, "protocol": v}]},
        "example.com/custom",
        "spec.listeners[0].protocol",
    ),
    (
        "AuthorizationPolicy",
        lambda v: {"rules": [{"when": [{"key": v, "values": ["a"]}]}]},
        "request.headers[x-token]",
        "spec.rules[0].when[0].key",
    ),
    (
        "RequestAuthentication",
        lambda v: {"jwtRules": [{"issuer": "https://issuer.example", "timeout": v}]},
        "5s",
        "spec.jwtRules[0].timeout",
    ),
]


@pytest.mark.parametrize(
    ("kind", "spec", "value", "path"), TRAILING_NEWLINE, ids=[f"{k}-{p}-{v}" for k, _, v, p in TRAILING_NEWLINE]
)
def test_a_value_with_a_trailing_newline_is_refused(kind: str, spec: Any, value: str, path: str) -> None:
    assert errors(kind, spec(value)) == []
    assert [e.path for e in errors(kind, spec(value + "\n"))] == [path]

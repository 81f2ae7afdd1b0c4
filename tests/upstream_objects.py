"""Objects Istio's own ambient integration tests apply (istio tests/integration/ambient), as data for our tests:
one copy each, so the unit, integration and e2e tests that replay them cannot drift apart."""

from __future__ import annotations

from typing import Any


def customize_metrics_spec(service: str = "service-addressed-waypoint", **extra_tags: Any) -> dict[str, Any]:
    """TestCustomizeMetrics' Telemetry spec (a literal tag added, ``source_principal`` removed) on ``service``."""
    return {
        "targetRefs": [{"kind": "Service", "group": "core", "name": service}],
        "metrics": [
            {
                "providers": [{"name": "prometheus"}],
                "overrides": [
                    {
                        "match": {"metric": "REQUEST_COUNT"},
                        "tagOverrides": {
                            "custom_dimension": {"value": "'test'"},
                            "source_principal": {"operation": "REMOVE"},
                            **extra_tags,
                        },
                    }
                ],
            }
        ],
    }


def customize_metrics_telemetry(service: str, namespace: str | None = None, **extra_tags: Any) -> dict[str, Any]:
    """TestCustomizeMetrics' whole Telemetry object (named ``ns-default``) on ``service``."""
    metadata: dict[str, Any] = {"name": "ns-default"}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "telemetry.istio.io/v1",
        "kind": "Telemetry",
        "metadata": metadata,
        "spec": customize_metrics_spec(service, **extra_tags),
    }


def ingress_gateway(namespace: str | None = None, name: str = "gateway") -> dict[str, Any]:
    """TestIngress' (and TestAuthorizationGateway's) Istio Gateway: port 80 HTTP for every host on the pods labelled
    ``istio: ingressgateway``."""
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "Gateway",
        "metadata": metadata,
        "spec": {
            "selector": {"istio": "ingressgateway"},
            "servers": [{"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}],
        },
    }


def ingress_route(destination: str, namespace: str | None = None) -> dict[str, Any]:
    """TestIngress' VirtualService ``route``: every request through Gateway ``gateway`` to ``destination``."""
    metadata: dict[str, Any] = {"name": "route"}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": metadata,
        "spec": {
            "gateways": ["gateway"],
            "hosts": ["*"],
            "http": [{"route": [{"destination": {"host": destination}}]}],
        },
    }


def authorization_gateway_route(
    destination: str, allow_port: int, deny_port: int, namespace: str | None = None
) -> dict[str, Any]:
    """TestAuthorizationGateway's VirtualService ``route``: ``/allowed`` to one port of ``destination``, ``/deny`` to
    another."""
    metadata: dict[str, Any] = {"name": "route"}
    if namespace is not None:
        metadata["namespace"] = namespace

    def rule(path: str, port: int) -> dict[str, Any]:
        return {
            "match": [{"uri": {"exact": path}}],
            "route": [{"destination": {"host": destination, "port": {"number": port}}}],
        }

    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": metadata,
        "spec": {
            "gateways": ["gateway"],
            "hosts": ["*"],
            "http": [rule("/allowed", allow_port), rule("/deny", deny_port)],
        },
    }


def ingress_tls_objects(destination: str, port: int, namespace: str | None = None) -> list[dict[str, Any]]:
    """TestIngressTLS' objects (istio tests/integration/ambient baseline_test.go): TestIngress' Gateway, a
    VirtualService for every host to ``destination`` (a Service's short name) on ``port`` (its ``https`` port), and a
    DestinationRule for that host originating TLS (``SIMPLE``, ``insecureSkipVerify``), all in the test's
    namespace."""
    route: dict[str, Any] = {
        "apiVersion": "networking.istio.io/v1alpha3",
        "kind": "VirtualService",
        "metadata": {"name": "route"},
        "spec": {
            "gateways": ["gateway"],
            "hosts": ["*"],
            "http": [{"route": [{"destination": {"host": destination, "port": {"number": port}}}]}],
        },
    }
    rule: dict[str, Any] = {
        "apiVersion": "networking.istio.io/v1alpha3",
        "kind": "DestinationRule",
        "metadata": {"name": destination},
        "spec": {"host": destination, "trafficPolicy": {"tls": {"mode": "SIMPLE", "insecureSkipVerify": True}}},
    }
    gateway = ingress_gateway(namespace)
    gateway["apiVersion"] = "networking.istio.io/v1alpha3"
    if namespace is not None:
        route["metadata"]["namespace"] = rule["metadata"]["namespace"] = namespace
    return [gateway, route, rule]


LUA_INBOUND = (
    'function envoy_on_request(request_handle)\n  request_handle:headers():add("x-lua-inbound", "hello world")\nend\n'
)


def waypoint_envoy_filter(waypoint: str, namespace: str | None = None, name: str = "inbound") -> dict[str, Any]:
    """TestWaypointEnvoyFilter's EnvoyFilter on the waypoint Gateway ``waypoint``: a Lua filter before the router
    adding ``x-lua-inbound``, a virtual-host merge adding ``x-vhost-inbound``, and an inbound cluster merge of
    ``http2_protocol_options`` (which istiod applies to no cluster of a waypoint)."""
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "networking.istio.io/v1alpha3",
        "kind": "EnvoyFilter",
        "metadata": metadata,
        "spec": {
            "targetRefs": [{"kind": "Gateway", "name": waypoint, "group": "gateway.networking.k8s.io"}],
            "configPatches": [
                {
                    "applyTo": "HTTP_FILTER",
                    "match": {
                        "context": "SIDECAR_INBOUND",
                        "listener": {
                            "filterChain": {
                                "filter": {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "subFilter": {"name": "envoy.filters.http.router"},
                                }
                            }
                        },
                    },
                    "patch": {
                        "operation": "INSERT_BEFORE",
                        "value": {
                            "name": "envoy.lua",
                            "typed_config": {
                                "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
                                "inlineCode": LUA_INBOUND,
                            },
                        },
                    },
                },
                {
                    "applyTo": "VIRTUAL_HOST",
                    "match": {"context": "SIDECAR_INBOUND"},
                    "patch": {
                        "operation": "MERGE",
                        "value": {
                            "request_headers_to_add": [{"header": {"key": "x-vhost-inbound", "value": "hello world"}}]
                        },
                    },
                },
                {
                    "applyTo": "CLUSTER",
                    "match": {"context": "SIDECAR_INBOUND", "cluster": {}},
                    "patch": {"operation": "MERGE", "value": {"http2_protocol_options": {}}},
                },
            ],
        },
    }

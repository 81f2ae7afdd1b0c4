"""Istio's waypoint integration tests that the audit (docs/upstream-ambient-audit.md §1) lists as done but never run,
replayed on the shared mesh lab with upstream's objects and checks (tests/integration/ambient in the Istio source):

- waypoint/main_test.go TestCrossNamespaceWaypoint: a waypoint in another namespace admitting ``from: All``, the
  Service labelled ``istio.io/use-waypoint`` + ``istio.io/use-waypoint-namespace``, ``WaypointBound`` True, a
  producer HTTPRoute (parentRef the Service) whose response header proves the waypoint served the request;
- waypoint_test.go TestWaypointAsEgressGateway "basic", "http origination targetPort", "http origination route" and
  "authz on service allow": a ``resolution: DNS`` ServiceEntry whose endpoint is a cluster host name, bound to an
  egress waypoint in a third namespace (``allowedRoutes`` by namespace-name Selector); TLS origination by a
  DestinationRule, checked by the ALPN the TLS server saw;
- waypoint_canary_test.go CanaryNotReady, PolicyPropagation and IngressTrafficShift;
- waypoint_test.go TestWaypointStatus "gateway class";
- baseline_test.go TestServiceEntrySelectsUncapturedPod, TestWaypointWithInvalidBackend, TestAuthorizationGateway
  (to ``captured``, ``uncaptured`` and the waypoint-bound ``waypointed``), applyDrainingWorkaround's
  DestinationRule with traffic through a waypoint, and TestWaypointEnvoyFilter (the EnvoyFilter in the waypoint's
  namespace, which upstream's shares with the apps).

L7 means the server saw ``x-request-id`` (upstream's ``IsL7``). One set-up for the module: namespace ``upwp``
(ambient) holds the client and ``server`` (http-echo, Service port ``http`` 80 → 8090); ``upwp-wp`` (ambient) the
two waypoints ``crossns-waypoint`` (``from: All``) and ``egress-gateway`` (``from: Selector`` naming ``upwp``);
``upwp-ext`` (not in the mesh) the ``external`` Service, http-echo on 80 and https-echo on 443, as upstream's
MockExternal.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.lab_driver import (
    TEST_TIMEOUT,
    Lab,
    condition,
    http_echo_container,
    module_on_shared_lab,
    pod_manifest,
    sleeper,
    wait_until,
)
from tests.upstream_objects import waypoint_envoy_filter

from ambit import ISTIO_VERSION

pytestmark = [pytest.mark.root, pytest.mark.kubectl, pytest.mark.timeout(TEST_TIMEOUT)]
SHARES_THE_MESH_LAB = True  # tests/e2e/lab_driver.py shared_mesh_lab: one lab for the modules that share it

NS = "upwp"
WAYPOINT_NS = "upwp-wp"
EXTERNAL_NS = "upwp-ext"
CROSS = "crossns-waypoint"
EGRESS = "egress-gateway"
EGRESS_HOST = "fake-egress.example.com"

# One new connection per request (upstream's NewConnectionPerRequest where it matters: canary sampling).
CALLS = """
import http.client, json, sys
host, port, path, count, method = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
out = []
for _ in range(count):
    try:
        connection = http.client.HTTPConnection(host, port, timeout=5)
        connection.request(method, path, body=b"x" if method == "POST" else None)
        response = connection.getresponse()
        body = response.read()
        connection.close()
        try:
            answer = json.loads(body)
        except ValueError:
            answer = {}
        seen = {k.lower(): v for k, v in (answer.get("headers") or {}).items()}
        out.append({
            "status": response.status,
            "response_headers": {k.lower(): v for k, v in response.getheaders()},
            "request_id": seen.get("x-request-id", ""),
            "seen": seen,
            "alpn": answer.get("alpn"),
            "pod": answer.get("pod", ""),
        })
    except Exception as exc:
        out.append({"status": 0, "error": f"{type(exc).__name__}: {exc}"})
print(json.dumps(out))
"""


def waypoint(name: str, allowed: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": name, "annotations": {"networking.istio.io/service-type": "ClusterIP"}},
        "spec": {
            "gatewayClassName": "istio-waypoint",
            "listeners": [
                {"name": "mesh", "port": 15008, "protocol": "HBONE", "allowedRoutes": {"namespaces": allowed}}
            ],
        },
    }


def deployment(name: str, containers: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"terminationGracePeriodSeconds": 2, "containers": containers},
            },
        },
    }


def service(name: str, ports: list[tuple[str, int, int]]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {
            "selector": {"app": name},
            "ports": [{"name": n, "port": p, "targetPort": t} for n, p, t in ports],
        },
    }


HTTPS_ECHO = {
    "name": "https",
    "image": "none",
    "command": ["python3", "-m", "ambit.lab.apps", "https-echo", "--port", "8443", "--hostname", "external"],
    "readinessProbe": {"tcpSocket": {"port": 8443}, "periodSeconds": 1},
}


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with module_on_shared_lab(tmp_path_factory) as up:
        started = time.monotonic()
        for name in (NS, WAYPOINT_NS, EXTERNAL_NS):
            up.namespace(name)
        for name in (NS, WAYPOINT_NS):
            up.kubectl("label", "namespace", name, "istio.io/dataplane-mode=ambient")
        up.apply(
            waypoint(CROSS, {"from": "All"}),
            waypoint(EGRESS, {"from": "Selector", "selector": {"matchLabels": {"kubernetes.io/metadata.name": NS}}}),
            namespace=WAYPOINT_NS,
        )
        up.apply(
            deployment("external", [http_echo_container(8080), HTTPS_ECHO]),
            service("external", [("http", 80, 8080), ("https", 443, 8443)]),
            namespace=EXTERNAL_NS,
        )
        up.apply(
            deployment("server", [http_echo_container(8090)]),
            service("server", [("http", 80, 8090)]),
            pod_manifest("client", [sleeper()], labels={"app": "client"}),
            namespace=NS,
        )
        up.wait_pods_ready(NS, "", 2, timeout=120)
        up.wait_pods_ready(EXTERNAL_NS, "", 1, timeout=120)
        for name in (CROSS, EGRESS):  # upstream's checkWaypointIsReady
            up.wait_pods_ready(WAYPOINT_NS, f"gateway.networking.k8s.io/gateway-name={name}", 1, timeout=120)
        print(f"module set-up on the shared lab: {time.monotonic() - started:.1f} s")
        yield up
        assert up.log_tracebacks() == []


def calls(lab: Lab, host: str, port: int, count: int = 1, method: str = "GET") -> list[dict[str, Any]]:
    out = lab.exec("client", NS, "python3", "-c", CALLS, host, str(port), "/", str(count), method, timeout=120)
    answers: list[dict[str, Any]] = json.loads(out)
    return answers


def all_l7_ok(answers: list[dict[str, Any]]) -> bool:
    return bool(answers) and all(a["status"] == 200 and a["request_id"] for a in answers)


def bound(lab: Lab, kind: str, name: str) -> dict[str, Any]:
    return condition(lab.get(kind, name, "-n", NS), "istio.io/WaypointBound")


SERVER = f"server.{NS}.svc.cluster.local"
TRAVERSED = "x-custom-traversed-waypoint"

PRODUCER_ROUTE = {
    "apiVersion": "gateway.networking.k8s.io/v1",
    "kind": "HTTPRoute",
    "metadata": {"name": "httproute"},
    "spec": {
        "parentRefs": [{"name": "server", "kind": "Service", "group": ""}],
        "rules": [
            {
                "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                "backendRefs": [{"name": "server", "port": 80}],
                "filters": [
                    {
                        "type": "ResponseHeaderModifier",
                        "responseHeaderModifier": {"add": [{"name": "X-Custom-Traversed-Waypoint", "value": CROSS}]},
                    },
                    # Not upstream's: the same route also adds a request header, checked at the server.
                    {
                        "type": "RequestHeaderModifier",
                        "requestHeaderModifier": {"add": [{"name": "X-Producer-Route", "value": CROSS}]},
                    },
                ],
            }
        ],
    },
}


def test_cross_namespace_waypoint(lab: Lab) -> None:
    """TestCrossNamespaceWaypoint: the route's response header and x-request-id at the server on 5 calls (and the
    route's request header at the server)."""
    lab.apply(PRODUCER_ROUTE, namespace=NS)
    lab.kubectl(
        "label", "service", "server", "-n", NS, f"istio.io/use-waypoint-namespace={WAYPOINT_NS}",
        f"istio.io/use-waypoint={CROSS}", "--overwrite",
    )  # fmt: skip
    wait_until(
        "WaypointBound=True on the Service",
        lambda: bound(lab, "service", "server").get("status") == "True",
        timeout=60,
        interval=0.5,
    )

    def traversed() -> list[dict[str, Any]] | None:
        answers = calls(lab, SERVER, 80, 5)
        ok = all_l7_ok(answers) and all(a["response_headers"].get(TRAVERSED) == CROSS for a in answers)
        return answers if ok and all(a["seen"].get("x-producer-route") == CROSS for a in answers) else None

    wait_until("5 calls through the cross-namespace waypoint", traversed, timeout=60, interval=1.0)


def test_waypoint_envoy_filter(lab: Lab) -> None:
    """TestWaypointEnvoyFilter: upstream's EnvoyFilter (Lua before the router, a virtual-host header merge, an
    inbound cluster merge) targeting the Service's waypoint, in the waypoint's namespace: 5 calls each reach the
    server with ``X-Lua-Inbound`` and ``X-Vhost-Inbound: hello world``."""
    lab.kubectl(
        "label", "service", "server", "-n", NS, f"istio.io/use-waypoint-namespace={WAYPOINT_NS}",
        f"istio.io/use-waypoint={CROSS}", "--overwrite",
    )  # fmt: skip
    lab.apply(waypoint_envoy_filter(CROSS), namespace=WAYPOINT_NS)
    try:

        def both_headers() -> list[dict[str, Any]] | None:
            answers = calls(lab, SERVER, 80, 5)
            expected = {"x-lua-inbound": "hello world", "x-vhost-inbound": "hello world"}
            ok = all_l7_ok(answers) and all({k: a["seen"].get(k) for k in expected} == expected for a in answers)
            return answers if ok else None

        wait_until("5 calls with both EnvoyFilter headers at the server", both_headers, timeout=30, interval=0.5)
    finally:
        lab.kubectl("delete", "envoyfilter", "inbound", "-n", WAYPOINT_NS, "--ignore-not-found", check=False)


def test_waypoint_envoy_filter_pinned_to_the_istio_minor_and_on_the_waypoints_own_answers(lab: Lab) -> None:
    """Beyond upstream: of two header merges pinned by ``proxyVersion``, only the one pinned to the Istio minor Ambit
    implements applies; a Lua response hook edits the answers the waypoint forwards and its own 403 denials."""
    major, minor, _ = ISTIO_VERSION.split(".")
    pinned = waypoint_envoy_filter(CROSS, name="pinned")
    lua, merge, _ = pinned["spec"]["configPatches"]
    lua["patch"]["value"]["typed_config"]["inlineCode"] = (
        'function envoy_on_response(h) h:headers():add("x-lua-outbound", "bye") end'
    )
    ours, other = json.loads(json.dumps(merge)), json.loads(json.dumps(merge))
    ours["match"]["proxy"] = {"proxyVersion": rf"^{major}\.{minor}.*"}
    ours["patch"]["value"]["request_headers_to_add"][0]["header"]["key"] = "x-pinned-ours"
    other["match"]["proxy"] = {"proxyVersion": r"^1\.2[0-9].*"}
    other["patch"]["value"]["request_headers_to_add"][0]["header"]["key"] = "x-pinned-other"
    pinned["spec"]["configPatches"] = [lua, ours, other]
    deny = {
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": "deny-delete"},
        "spec": {
            "targetRefs": [{"kind": "Gateway", "group": "gateway.networking.k8s.io", "name": CROSS}],
            "action": "DENY",
            "rules": [{"to": [{"operation": {"methods": ["DELETE"]}}]}],
        },
    }
    lab.kubectl(
        "label", "service", "server", "-n", NS, f"istio.io/use-waypoint-namespace={WAYPOINT_NS}",
        f"istio.io/use-waypoint={CROSS}", "--overwrite",
    )  # fmt: skip
    lab.apply(pinned, deny, namespace=WAYPOINT_NS)
    try:

        def edited() -> list[dict[str, Any]] | None:
            answers = calls(lab, SERVER, 80, 3)
            ok = all_l7_ok(answers) and all(
                a["seen"].get("x-pinned-ours") == "hello world" and a["response_headers"].get("x-lua-outbound") == "bye"
                for a in answers
            )
            return answers if ok else None

        answers = wait_until("the pinned merge and the Lua response hook", edited, timeout=30, interval=0.5)
        assert all("x-pinned-other" not in a["seen"] for a in answers), answers
        denied = wait_until(
            "a DELETE denied by the waypoint",
            lambda: [a for a in calls(lab, SERVER, 80, 1, "DELETE") if a["status"] == 403] or None,
            timeout=30,
            interval=0.5,
        )
        assert denied[0]["response_headers"].get("x-lua-outbound") == "bye", denied
    finally:
        lab.kubectl("delete", "envoyfilter", "pinned", "-n", WAYPOINT_NS, "--ignore-not-found", check=False)
        lab.kubectl(
            "delete", "authorizationpolicy", "deny-delete", "-n", WAYPOINT_NS, "--ignore-not-found", check=False
        )


def test_a_canary_that_does_not_exist_keeps_the_primary(lab: Lab) -> None:
    """TestWeightedWaypointCanaryNotReady: a canary naming a waypoint that was never created, weight 50: every
    request of 40 (a new connection each) is served by the primary, which the route header marks."""
    lab.kubectl(
        "label", "service", "server", "-n", NS, f"istio.io/use-waypoint-namespace={WAYPOINT_NS}",
        f"istio.io/use-waypoint={CROSS}", "istio.io/use-waypoint-canary=does-not-exist", "--overwrite",
    )  # fmt: skip
    lab.kubectl("annotate", "service", "server", "-n", NS, "istio.io/use-waypoint-canary-weight=50", "--overwrite")
    try:
        wait_until(
            "the canary reported as not attached",
            lambda: "Canary" in str(bound(lab, "service", "server").get("message", "")),
            timeout=30,
            interval=0.5,
        )
        answers = calls(lab, SERVER, 80, 40)
        served = [a for a in answers if a["status"] == 200 and a["response_headers"].get(TRAVERSED) == CROSS]
        assert len(served) == 40, answers
    finally:
        lab.kubectl("label", "service", "server", "-n", NS, "istio.io/use-waypoint-canary-", check=False)
        lab.kubectl("annotate", "service", "server", "-n", NS, "istio.io/use-waypoint-canary-weight-", check=False)


def test_a_service_policy_reaches_the_canary_waypoint(lab: Lab) -> None:
    """TestWeightedWaypointPolicyPropagation: canary (here the egress waypoint, same namespace as the primary) at
    weight 100 and a Service-targeted L7 DENY of GET: every request is 403 from the canary."""
    deny = {
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": "deny-service-l7"},
        "spec": {
            "targetRefs": [{"kind": "Service", "group": "", "name": "server"}],
            "action": "DENY",
            "rules": [{"to": [{"operation": {"methods": ["GET"]}}]}],
        },
    }
    lab.kubectl(
        "label", "service", "server", "-n", NS, f"istio.io/use-waypoint-namespace={WAYPOINT_NS}",
        f"istio.io/use-waypoint={CROSS}", f"istio.io/use-waypoint-canary={EGRESS}",
        f"istio.io/use-waypoint-canary-namespace={WAYPOINT_NS}", "--overwrite",
    )  # fmt: skip
    lab.kubectl("annotate", "service", "server", "-n", NS, "istio.io/use-waypoint-canary-weight=100", "--overwrite")
    lab.apply(deny, namespace=NS)
    try:

        def denied() -> list[dict[str, Any]] | None:
            answers = calls(lab, SERVER, 80, 40)
            return answers if all(a["status"] == 403 for a in answers) else None

        wait_until("40 GETs denied by the canary waypoint", denied, timeout=90, interval=1.0)
    finally:
        lab.kubectl("delete", "authorizationpolicy", "deny-service-l7", "-n", NS, "--ignore-not-found", check=False)
        lab.kubectl(
            "label", "service", "server", "-n", NS, "istio.io/use-waypoint-canary-",
            "istio.io/use-waypoint-canary-namespace-", check=False,
        )  # fmt: skip
        lab.kubectl("annotate", "service", "server", "-n", NS, "istio.io/use-waypoint-canary-weight-", check=False)


INVALID_BACKEND_ROUTE = {
    "apiVersion": "gateway.networking.k8s.io/v1",
    "kind": "HTTPRoute",
    "metadata": {"name": "add-header"},
    "spec": {
        "parentRefs": [{"name": "server", "kind": "Service", "group": "", "port": 80}],
        "rules": [
            {
                "filters": [
                    {
                        "type": "RequestHeaderModifier",
                        "requestHeaderModifier": {"add": [{"name": "greeting", "value": "hello world!"}]},
                    }
                ],
                "backendRefs": [{"name": "invalid", "port": 80}],
            }
        ],
    },
}


def test_a_route_to_a_missing_backend_answers_500_at_the_waypoint(lab: Lab) -> None:
    """TestWaypointWithInvalidBackend (its destination, a sidecar there, is ``server`` here): an HTTPRoute whose only
    backend is a Service that does not exist gives 500. The producer route of the tests above goes first, as the
    older of two routes on one parent would win."""
    lab.kubectl("delete", "httproute", "httproute", "-n", NS, "--ignore-not-found")
    lab.apply(INVALID_BACKEND_ROUTE, namespace=NS)
    try:
        wait_until("500 for the invalid backend", lambda: [a["status"] for a in calls(lab, SERVER, 80)] == [500], 60, 1)
    finally:
        lab.kubectl("delete", "httproute", "add-header", "-n", NS, "--ignore-not-found")


EXTERNAL_ENTRY = {
    "apiVersion": "networking.istio.io/v1",
    "kind": "ServiceEntry",
    "metadata": {
        "name": "external",
        "labels": {"istio.io/use-waypoint": EGRESS, "istio.io/use-waypoint-namespace": WAYPOINT_NS},
    },
    "spec": {
        "hosts": [EGRESS_HOST],
        "ports": [
            {"name": "http", "number": 80, "protocol": "HTTP"},
            {"name": "https", "number": 443, "protocol": "HTTPS"},
            {"name": "http-for-tls", "number": 8080, "protocol": "HTTP", "targetPort": 443},
        ],
        "location": "MESH_EXTERNAL",
        "resolution": "DNS",
        "endpoints": [{"address": f"external.{EXTERNAL_NS}.svc.cluster.local"}],
    },
}

TLS_ORIGINATION = {
    "apiVersion": "networking.istio.io/v1",
    "kind": "DestinationRule",
    "metadata": {"name": "tls-origination"},
    "spec": {"host": EGRESS_HOST, "trafficPolicy": {"tls": {"mode": "SIMPLE", "insecureSkipVerify": True}}},
}

ROUTE_TO_PORT = {
    "apiVersion": "gateway.networking.k8s.io/v1",
    "kind": "HTTPRoute",
    "metadata": {"name": "route-port"},
    "spec": {
        "parentRefs": [{"kind": "ServiceEntry", "group": "networking.istio.io", "name": "external"}],
        "rules": [
            {"backendRefs": [{"kind": "Hostname", "group": "networking.istio.io", "name": EGRESS_HOST, "port": 443}]}
        ],
    },
}

ONLY_GET = {
    "apiVersion": "security.istio.io/v1",
    "kind": "AuthorizationPolicy",
    "metadata": {"name": "only-get"},
    "spec": {
        "targetRefs": [{"kind": "ServiceEntry", "group": "networking.istio.io", "name": "external"}],
        "action": "ALLOW",
        "rules": [{"to": [{"operation": {"methods": ["GET"]}}]}],
    },
}


def wait_answers(lab: Lab, what: str, port: int, ok: Any, method: str = "GET") -> None:
    last: list[list[dict[str, Any]]] = []

    def probe() -> list[dict[str, Any]] | None:
        last.append(calls(lab, EGRESS_HOST, port, 1, method))
        return last[-1] if ok(last[-1]) else None

    try:
        wait_until(what, probe, timeout=60, interval=1.0)
    except pytest.fail.Exception as exc:
        pytest.fail(f"{exc}; last answers {last[-1:]}")


def alpn_http11(answers: list[dict[str, Any]]) -> bool:
    return all_l7_ok(answers) and all(a["alpn"] == "http/1.1" for a in answers)


def test_waypoint_as_egress_gateway(lab: Lab) -> None:
    """TestWaypointAsEgressGateway "basic", "http origination targetPort", "http origination route", "authz on
    service allow", in upstream's order on one ServiceEntry."""
    lab.apply(EXTERNAL_ENTRY, namespace=NS)
    wait_until(
        "WaypointBound=True on the ServiceEntry",
        lambda: bound(lab, "serviceentry", "external").get("status") == "True",
        timeout=60,
        interval=0.5,
    )
    wait_answers(lab, "basic: OK and L7 on port 80", 80, all_l7_ok)

    lab.apply(TLS_ORIGINATION, namespace=NS)
    wait_answers(lab, "http origination targetPort: ALPN http/1.1 on 8080", 8080, alpn_http11)

    lab.apply(ROUTE_TO_PORT, namespace=NS)
    wait_answers(lab, "http origination route: ALPN http/1.1 on 80", 80, alpn_http11)
    lab.kubectl("delete", "httproute", "route-port", "-n", NS)
    lab.kubectl("delete", "destinationrule", "tls-origination", "-n", NS)

    lab.apply(ONLY_GET, namespace=NS)
    wait_answers(lab, "authz on service allow: POST 403", 80, lambda a: [x["status"] for x in a] == [403], "POST")
    wait_answers(lab, "authz on service allow: GET OK and L7", 80, all_l7_ok)


def test_the_waypoint_gateway_class_is_accepted_and_its_status_comes_back(lab: Lab) -> None:
    """TestWaypointStatus "gateway class": Accepted=True at the current generation; wiped, it is written again."""

    def accepted() -> bool:
        gwc = lab.get("gatewayclass", "istio-waypoint")
        cond = condition(gwc, "Accepted")
        return cond.get("status") == "True" and cond.get("observedGeneration") == gwc["metadata"].get("generation")

    wait_until("istio-waypoint Accepted at its generation", accepted, timeout=30, interval=0.5)
    # Upstream's form: an update of the object with the conditions emptied (the status subresource ignores it).
    gwc = lab.get("gatewayclass", "istio-waypoint")
    gwc["status"]["conditions"] = None
    lab.kubectl("replace", "-f", "-", input=json.dumps(gwc))
    wait_until("istio-waypoint Accepted after the update", accepted, timeout=30, interval=0.5)
    # The status really wiped, through its subresource.
    wipe = json.dumps({"status": {"conditions": None}})
    lab.kubectl("patch", "gatewayclass", "istio-waypoint", "--subresource=status", "--type=merge", "-p", wipe)
    wait_until("istio-waypoint Accepted written again", accepted, timeout=30, interval=0.5)


def two_port_containers(*extra: int) -> list[dict[str, Any]]:
    """http-echo on upstream's workload ports of ``http`` (18080) and ``http2`` (18085), and on ``extra``."""
    return [{**http_echo_container(port), "name": f"echo-{port}"} for port in (18080, 18085, *extra)]


TWO_PORTS = [("http", 80, 18080), ("http2", 85, 18085)]


def uncaptured_deployment() -> dict[str, Any]:
    """Upstream's ``uncaptured`` app: in the ambient namespace, its pods labelled out of the mesh; http-echo on 8080
    (the ServiceEntry's targetPort) and on the workload ports of its Service (:data:`TWO_PORTS`)."""
    manifest = deployment("uncaptured", two_port_containers(8080))
    manifest["spec"]["template"]["metadata"]["labels"]["istio.io/dataplane-mode"] = "none"
    return manifest


def waypointed_objects() -> list[dict[str, Any]]:
    """Upstream's ``service-addressed-waypoint`` app: :data:`TWO_PORTS`, the Service bound to the cross-namespace
    waypoint."""
    svc = service("waypointed", TWO_PORTS)
    svc["metadata"]["labels"] = {"istio.io/use-waypoint": CROSS, "istio.io/use-waypoint-namespace": WAYPOINT_NS}
    return [deployment("waypointed", two_port_containers()), svc]


def entry_selecting_uncaptured(location: str) -> dict[str, Any]:
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "ServiceEntry",
        "metadata": {"name": "test-se"},
        "spec": {
            "hosts": ["test.example.com"],
            "addresses": ["240.240.240.251", "2001:2::f0f0:251"],
            "ports": [{"number": 80, "name": "http", "protocol": "HTTP", "targetPort": 8080}],
            "resolution": "STATIC",
            "location": location,
            "workloadSelector": {"labels": {"app": "uncaptured"}},
        },
    }


@pytest.mark.parametrize("location", ["MESH_INTERNAL", "MESH_EXTERNAL"])
def test_a_service_entry_selects_an_uncaptured_pod(lab: Lab, location: str) -> None:
    """TestServiceEntrySelectsUncapturedPod: ``test.example.com`` (resolved by the node proxy's DNS proxy) reaches
    the uncaptured pod the entry's workloadSelector picks."""
    lab.apply(uncaptured_deployment(), entry_selecting_uncaptured(location), namespace=NS)
    lab.wait_pods_ready(NS, "app=uncaptured", 1, timeout=60)

    def reached() -> list[dict[str, Any]] | None:
        answers = calls(lab, "test.example.com", 80)
        return answers if all(a["status"] == 200 and a["pod"].startswith("uncaptured-") for a in answers) else None

    wait_until(f"test.example.com ({location}) reaches the uncaptured pod", reached, timeout=60, interval=1.0)


CLASSIC_GATEWAY = Path(__file__).resolve().parents[2] / "deploy" / "overlays" / "lab-ingressgateway"
INGRESS_SA = "istio-ingressgateway-service-account"


def captured_two_ports() -> list[dict[str, Any]]:
    """A ``captured`` app with upstream's ports ``http`` (80 → 18080) and ``http2`` (85 → 18085)."""
    return [deployment("captured", two_port_containers()), service("captured", TWO_PORTS)]


DESTINATIONS = ("captured", "uncaptured", "waypointed")


@pytest.fixture(scope="module")
def destinations(lab: Lab) -> None:
    """Upstream's destinations with ports ``http`` and ``http2``: ``captured``, ``uncaptured`` and
    ``waypointed`` (upstream's service-addressed-waypoint)."""
    lab.apply(
        *captured_two_ports(), uncaptured_deployment(), service("uncaptured", TWO_PORTS), *waypointed_objects(),
        namespace=NS,
    )  # fmt: skip
    for app in DESTINATIONS:
        lab.wait_pods_ready(NS, f"app={app}", 1, timeout=60)
    wait_until(
        "WaypointBound=True on waypointed",
        lambda: bound(lab, "service", "waypointed").get("status") == "True",
        timeout=60,
        interval=0.5,
    )


@pytest.fixture(scope="module")
def ingress(lab: Lab, destinations: None) -> Iterator[str]:
    """istio-ingressgateway (deploy/overlays/lab-ingressgateway) for the module's ingress cases; yields the
    gateway's load-balancer address."""
    lab.kubectl("apply", "-k", str(CLASSIC_GATEWAY))
    try:
        lab.wait_pods_ready("istio-system", "istio=ingressgateway", 1, timeout=180)
        address = wait_until("istio-ingressgateway has its load-balancer address", lambda: lb_address(lab), 60, 1)
        assert address is not None
        yield address
    finally:
        lab.kubectl("delete", "-k", str(CLASSIC_GATEWAY), "--ignore-not-found", "--wait=true")


def ingress_codes(ip: str, path: str, count: int) -> list[str]:
    """HTTP status codes of ``count`` requests from the host through the gateway (one curl, one line each)."""
    urls = [arg for _ in range(count) for arg in ("-o", "/dev/null", f"http://{ip}:80{path}")]
    done = subprocess.run(
        ["curl", "-s", "--max-time", "2", "-w", "%{http_code}\\n", *urls],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return done.stdout.split()


DRAINING_WORKAROUND = {
    "apiVersion": "networking.istio.io/v1",
    "kind": "DestinationRule",
    "metadata": {"name": "single-request"},
    "spec": {
        "host": "*.svc.cluster.local",
        "trafficPolicy": {"connectionPool": {"http": {"maxRequestsPerConnection": 1}}},
    },
}
"""Upstream's applyDrainingWorkaround (baseline_test.go): one request per upstream connection for every Service."""


def gateway_policy(destination: str) -> dict[str, Any]:
    """TestAuthorizationGateway's policy: the ingress gateway's principal on the workload port of ``http`` only."""
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": "policy"},
        "spec": {
            "selector": {"matchLabels": {"app": destination}},
            "rules": [
                {
                    "from": [{"source": {"principals": [f"cluster.local/ns/istio-system/sa/{INGRESS_SA}"]}}],
                    "to": [{"operation": {"ports": ["18080"]}}],
                },
                {
                    "from": [{"source": {"principals": [f"cluster.local/ns/{NS}/sa/someone-else"]}}],
                    "to": [{"operation": {"ports": ["18085"]}}],
                },
            ],
        },
    }


def ingress_answers(ip: str, path: str, count: int) -> list[tuple[int, str]]:
    """Status and answering pod (``""`` when none) of ``count`` requests from the host through the gateway, a new
    connection each (upstream's NewConnectionPerRequest)."""
    out: list[tuple[int, str]] = []
    for _ in range(count):
        try:
            with urllib.request.urlopen(f"http://{ip}:80{path}", timeout=2) as response:
                status, body = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, body = exc.code, exc.read()
        except OSError:
            status, body = 0, b""
        try:
            pod = str(json.loads(body).get("pod", ""))
        except ValueError:
            pod = ""
        out.append((status, pod))
    return out


def test_authorization_gateway(lab: Lab, ingress: str) -> None:
    """TestAuthorizationGateway "simple deny" / "simple allow" to each destination, with upstream's draining
    workaround applied first: a selector policy on the destination allows the ingress gateway's principal on the
    workload port of ``http`` only; through istio-ingressgateway, ``/allowed`` (port 80) is OK five times and
    ``/deny`` (port 85) is denied (403 or 503) five times, except at ``uncaptured``, which no proxy guards (OK)."""
    from tests.upstream_objects import authorization_gateway_route, ingress_gateway

    lab.apply(DRAINING_WORKAROUND, ingress_gateway(), namespace=NS)
    try:
        for destination in DESTINATIONS:
            lab.apply(gateway_policy(destination), authorization_gateway_route(destination, 80, 85), namespace=NS)

            def served(path: str, destination: str = destination) -> bool:
                answers = ingress_answers(ingress, path, 5)
                return all(code == 200 and pod.startswith(f"{destination}-") for code, pod in answers)

            wait_until(f"simple allow to {destination}: /allowed OK five times", lambda: served("/allowed"), 120, 1)
            if destination == "uncaptured":  # no proxy at the destination, no policy: OK
                denied = lambda: served("/deny")  # noqa: E731
            else:
                denied = lambda: {code for code, _ in ingress_answers(ingress, "/deny", 5)} <= {403, 503}  # noqa: E731
            wait_until(f"simple deny to {destination}: /deny judged five times", denied, 30, 1)
    finally:
        for kind, name in (
            ("authorizationpolicy", "policy"),
            ("virtualservice", "route"),
            ("gateways.networking.istio.io", "gateway"),
            ("destinationrule", "single-request"),
        ):
            lab.kubectl("delete", kind, name, "-n", NS, "--ignore-not-found")


KEEP_ALIVE_CALLS = """
import http.client, json, sys
host, count = sys.argv[1], int(sys.argv[2])
out = []
for port in (80, 85):
    connection = http.client.HTTPConnection(host, port, timeout=5)
    for _ in range(count):
        try:
            connection.request("GET", "/")
            response = connection.getresponse()
            answer = json.loads(response.read() or b"{}")
            seen = {k.lower(): v for k, v in (answer.get("headers") or {}).items()}
            out.append({"port": port, "status": response.status, "client": answer.get("client"),
                        "proto": answer.get("proto"), "request_id": seen.get("x-request-id", "")})
        except Exception as exc:
            out.append({"port": port, "status": 0, "error": f"{type(exc).__name__}: {exc}"})
            connection.close()
    connection.close()
print(json.dumps(out))
"""
"""``count`` GETs on one kept HTTP/1.1 connection to ``host`` on port 80 (``http``), then on port 85 (``http2``)."""


def test_the_draining_workaround_gives_each_request_its_own_connection_beyond_the_waypoint(
    lab: Lab, destinations: None
) -> None:
    """applyDrainingWorkaround with traffic through a waypoint: five GETs on one client connection to
    ``waypointed`` (port ``http``, and ``http2``, which the waypoint speaks HTTP/2 to) are each served at L7. The
    waypoint first reuses one upstream connection for them (the server sees one client address per port); with
    the DestinationRule (``*.svc.cluster.local``, maxRequestsPerConnection 1) each request reaches the server on a
    connection of its own, as Envoy's ``max_requests_per_connection`` does for HTTP/1.1 and HTTP/2 upstreams."""
    host = f"waypointed.{NS}.svc.cluster.local"

    def clients(want: int) -> list[dict[str, Any]] | None:
        answers: list[dict[str, Any]] = json.loads(lab.exec("client", NS, "python3", "-c", KEEP_ALIVE_CALLS, host, "5"))
        last.append(answers)
        if not all(a["status"] == 200 and a["request_id"] for a in answers) or len(answers) != 10:
            return None
        per_port = [{a["client"] for a in answers if a["port"] == port} for port in (80, 85)]
        return answers if all(len(addresses) == want for addresses in per_port) else None

    last: list[list[dict[str, Any]]] = []
    try:
        wait_until("one upstream connection per port without the rule", lambda: clients(1), 60, 1)
        lab.apply(DRAINING_WORKAROUND, namespace=NS)
        wait_until("a connection per request with the rule", lambda: clients(5), 60, 1)
    except pytest.fail.Exception as exc:
        pytest.fail(f"{exc}; last answers {last[-1:]}")
    finally:
        lab.kubectl("delete", "destinationrule", "single-request", "-n", NS, "--ignore-not-found")


CANARY_INGRESS = [
    {
        "apiVersion": "networking.istio.io/v1alpha3",
        "kind": "Gateway",
        "metadata": {"name": "canary-ingress"},
        "spec": {
            "selector": {"istio": "ingressgateway"},
            "servers": [{"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}],
        },
    },
    {
        "apiVersion": "networking.istio.io/v1alpha3",
        "kind": "VirtualService",
        "metadata": {"name": "canary-ingress-route"},
        "spec": {
            "gateways": ["canary-ingress"],
            "hosts": ["*"],
            "http": [{"route": [{"destination": {"host": "captured"}}]}],
        },
    },
]


def test_weighted_waypoint_ingress_traffic_shift(lab: Lab, ingress: str) -> None:
    """TestWeightedWaypointIngressTrafficShift: ``captured`` bound to a primary and a weighted canary waypoint and
    labelled ``istio.io/ingress-use-waypoint``; the gateway splits its requests per weight 0 / 100 / 50. At 0 which
    waypoint served is told as upstream does, at 0 and at 100: an ALLOW policy at the destination admitting only one
    waypoint's account, and only 200s counted (40 requests each); a request the destination refuses is retried by
    the gateway within the weighted set, never on the weight-0 waypoint. At 50 that check cannot tell: a retry
    after one waypoint's refusal goes to the other (as Envoy's retries skip hosts already tried), so all 40 succeed;
    the split is read from the waypoints' own request counts instead, with no policy in the way."""
    lab.apply(*CANARY_INGRESS, namespace=NS)
    lab.kubectl(
        "label", "service", "captured", "-n", NS, f"istio.io/use-waypoint-namespace={WAYPOINT_NS}",
        f"istio.io/use-waypoint={CROSS}", f"istio.io/use-waypoint-canary={EGRESS}",
        f"istio.io/use-waypoint-canary-namespace={WAYPOINT_NS}", "istio.io/ingress-use-waypoint=true", "--overwrite",
    )  # fmt: skip

    def served_through(waypoint_name: str, want: str) -> None:
        only = {
            "apiVersion": "security.istio.io/v1",
            "kind": "AuthorizationPolicy",
            "metadata": {"name": "allow-only-waypoint"},
            "spec": {
                "selector": {"matchLabels": {"app": "captured"}},
                "action": "ALLOW",
                "rules": [
                    {"from": [{"source": {"principals": [f"cluster.local/ns/{WAYPOINT_NS}/sa/{waypoint_name}"]}}]}
                ],
            },
        }
        lab.apply(only, namespace=NS)

        seen: list[tuple[dict[str, int], dict[str, int]]] = []

        def judged() -> bool:
            before = {name: waypoint_requests(lab, name) for name in (CROSS, EGRESS)}
            codes = Counter(ingress_codes(ingress, "/", 40))
            seen.append((codes, {name: waypoint_requests(lab, name) - count for name, count in before.items()}))
            served = codes["200"]
            return {"all": served == 40, "none": served == 0, "some": 0 < served < 40}[want]

        try:
            wait_until(f"{waypoint_name} served {want} of 40", judged, 90, 1)
        except pytest.fail.Exception as exc:
            pytest.fail(f"{exc}; status codes and requests per waypoint of the last rounds {seen[-3:]}")

    try:
        lab.kubectl("annotate", "service", "captured", "-n", NS, "istio.io/use-waypoint-canary-weight=0", "--overwrite")
        served_through(EGRESS, "none")
        served_through(CROSS, "all")
        lab.kubectl(
            "annotate", "service", "captured", "-n", NS, "istio.io/use-waypoint-canary-weight=100", "--overwrite"
        )
        served_through(EGRESS, "all")
        served_through(CROSS, "none")
        lab.kubectl("delete", "authorizationpolicy", "allow-only-waypoint", "-n", NS)
        for weight in (50,):
            lab.kubectl("annotate", "service", "captured", "-n", NS, f"istio.io/use-waypoint-canary-weight={weight}",
                        "--overwrite")  # fmt: skip
            rounds: list[tuple[dict[str, int], dict[str, int]]] = []

            def split(weight: int = weight, rounds: list[tuple[dict[str, int], dict[str, int]]] = rounds) -> bool:
                before = {name: waypoint_requests(lab, name) for name in (CROSS, EGRESS)}
                codes = Counter(ingress_codes(ingress, "/", 40))
                moved = {name: waypoint_requests(lab, name) - count for name, count in before.items()}
                rounds.append((codes, moved))
                if codes["200"] != 40 or sum(moved.values()) != 40:
                    return False
                return all(moved.values())

            try:
                wait_until(f"weight {weight}: the waypoints' shares of 40 requests", split, 90, 1)
            except pytest.fail.Exception as exc:
                pytest.fail(f"{exc}; status codes and requests per waypoint of the last rounds {rounds[-3:]}")
    finally:
        lab.kubectl("delete", "authorizationpolicy", "allow-only-waypoint", "-n", NS, "--ignore-not-found")


def waypoint_requests(lab: Lab, name: str) -> int:
    """``istio_requests_total`` with reporter="waypoint", summed, from the named waypoint's pods' :15020."""
    total = 0
    for pod in lab.pods(WAYPOINT_NS, f"gateway.networking.k8s.io/gateway-name={name}"):
        address = (pod.get("status") or {}).get("podIP")
        if not address:
            continue
        with urllib.request.urlopen(f"http://{address}:15020/metrics", timeout=5) as response:
            for line in response.read().decode().splitlines():
                if line.startswith("istio_requests_total{") and 'reporter="waypoint"' in line:
                    total += int(float(line.rsplit(" ", 1)[1]))
    return total


def lb_address(lab: Lab) -> str | None:
    service = lab.get("service", "istio-ingressgateway", "-n", "istio-system")
    ingress = ((service.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
    return str(ingress[0]["ip"]) if ingress and ingress[0].get("ip") else None

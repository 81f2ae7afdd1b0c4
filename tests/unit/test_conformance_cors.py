"""Gateway API conformance HTTPRouteCORS, replayed at unit level: the four routes of its manifests translated for
the ingress Gateway ``same-namespace`` (class ``istio``, :mod:`test_conformance_routing`'s base) and, the same
routes attached to the Service ``echo`` (:mod:`test_conformance_mesh_routing`'s base; the snapshot has no
MeshHTTPRouteCORS, the waypoint gets the same filter), and each of the test's seventeen requests judged as the
suite's ``CompareRoundTrip`` judges it:

- the status is one of those expected (200 when none is given);
- a request expected at the echo backend (``Namespace`` set) is forwarded there with its path, method and headers;
  a preflight whose expected request is empty (``Path`` and ``Namespace`` ``""``) must be answered by the proxy
  itself, as an echo answer would report the path and namespace;
- ``Headers`` must be present with that value, ``ValidHeaderValues`` present with one of theirs (repeated fields
  joined with ``,``; spaces ignored where the case says so), ``AbsentHeaders`` absent.

Both routes' ``Accepted`` and ``ResolvedRefs`` must be True.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from tests.unit import test_conformance_mesh_routing as mesh
from tests.unit import test_conformance_routing as gw

from ambit.waypoint.decisions import Decision, Forward, Respond

# The four routes of conformance/tests/httproute-cors.yaml, written here with the same filters and paths.
MANIFESTS = """
metadata: {name: cors-multiple-origins-methods-headers}
spec:
  parentRefs: [{name: same-namespace}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /cors-1}}]
    filters:
    - type: CORS
      cors:
        allowOrigins: ["https://www.foo.com", "https://*.bar.com"]
        allowMethods: [GET, OPTIONS]
        allowHeaders: [x-header-1, x-header-2]
        exposeHeaders: [x-header-3, x-header-4]
        allowCredentials: true
        maxAge: 3600
    backendRefs: [{name: infra-backend-v1, port: 8080}]
---
metadata: {name: cors-wildcard-methods}
spec:
  parentRefs: [{name: same-namespace}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /cors-2}}]
    filters: [{type: CORS, cors: {allowOrigins: ["https://www.foo.com"], allowMethods: ["*"]}}]
    backendRefs: [{name: infra-backend-v1, port: 8080}]
---
metadata: {name: cors-wildcard-origin}
spec:
  parentRefs: [{name: same-namespace}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /cors-wildcard-origin}}]
    filters: [{type: CORS, cors: {allowOrigins: ["*"], allowMethods: [PUT], allowCredentials: false}}]
    backendRefs: [{name: infra-backend-v1, port: 8080}]
---
metadata: {name: cors-wildcard-methods-headers}
spec:
  parentRefs: [{name: same-namespace}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /cors-wildcard-methods-headers}}]
    filters:
    - {type: CORS, cors: {allowOrigins: ["*"], allowMethods: ["*"], allowHeaders: ["*"], allowCredentials: true}}
    backendRefs: [{name: infra-backend-v1, port: 8080}]
  - matches: [{path: {type: PathPrefix, value: /cors-wildcard-methods-headers-unauth}}]
    filters:
    - {type: CORS, cors: {allowOrigins: ["*"], allowMethods: ["*"], allowHeaders: ["*"], allowCredentials: false}}
    backendRefs: [{name: infra-backend-v1, port: 8080}]
"""


@dataclass(frozen=True)
class Case:
    """One of the test's ``ExpectedResponse`` values."""

    name: str
    path: str
    method: str
    sent: dict[str, str]
    at_backend: bool
    """The expected request names the infra namespace: the echo backend must get it."""
    statuses: tuple[int, ...] = (200,)
    exact: dict[str, str] = field(default_factory=dict)
    one_of: dict[str, tuple[str, ...]] = field(default_factory=dict)
    absent: tuple[str, ...] = ()
    ignore_spaces: bool = False


FOO, BAR, OTHER = "https://www.foo.com", "https://www.bar.com", "https://other.foo.com"
ASKED = {"access-control-request-method": "GET", "access-control-request-headers": "x-header-1, x-header-2"}
CORS_1_PREFLIGHT = {
    "access-control-allow-methods": ("GET, OPTIONS", "OPTIONS, GET"),
    "access-control-allow-headers": ("x-header-1, x-header-2", "x-header-2, x-header-1"),
    "access-control-expose-headers": ("x-header-3, x-header-4", "x-header-4, x-header-3"),
    "access-control-max-age": ("3600",),
    "access-control-allow-credentials": ("true",),
}
PUT_ASKED = {"access-control-request-method": "PUT", "access-control-request-headers": "x-header-1, x-header-2"}
BOTH = ("x-header-1, x-header-2", "x-header-2, x-header-1")
CREDENTIALS = "access-control-allow-credentials"
ALLOW_ORIGIN = "access-control-allow-origin"

CASES = [
    Case(
        "preflight from an exact matching origin",
        "/cors-1",
        "OPTIONS",
        {"Origin": FOO, **ASKED},
        at_backend=False,
        statuses=(200, 204),
        one_of={ALLOW_ORIGIN: (FOO,), **CORS_1_PREFLIGHT},
        ignore_spaces=True,
    ),
    Case(
        "preflight from a wildcard matching origin",
        "/cors-1",
        "OPTIONS",
        {"Origin": BAR, **ASKED},
        at_backend=False,
        statuses=(200, 204),
        one_of={ALLOW_ORIGIN: (BAR,), **CORS_1_PREFLIGHT},
        ignore_spaces=True,
    ),
    Case(
        "preflight from an origin with more labels left of the wildcard",
        "/cors-1",
        "OPTIONS",
        {"Origin": "https://xpto.www.bar.com", **ASKED},
        at_backend=False,
        statuses=(200, 204),
        one_of={ALLOW_ORIGIN: ("https://xpto.www.bar.com",), **CORS_1_PREFLIGHT},
        ignore_spaces=True,
    ),
    Case(
        "preflight from a non-matching origin",
        "/cors-1",
        "OPTIONS",
        {"Origin": "https://foobar.com", "access-control-request-method": "GET"},
        at_backend=False,
        statuses=(200, 204, 403),
        absent=(ALLOW_ORIGIN,),
    ),
    Case(
        "simple request from an exact matching origin",
        "/cors-1",
        "GET",
        {"Origin": FOO, **ASKED},
        True,
        exact={ALLOW_ORIGIN: FOO},
    ),
    Case(
        "simple request from a wildcard matching origin",
        "/cors-1",
        "GET",
        {"Origin": BAR, **ASKED},
        True,
        exact={ALLOW_ORIGIN: BAR},
    ),
    Case(
        "simple request from a non-matching origin",
        "/cors-1",
        "GET",
        {"Origin": "https://foobar.com", "access-control-request-method": "GET"},
        True,
        absent=(ALLOW_ORIGIN,),
    ),
    Case(
        "preflight asking POST of allowMethods '*'",
        "/cors-2",
        "OPTIONS",
        {"Origin": FOO, "access-control-request-method": "POST"},
        at_backend=False,
        statuses=(200, 204),
        one_of={"access-control-allow-methods": ("POST", "*")},
        exact={ALLOW_ORIGIN: FOO},
        absent=(CREDENTIALS,),
    ),
    Case(
        "preflight without allowCredentials gets no credentials header",
        "/cors-2",
        "OPTIONS",
        {"Origin": FOO, "access-control-request-method": "POST"},
        at_backend=False,
        statuses=(200, 204),
        absent=(CREDENTIALS,),
    ),
    Case(
        "preflight to origin '*'",
        "/cors-wildcard-origin",
        "OPTIONS",
        {"Origin": "https://foobar.com", "access-control-request-method": "PUT"},
        at_backend=False,
        statuses=(200, 204),
        one_of={ALLOW_ORIGIN: ("https://foobar.com", "*"), "access-control-allow-methods": ("PUT",)},
        absent=(CREDENTIALS,),
    ),
    Case(
        "preflight to origin '*' from an origin with a port",
        "/cors-wildcard-origin",
        "OPTIONS",
        {"Origin": "https://foobar.com:12345", "access-control-request-method": "PUT"},
        at_backend=False,
        statuses=(200, 204),
        one_of={ALLOW_ORIGIN: ("https://foobar.com:12345", "*"), "access-control-allow-methods": ("PUT",)},
        absent=(CREDENTIALS,),
    ),
    Case(
        "request to origin '*' from an origin with a port",
        "/cors-wildcard-origin",
        "PUT",
        {"Origin": "https://foobar.com:12345"},
        True,
        one_of={ALLOW_ORIGIN: ("https://foobar.com:12345", "*")},
    ),
    Case(
        "simple request to origin '*'",
        "/cors-wildcard-origin",
        "PUT",
        {"Origin": "https://foobar.com"},
        True,
        one_of={ALLOW_ORIGIN: ("https://foobar.com", "*")},
        absent=(CREDENTIALS,),
    ),
    Case(
        "preflight to '*' everything with credentials echoes the origin",
        "/cors-wildcard-methods-headers",
        "OPTIONS",
        {"Origin": OTHER, **PUT_ASKED},
        at_backend=False,
        statuses=(200, 204),
        one_of={
            ALLOW_ORIGIN: (OTHER,),
            "access-control-allow-methods": ("PUT",),
            "access-control-allow-headers": BOTH,
            CREDENTIALS: ("true",),
        },
        ignore_spaces=True,
    ),
    Case(
        "preflight to '*' everything without credentials",
        "/cors-wildcard-methods-headers-unauth",
        "OPTIONS",
        {"Origin": OTHER, **PUT_ASKED},
        at_backend=False,
        statuses=(200, 204),
        one_of={
            ALLOW_ORIGIN: (OTHER, "*"),
            "access-control-allow-methods": ("PUT", "*"),
            "access-control-allow-headers": (*BOTH, "*"),
        },
        absent=(CREDENTIALS,),
        ignore_spaces=True,
    ),
    Case(
        "request with allowCredentials true gets the credentials header",
        "/cors-wildcard-methods-headers",
        "GET",
        {"Origin": OTHER},
        True,
        one_of={ALLOW_ORIGIN: (OTHER,), CREDENTIALS: ("true",)},
    ),
    Case(
        "request without allowCredentials gets no credentials header",
        "/cors-wildcard-methods-headers-unauth",
        "GET",
        {"Origin": OTHER},
        True,
        one_of={ALLOW_ORIGIN: (OTHER, "*")},
        absent=(CREDENTIALS,),
    ),
]


def judge(case: Case, decision: Decision, backend: str) -> None:
    """``CompareRoundTrip`` for one answer: ``backend`` is the echo Service's host name prefix."""
    status = decision.status if isinstance(decision, Respond) else 200  # the echo backend answers 200
    assert status in case.statuses, decision
    if status not in (200, 204):
        return
    if case.at_backend:
        assert isinstance(decision, Forward), decision
        assert decision.backend.hostname.startswith(f"{backend}."), decision.backend
        assert (decision.request.method, decision.request.path) == (case.method, case.path)
        seen = gw.joined(decision.request.headers)
        assert all(seen.get(k.lower()) == v for k, v in case.sent.items()), seen
        answered = gw.joined(decision.response_headers.applied([]) if decision.response_headers else [])
    else:
        assert isinstance(decision, Respond) and decision.body == b"", decision  # never the echo's answer
        answered = gw.joined(decision.headers)

    def squeeze(text: str) -> str:
        return text.replace(" ", "") if case.ignore_spaces else text

    for name, value in case.exact.items():
        assert squeeze(answered.get(name, "<absent>")) == squeeze(value), (name, answered)
    for name, values in case.one_of.items():
        assert name in answered, (name, answered)
        assert squeeze(answered[name]) in {squeeze(v) for v in values}, (name, answered)
    for name in case.absent:
        assert name.lower() not in answered, (name, answered)


@pytest.fixture(scope="module")
def gateways() -> gw.Gateways:
    return gw.Gateways(MANIFESTS)


@pytest.fixture(scope="module")
def waypoint() -> mesh.Mesh:
    return mesh.Mesh(mesh.to_mesh(MANIFESTS))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_ingress_answers_as_httproute_cors_expects(gateways: gw.Gateways, case: Case) -> None:
    judge(case, gateways.send(case.path, method=case.method, headers=case.sent), "infra-backend-v1")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_waypoint_answers_as_httproute_cors_expects(waypoint: mesh.Mesh, case: Case) -> None:
    judge(case, waypoint.send(case.path, method=case.method, headers=case.sent), "echo-v1")


def test_the_cors_routes_are_accepted_with_their_refs_resolved(gateways: gw.Gateways, waypoint: mesh.Mesh) -> None:
    statuses = [*gateways.out.status, *waypoint.out.route_status]
    assert len(statuses) == 8
    for status in statuses:
        (parent,) = status.parents
        assert {c.type: c.status for c in parent.conditions if c.type in ("Accepted", "ResolvedRefs")} == {
            "Accepted": True,
            "ResolvedRefs": True,
        }, status

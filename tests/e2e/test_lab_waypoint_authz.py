"""L7 AuthorizationPolicy at the waypoint on the lab (issue 18, TestAuthorizationL7 and friends): policies attached
by ``targetRefs`` to the waypoint's Gateway, to one Service, or from the root namespace to the GatewayClass
``istio-waypoint`` are enforced per request by the waypoint pods the control plane deployed, and carry the
``WaypointAccepted`` status istiod writes.

One lab for the module, the mesh installed from deploy/. Namespace ``wpz-app`` is ambient and enrolled in its
waypoint: Deployment ``echo`` behind Services ``echo`` and ``other``, client pods ``cli-a`` (service account
``alpha``) and ``cli-b`` (``beta``). Namespace ``wpz-two`` has its own waypoint and its own ``echo``. Every test
removes the policies it applied.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from tests.e2e.lab_driver import (
    TEST_TIMEOUT,
    Lab,
    ambit,
    condition,
    http_echo_container,
    module_on_shared_lab,
    pod_manifest,
    sleeper,
    wait_until,
)
from tests.unit.jwt_keys import claims, rsa_signer

pytestmark = [pytest.mark.root, pytest.mark.kubectl, pytest.mark.timeout(TEST_TIMEOUT)]
SHARES_THE_MESH_LAB = True  # tests/e2e/lab_driver.py shared_mesh_lab: one lab for the modules that share it

NS = "wpz-app"
NS2 = "wpz-two"
ROOT = "istio-system"
POLICY_WAIT = 60.0
DENIED = "RBAC: access denied"

CALLS = """
import json, sys, urllib.request, urllib.error
out = []
for spec in json.loads(sys.argv[1]):
    request = urllib.request.Request(spec["url"], method=spec.get("method", "GET"),
                                     data=b"x" if spec.get("method") == "POST" else None)
    for name, value in spec.get("headers", {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=5) as r:
            out.append([r.status, ""])
    except urllib.error.HTTPError as exc:
        out.append([exc.code, exc.read().decode("utf-8", "replace")])
    except Exception as exc:
        out.append([0, type(exc).__name__])
print(json.dumps(out))
"""


def deployment(name: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"terminationGracePeriodSeconds": 2, "containers": [http_echo_container(8080)]},
            },
        },
    }


def service(name: str, app: str = "echo") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": {"app": app}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
    }


def account(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}


def enroll(lab: Lab, namespace: str) -> None:
    done = ambit(
        "waypoint", "apply", "-n", namespace, "--enroll-namespace", "--wait",
        "--kubeconfig", str(lab.topology.kubeconfig), timeout=240,
    )  # fmt: skip
    assert "applied" in done.stdout, done.stdout


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with module_on_shared_lab(tmp_path_factory) as up:
        for ns in (NS, NS2):
            up.namespace(ns)
            up.kubectl("label", "namespace", ns, "istio.io/dataplane-mode=ambient")
        up.apply(
            account("alpha"),
            account("beta"),
            deployment("echo"),
            service("echo"),
            service("other"),
            pod_manifest("cli-a", [sleeper()], labels={"app": "cli-a"}, serviceAccountName="alpha"),
            pod_manifest("cli-b", [sleeper()], labels={"app": "cli-b"}, serviceAccountName="beta"),
            namespace=NS,
        )
        up.apply(deployment("echo"), service("echo"), namespace=NS2)
        up.wait_pods_ready(NS, "", 3, timeout=300)  # a bound on correctness: a loaded machine starts pods slowly
        up.wait_pods_ready(NS2, "", 1, timeout=300)
        enroll(up, NS)
        enroll(up, NS2)
        yield up
        assert up.log_tracebacks() == []


def vip(lab: Lab, name: str, namespace: str = NS) -> str:
    return str(lab.get("service", name, "-n", namespace)["spec"]["clusterIP"])


def calls(lab: Lab, client: str, specs: list[dict[str, Any]]) -> list[tuple[int, str]]:
    out = lab.exec(client, NS, "python3", "-c", CALLS, json.dumps(specs), timeout=120)
    return [(status, body) for status, body in json.loads(out)]


def policy(
    name: str, namespace: str, refs: list[dict[str, Any]], rules: list[Any], action: str = "ALLOW"
) -> dict[str, Any]:
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"targetRefs": refs, "action": action, "rules": rules},
    }


def gateway_ref(name: str = "waypoint") -> dict[str, Any]:
    return {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": name}


def service_ref(name: str) -> dict[str, Any]:
    return {"group": "", "kind": "Service", "name": name}


CLASS_REF = {"group": "gateway.networking.k8s.io", "kind": "GatewayClass", "name": "istio-waypoint"}


@pytest.fixture
def policies(lab: Lab) -> Iterator[list[tuple[str, str]]]:
    """(namespace, name) of the policies a test applies; all removed after it, whatever happened."""
    applied: list[tuple[str, str]] = []
    yield applied
    for namespace, name in applied:
        lab.kubectl("delete", "authorizationpolicy", name, "-n", namespace, "--ignore-not-found")


def apply(lab: Lab, applied: list[tuple[str, str]], *objects: dict[str, Any]) -> None:
    for obj in objects:
        meta = obj["metadata"]
        applied.append((meta["namespace"], meta["name"]))
        lab.apply(obj, namespace=meta["namespace"])


def expect(lab: Lab, table: list[tuple[str, dict[str, Any], int]], what: str) -> None:
    """Poll until every (client, request, status) of ``table`` holds; denials must say ``RBAC: access denied``."""

    def holds() -> bool:
        for client in {c for c, _, _ in table}:
            rows = [(spec, want) for c, spec, want in table if c == client]
            got = calls(lab, client, [spec for spec, _ in rows])
            for (_, want), (status, body) in zip(rows, got, strict=True):
                if status != want or (want == 403 and body != DENIED):
                    return False
        return True

    try:
        wait_until(what, holds, timeout=POLICY_WAIT, interval=1.0)
    except pytest.fail.Exception:
        seen = {
            client: calls(lab, client, [s for c, s, _ in table if c == client]) for client in {c for c, _, _ in table}
        }
        pytest.fail(f"{what}: expected {[(c, s, w) for c, s, w in table]}, saw {seen}")


def waypoint_accepted(lab: Lab, namespace: str, name: str) -> dict[str, Any]:
    def found() -> dict[str, Any]:
        return condition(lab.get("authorizationpolicy", name, "-n", namespace), "WaypointAccepted")

    return wait_until(f"WaypointAccepted on {namespace}/{name}", found, timeout=POLICY_WAIT)


def test_authorization_l7_table(lab: Lab, policies: list[tuple[str, str]]) -> None:
    echo = f"http://{vip(lab, 'echo')}"
    apply(
        lab,
        policies,
        policy(
            "allow-paths",
            NS,
            [gateway_ref()],
            [
                {
                    "to": [{"operation": {"paths": ["/ok*", "*/public"]}}],
                    "when": [{"key": "request.headers[x-team]", "notValues": ["evil"]}],
                }
            ],
        ),
        policy("deny-post", NS, [gateway_ref()], [{"to": [{"operation": {"methods": ["POST"]}}]}], "DENY"),
        policy(
            "deny-dev", NS, [gateway_ref()], [{"when": [{"key": "request.headers[x-env]", "values": ["dev"]}]}], "DENY"
        ),
    )
    expect(
        lab,
        [
            ("cli-a", {"url": f"{echo}/ok"}, 200),  # allowed path
            ("cli-a", {"url": f"{echo}/nope"}, 403),  # denied path
            ("cli-a", {"url": f"{echo}/ok", "method": "POST"}, 403),  # an explicit DENY of a POST beats the ALLOW
            ("cli-a", {"url": f"{echo}/any/thing/public"}, 200),  # wildcard (suffix) path
            ("cli-a", {"url": f"{echo}/ok/../nope"}, 403),  # dot segments are resolved before the check
            ("cli-a", {"url": f"{echo}/ok", "headers": {"x-env": "dev"}}, 403),  # header values
            ("cli-a", {"url": f"{echo}/ok", "headers": {"x-env": "prod"}}, 200),
            ("cli-a", {"url": f"{echo}/ok", "headers": {"x-team": "evil"}}, 403),  # header notValues
            ("cli-a", {"url": f"{echo}/ok", "headers": {"x-team": "good"}}, 200),
        ],
        "the L7 table holds",
    )
    for name in ("allow-paths", "deny-post", "deny-dev"):
        accepted = waypoint_accepted(lab, NS, name)
        assert (accepted["status"], accepted["reason"], accepted["message"]) == (
            "True",
            "Accepted",
            f"bound to {NS}/waypoint",
        ), accepted
        assert condition(lab.get("authorizationpolicy", name, "-n", NS), "ZtunnelAccepted") == {}


def test_a_service_attached_policy_affects_only_that_service_and_judges_identities(
    lab: Lab, policies: list[tuple[str, str]]
) -> None:
    echo, other = f"http://{vip(lab, 'echo')}", f"http://{vip(lab, 'other')}"
    alpha = f"cluster.local/ns/{NS}/sa/alpha"
    apply(
        lab,
        policies,
        policy("other-alpha-only", NS, [service_ref("other")], [{"from": [{"source": {"principals": [alpha]}}]}]),
        policy(
            "other-no-admin-for-alpha",
            NS,
            [service_ref("other")],
            [{"from": [{"source": {"serviceAccounts": ["alpha"]}}], "to": [{"operation": {"paths": ["/admin*"]}}]}],
            "DENY",
        ),
        policy("ghost", NS, [service_ref("ghost")], []),
    )
    expect(
        lab,
        [
            ("cli-a", {"url": f"{other}/x"}, 200),  # identity allow
            ("cli-b", {"url": f"{other}/x"}, 403),  # not in the allow list
            ("cli-a", {"url": f"{other}/admin"}, 403),  # identity deny
            ("cli-b", {"url": f"{echo}/x"}, 200),  # the other Service is not affected
            ("cli-a", {"url": f"{echo}/admin"}, 200),
        ],
        "the Service-attached policies hold",
    )
    accepted = waypoint_accepted(lab, NS, "other-alpha-only")
    assert (accepted["status"], accepted["reason"], accepted["message"]) == (
        "True",
        "Accepted",
        f"bound to {NS}/waypoint",
    )
    missing = waypoint_accepted(lab, NS, "ghost")
    assert (missing["status"], missing["reason"]) == ("False", "TargetNotFound"), missing


def test_a_gateway_class_policy_in_the_root_namespace_applies_to_every_waypoint(
    lab: Lab, policies: list[tuple[str, str]]
) -> None:
    here, there = f"http://{vip(lab, 'echo')}", f"http://{vip(lab, 'echo', NS2)}"
    block = {"x-block": "yes"}
    apply(
        lab,
        policies,
        policy(
            "block-header",
            ROOT,
            [CLASS_REF],
            [{"when": [{"key": "request.headers[x-block]", "values": ["yes"]}]}],
            "DENY",
        ),
        policy("class-outside-root", NS, [CLASS_REF], [], "DENY"),
    )
    expect(
        lab,
        [
            ("cli-a", {"url": f"{here}/x", "headers": block}, 403),
            ("cli-a", {"url": f"{there}/x", "headers": block}, 403),
            ("cli-a", {"url": f"{here}/x"}, 200),
            ("cli-a", {"url": f"{there}/x"}, 200),
        ],
        "the GatewayClass policy holds at both waypoints",
    )
    accepted = waypoint_accepted(lab, ROOT, "block-header")
    assert (accepted["status"], accepted["reason"], accepted["message"]) == (
        "True",
        "Accepted",
        "bound to istio-waypoint",
    )
    refused = waypoint_accepted(lab, NS, "class-outside-root")
    assert (refused["status"], refused["reason"]) == ("False", "Invalid"), refused


ISSUER = "https://issuer.example"


def request_authentication(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "RequestAuthentication",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


@pytest.fixture
def authns(lab: Lab) -> Iterator[list[str]]:
    """Names of the RequestAuthentications a test applies in NS; all removed after it."""
    applied: list[str] = []
    yield applied
    for name in applied:
        lab.kubectl("delete", "requestauthentication", name, "-n", NS, "--ignore-not-found")


def test_jwt_at_the_waypoint(lab: Lab, policies: list[tuple[str, str]], authns: list[str]) -> None:
    """TestL7JWT: a RequestAuthentication attached to the waypoint validates tokens; a policy that needs a request
    principal forbids a request without one; a bad token is 401 whatever the policies; one attached by selector is
    not the waypoint's and is ignored there."""
    other = f"http://{vip(lab, 'other')}"
    signer, stranger = rsa_signer(), rsa_signer()
    now = time.time()
    valid = signer.sign(claims(ISSUER, now=now))
    expired = signer.sign(claims(ISSUER, now=now - 7200))
    untrusted = stranger.sign(claims("https://elsewhere.example", now=now))
    authns.append("jwt")
    lab.apply(
        request_authentication(
            "jwt", {"targetRefs": [gateway_ref()], "jwtRules": [{"issuer": ISSUER, "jwks": signer.jwks()}]}
        ),
        namespace=NS,
    )
    apply(
        lab,
        policies,
        policy("need-jwt", NS, [service_ref("other")], [{"from": [{"source": {"requestPrincipals": ["*"]}}]}]),
    )

    def bearer(token: str) -> dict[str, str]:
        return {"authorization": f"Bearer {token}"}

    expect(
        lab,
        [
            ("cli-a", {"url": f"{other}/x"}, 403),  # no token where a principal is required
            ("cli-a", {"url": f"{other}/x", "headers": bearer(valid)}, 200),  # valid issuer
        ],
        "the waypoint asks for a token and accepts a valid one",
    )
    got = calls(
        lab,
        "cli-a",
        [{"url": f"{other}/x", "headers": bearer(untrusted)}, {"url": f"{other}/x", "headers": bearer(expired)}],
    )
    assert got == [(401, "Jwt issuer is not configured"), (401, "Jwt is expired")], got

    # Only a selector-attached RequestAuthentication for the stranger's issuer: the waypoint ignores it, so the
    # stranger's token authenticates nothing there (403 from the policy, not 200; and no 401 since no rule applies).
    lab.kubectl("delete", "requestauthentication", "jwt", "-n", NS)
    authns.append("by-selector")
    lab.apply(
        request_authentication(
            "by-selector",
            {
                "selector": {"matchLabels": {"app": "echo"}},
                "jwtRules": [{"issuer": "https://elsewhere.example", "jwks": stranger.jwks()}],
            },
        ),
        namespace=NS,
    )
    expect(
        lab,
        [("cli-a", {"url": f"{other}/x", "headers": bearer(untrusted)}, 403)],
        "a selector RequestAuthentication is ignored at the waypoint",
    )


WORKLOAD_WAYPOINT = "wl-waypoint"


@pytest.fixture(scope="module")
def workload_addressed(lab: Lab) -> Iterator[str]:
    """Upstream's ``workload-addressed-waypoint`` destination: a waypoint ``wl-waypoint`` for workload traffic
    (``istio.io/waypoint-for: workload``) and a pod ``wl-echo`` labelled ``istio.io/use-waypoint: wl-waypoint``;
    its pod IP is yielded (traffic to it goes through the waypoint; no Service)."""
    kubeconfig = str(lab.topology.kubeconfig)
    done = ambit(
        "waypoint", "apply", "-n", NS, "--name", WORKLOAD_WAYPOINT, "--for", "workload", "--wait",
        "--kubeconfig", kubeconfig, timeout=240,
    )  # fmt: skip
    assert "applied" in done.stdout, done.stdout
    labels = {"app": "wl-echo", "istio.io/use-waypoint": WORKLOAD_WAYPOINT}
    lab.apply(pod_manifest("wl-echo", [http_echo_container(8080)], labels=labels), namespace=NS)
    try:
        (pod,) = lab.wait_pods_ready(NS, "app=wl-echo", 1, timeout=120)
        yield str(pod["status"]["podIP"])
    finally:
        lab.kubectl("delete", "pod", "wl-echo", "-n", NS, "--ignore-not-found", "--wait=false")
        ambit("waypoint", "delete", "-n", NS, WORKLOAD_WAYPOINT, "--kubeconfig", kubeconfig, check=False)


def upstream_l7_rules(source: str) -> list[dict[str, Any]]:
    """TestAuthorizationL7's ``policySpec`` rules, ``{{.Source}}`` the caller's service account."""
    get = {"methods": ["GET"]}
    return [
        {"to": [{"operation": {"paths": ["/allowed"], **get}}]},
        {
            "from": [{"source": {"principals": [f"cluster.local/ns/{NS}/sa/{source}"]}}],
            "to": [{"operation": {"paths": ["/allowed-identity"], **get}}],
        },
        {
            "from": [{"source": {"principals": [f"cluster.local/ns/{NS}/sa/someone-else"]}}],
            "to": [{"operation": {"paths": ["/denied-identity"], **get}}],
        },
        {"to": [{"operation": {"paths": ["/allowed-wildcard*"], **get}}]},
        {
            "to": [{"operation": {"paths": ["/headers"], **get}}],
            "when": [{"key": "request.headers[x-test-header]", "values": ["match"], "notValues": ["do-not-match"]}],
        },
        {"to": [{"operation": {"methods": ["POST"]}}]},
    ]


def selector_policy(
    name: str, namespace: str, app: str | None, rules: list[Any], action: str = "ALLOW"
) -> dict[str, Any]:
    """A policy for the node proxies: on the pods labelled ``app`` (on the whole namespace for None)."""
    spec: dict[str, Any] = {"action": action, "rules": rules}
    if app is not None:
        spec["selector"] = {"matchLabels": {"app": app}}
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def test_authorization_l7_at_a_workload_addressed_waypoint(
    lab: Lab, policies: list[tuple[str, str]], workload_addressed: str
) -> None:
    """TestAuthorizationL7 (u:tests/integration/ambient/baseline_test.go:1426-1660) to the
    ``workload-addressed-waypoint`` destination, addressed by pod IP as upstream's ``overrideCheck`` does: ``policy``
    (selector: the pod) allows only the waypoint's identity, ``policy-waypoint`` (targetRefs the waypoint Gateway)
    is upstream's rule list with ``{{.Source}}`` = ``alpha`` (``cli-a``), ``deny-policy-waypoint`` denies
    ``/explicit-deny``, and ``deny-policy`` (selector: the pod) the same, which leaves the node proxy nothing it can
    enforce (istiod's "no effect"; a:controlplane/translate/policies.py rules 7-8), so it must not deny the
    waypoint's connections. Upstream's cases from ``cli-a``: simple deny, simple allow, identity deny and allow,
    explicit deny (POST), wildcard allow, headers allow and deny; and ``cli-b`` (another identity) is denied the
    identity path. Denials carry the waypoint's ``RBAC: access denied`` (the node proxy cannot judge paths).
    Upstream runs every source against every destination; here two captured sources and this one destination, and
    the waypoint is applied with ``ambit waypoint apply --for workload`` rather than istioctl."""
    pod = f"http://{workload_addressed}:8080"
    waypoint = f"cluster.local/ns/{NS}/sa/{WORKLOAD_WAYPOINT}"
    apply(
        lab,
        policies,
        selector_policy("policy", NS, "wl-echo", [{"from": [{"source": {"principals": [waypoint]}}]}]),
        policy("policy-waypoint", NS, [gateway_ref(WORKLOAD_WAYPOINT)], upstream_l7_rules("alpha")),
        selector_policy("deny-policy", NS, "wl-echo", [{"to": [{"operation": {"paths": ["/explicit-deny"]}}]}], "DENY"),
        policy(
            "deny-policy-waypoint",
            NS,
            [gateway_ref(WORKLOAD_WAYPOINT)],
            [{"to": [{"operation": {"paths": ["/explicit-deny"]}}]}],
            "DENY",
        ),
    )
    expect(
        lab,
        [
            ("cli-a", {"url": f"{pod}/deny"}, 403),  # simple deny
            ("cli-a", {"url": f"{pod}/allowed"}, 200),  # simple allow
            ("cli-a", {"url": f"{pod}/denied-identity"}, 403),  # identity deny
            ("cli-a", {"url": f"{pod}/allowed-identity"}, 200),  # identity allow
            ("cli-b", {"url": f"{pod}/allowed-identity"}, 403),  # another identity
            ("cli-a", {"url": f"{pod}/explicit-deny", "method": "POST"}, 403),  # explicit deny beats the POST allow
            ("cli-a", {"url": f"{pod}/anything", "method": "POST"}, 200),
            ("cli-a", {"url": f"{pod}/allowed-wildcardtest"}, 200),  # wildcard allow
            ("cli-a", {"url": f"{pod}/headers", "headers": {"x-test-header": "match"}}, 200),  # headers allow
            ("cli-a", {"url": f"{pod}/headers", "headers": {"x-test-header": "do-not-match"}}, 403),  # headers deny
        ],
        "the L7 table holds at the workload-addressed waypoint",
    )
    accepted = waypoint_accepted(lab, NS, "policy-waypoint")
    assert (accepted["status"], accepted["reason"], accepted["message"]) == (
        "True",
        "Accepted",
        f"bound to {NS}/{WORKLOAD_WAYPOINT}",
    ), accepted


def test_waypoint_default_deny_at_a_workload_addressed_waypoint(
    lab: Lab, policies: list[tuple[str, str]], workload_addressed: str
) -> None:
    """TestAuthorizationWaypointDefaultDeny (u:tests/integration/ambient/baseline_test.go:1335-1424) to the
    ``workload-addressed-waypoint`` destination by pod IP: ``allow-nothing`` in the root namespace denies the call
    (upstream's CheckDeny: 403, 503 or a reset); ``allow-from-waypoint`` in the destination's namespace (the
    waypoint's identity) lets it through the waypoint again; ``allow-nothing-waypoint`` (root, targetRefs the
    GatewayClass ``istio-waypoint``) then denies it at the waypoint, 403 ``RBAC: access denied``. Upstream runs it
    from every captured source to every waypoint-bound destination; here from ``cli-a`` to this one."""
    url = f"http://{workload_addressed}:8080/"
    waypoint = f"cluster.local/ns/{NS}/sa/{WORKLOAD_WAYPOINT}"

    def settles(what: str, ok: Callable[[int, str], bool]) -> None:
        seen: list[tuple[int, str]] = []

        def holds() -> bool:
            seen[:] = calls(lab, "cli-a", [{"url": url}] * 3)
            return all(ok(status, body) for status, body in seen)

        try:
            wait_until(what, holds, timeout=POLICY_WAIT, interval=1.0)
        except pytest.fail.Exception:
            pytest.fail(f"{what}: saw {seen}")

    apply(lab, policies, selector_policy("allow-nothing", ROOT, None, []) | {"spec": {}})
    settles("allow-nothing denies the call", lambda status, _: status in (0, 403, 503))
    apply(
        lab,
        policies,
        selector_policy("allow-from-waypoint", NS, None, [{"from": [{"source": {"principals": [waypoint]}}]}]),
    )
    settles("allow-from-waypoint lets it through", lambda status, _: status == 200)
    apply(
        lab,
        policies,
        policy("allow-nothing-waypoint", ROOT, [CLASS_REF], [], "ALLOW") | {"spec": {"targetRefs": [CLASS_REF]}},
    )
    settles("allow-nothing-waypoint denies it at the waypoint", lambda status, body: (status, body) == (403, DENIED))

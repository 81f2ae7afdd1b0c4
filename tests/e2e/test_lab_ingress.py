"""The ingress gateway end to end on the lab (issue 18, "Done when", ingress part): a Gateway of class ``istio``
deployed by the control plane gets a LoadBalancer address from the lab, and ``curl`` on the host reaches a mesh
Service through it over HTTP and HTTPS (SNI choosing between two certificates); a rotated certificate is served
without a restart; the backend's node proxy sees the gateway's SPIFFE identity as the peer; a Service labelled
``istio.io/ingress-use-waypoint`` is reached through its waypoint; TLS passes through a passthrough listener to the
backend the TLSRoute for its server name names; a TLS ``Terminate`` listener and a passthrough one share a port; a
GRPCRoute routes gRPC calls from the host by method to two Services, trailers intact.

One lab for the module, the mesh installed from deploy/. Namespace ``in-app`` is ambient (Deployment and Service
``echo``); namespace ``in-edge`` holds the Gateway ``edge`` (listeners http 8080, https 8443 for a.example and
b.example, tls 9443 passing TLS through, routes from all namespaces) and its two TLS Secrets; the HTTPRoute lives
in ``in-app``.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.lab_driver import (
    TEST_TIMEOUT,
    Lab,
    ambit,
    condition,
    http_echo_container,
    module_on_shared_lab,
    wait_until,
)

from ambit.tls.certs import KeyPair, issue_server_cert, new_ca

pytestmark = [pytest.mark.root, pytest.mark.kubectl, pytest.mark.timeout(TEST_TIMEOUT)]
SHARES_THE_MESH_LAB = True  # tests/e2e/lab_driver.py shared_mesh_lab: one lab for the modules that share it

APP, EDGE = "in-app", "in-edge"
GATEWAY_ID = f"spiffe://cluster.local/ns/{EDGE}/sa/edge-istio"


def tls_secret(name: str, pair: KeyPair) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "type": "kubernetes.io/tls",
        "data": {
            "tls.crt": base64.b64encode(pair.cert_pem).decode(),
            "tls.key": base64.b64encode(pair.key_pem).decode(),
        },
    }


def https_listener(name: str, host: str, secret: str) -> dict[str, Any]:
    return {
        "name": name,
        "port": 8443,
        "protocol": "HTTPS",
        "hostname": host,
        "tls": {"mode": "Terminate", "certificateRefs": [{"name": secret}]},
        "allowedRoutes": {"namespaces": {"from": "All"}},
    }


GATEWAY = {
    "apiVersion": "gateway.networking.k8s.io/v1",
    "kind": "Gateway",
    "metadata": {"name": "edge"},
    "spec": {
        "gatewayClassName": "istio",
        "listeners": [
            {"name": "http", "port": 8080, "protocol": "HTTP", "allowedRoutes": {"namespaces": {"from": "All"}}},
            https_listener("https-a", "a.example", "cert-a"),
            https_listener("https-b", "b.example", "cert-b"),
            {
                "name": "tls",
                "port": 9443,
                "protocol": "TLS",
                "tls": {"mode": "Passthrough"},
                "allowedRoutes": {"namespaces": {"from": "All"}},
            },
        ],
    },
}
ROUTE = {
    "apiVersion": "gateway.networking.k8s.io/v1",
    "kind": "HTTPRoute",
    "metadata": {"name": "echo"},
    "spec": {
        "parentRefs": [{"name": "edge", "namespace": EDGE}],
        "hostnames": ["a.example", "b.example"],
        "rules": [{"backendRefs": [{"name": "echo", "port": 80}]}],
    },
}


class Certificates:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ca = new_ca("e2e ingress CA", now=time.time())
        self.ca_file = directory / "ca.pem"
        self.ca_file.write_bytes(self.ca.cert_pem)

    def issue(self, host: str, ca: KeyPair | None = None) -> KeyPair:
        return issue_server_cert(ca or self.ca, common_name=host, dns_names=[host], ip_addresses=[], now=time.time())


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return Certificates(tmp_path_factory.mktemp("e2e-ingress-certs"))


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, certs: Certificates) -> Iterator[Lab]:
    with module_on_shared_lab(tmp_path_factory) as up:
        up.namespace(APP)
        up.namespace(EDGE)
        up.kubectl("label", "namespace", APP, "istio.io/dataplane-mode=ambient")
        echo = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "echo"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "echo"}},
                "template": {
                    "metadata": {"labels": {"app": "echo"}},
                    "spec": {"terminationGracePeriodSeconds": 2, "containers": [http_echo_container(8080)]},
                },
            },
        }
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "echo"},
            "spec": {"selector": {"app": "echo"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
        }
        up.apply(echo, service, ROUTE, namespace=APP)
        up.apply(
            tls_secret("cert-a", certs.issue("a.example")),
            tls_secret("cert-b", certs.issue("b.example")),
            GATEWAY,
            namespace=EDGE,
        )
        up.wait_pods_ready(APP, "app=echo", 1, timeout=120)
        yield up
        assert up.log_tracebacks() == []


def address(lab: Lab, name: str = "edge") -> str:
    def programmed() -> str | None:
        gateway = lab.get("gateway", name, "-n", EDGE)
        if condition(gateway, "Programmed").get("status") != "True":
            return None
        addresses = (gateway.get("status") or {}).get("addresses") or []
        return str(addresses[0]["value"]) if addresses else None

    return wait_until("the Gateway is Programmed with its load-balancer address", programmed, timeout=240, interval=1)


def curl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["curl", "-sS", "--max-time", "5", *args], capture_output=True, text=True, timeout=15, check=False
    )


def through_gateway(*args: str) -> dict[str, Any] | None:
    done = curl(*args)
    if done.returncode != 0:
        return None
    try:
        answer: dict[str, Any] = json.loads(done.stdout)
    except ValueError:
        return None
    return answer


def gateway_peer_connections(lab: Lab) -> int:
    """Connections the node proxies accepted from the gateway's identity (reporter="destination")."""
    total = 0
    for node in ("node-1", "node-2"):
        for line in lab.node_proxy_metrics(node).splitlines():
            if (
                line.startswith("istio_tcp_connections_opened_total{")
                and 'reporter="destination"' in line
                and f'source_principal="{GATEWAY_ID}"' in line
            ):
                total += int(float(line.rsplit(" ", 1)[1]))
    return total


def test_http_from_the_host_reaches_the_mesh_service_with_the_gateway_s_identity(lab: Lab) -> None:
    ip = address(lab)
    answer = wait_until(
        "curl on the host reaches echo through the gateway",
        lambda: through_gateway("-H", "Host: a.example", f"http://{ip}:8080/hello"),
        timeout=120,
        interval=1,
    )
    assert answer["path"] == "/hello" and answer["pod"].startswith("echo-")
    assert wait_until("the backend's node proxy saw the gateway", lambda: gateway_peer_connections(lab), 30) >= 1
    missing = curl("-o", "/dev/null", "-w", "%{http_code}", "-H", "Host: nobody.example", f"http://{ip}:8080/")
    assert missing.stdout == "404"
    gateway = lab.get("gateway", "edge", "-n", EDGE)
    listeners = {item["name"]: item for item in gateway["status"]["listeners"]}
    assert listeners["http"]["attachedRoutes"] == 1


def grpc_app(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A Deployment (one replica of the lab's grpc-echo: ``/echo.Echo/Say`` and ``/echo.Echo/Who``) and its
    Service ``name`` (port ``grpc`` 50051)."""
    container = {
        "name": "grpc",
        "image": "none",
        "command": ["python3", "-m", "ambit.lab.apps", "grpc-echo", "--port", "50051"],
        "readinessProbe": {"tcpSocket": {"port": 50051}, "periodSeconds": 1},
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"terminationGracePeriodSeconds": 2, "containers": [container]},
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {
            "selector": {"app": name},
            "ports": [{"name": "grpc", "port": 50051, "targetPort": 50051, "appProtocol": "grpc"}],
        },
    }
    return deployment, service


GRPC_ROUTE = {
    "apiVersion": "gateway.networking.k8s.io/v1",
    "kind": "GRPCRoute",
    "metadata": {"name": "grpc-echo"},
    "spec": {
        "parentRefs": [{"name": "edge", "namespace": EDGE, "sectionName": "http"}],
        "hostnames": ["grpc.example"],
        "rules": [
            {
                "matches": [{"method": {"service": "echo.Echo", "method": "Say"}}],
                "backendRefs": [{"name": "grpc-say", "port": 50051}],
            },
            {
                "matches": [{"method": {"service": "echo.Echo", "method": "Who"}}],
                "backendRefs": [{"name": "grpc-who", "port": 50051}],
            },
        ],
    },
}


def test_grpc_from_the_host_is_routed_by_method_with_its_trailers_intact(lab: Lab) -> None:
    """A GRPCRoute on the gateway's HTTP listener (h2c with prior knowledge): ``Say`` goes to one Service, ``Who``
    to another, and a failing call's ``grpc-status``, ``grpc-message`` and trailing metadata come back whole."""
    import grpc  # the host's grpcio (a dependency of the control plane)

    lab.apply(*grpc_app("grpc-say"), *grpc_app("grpc-who"), GRPC_ROUTE, namespace=APP)
    lab.wait_pods_ready(APP, "app=grpc-say", 1, timeout=120)
    lab.wait_pods_ready(APP, "app=grpc-who", 1, timeout=120)
    ip = address(lab)
    options = [("grpc.default_authority", "grpc.example")]

    def call(method: str, body: bytes) -> bytes | None:
        with grpc.insecure_channel(f"{ip}:8080", options=options) as channel:
            try:
                answer: bytes = channel.unary_unary(f"/echo.Echo/{method}")(body, timeout=5)
            except grpc.RpcError:
                return None
            return answer

    said = wait_until("Say reaches grpc-say through the gateway", lambda: call("Say", b"hi"), timeout=120, interval=1)
    assert said.decode().startswith("grpc-say-") and said.endswith(b":hi"), said
    who = wait_until("Who reaches grpc-who through the gateway", lambda: call("Who", b""), timeout=60, interval=1)
    answer = json.loads(who)
    assert str(answer["pod"]).startswith("grpc-who-"), answer
    with grpc.insecure_channel(f"{ip}:8080", options=options) as channel:
        with pytest.raises(grpc.RpcError) as failed:
            channel.unary_unary("/echo.Echo/Say")(b"fail", timeout=5)
        error = failed.value
        assert error.code() == grpc.StatusCode.NOT_FOUND, error  # type: ignore[attr-defined]
        assert str(error.details()).endswith("was asked to fail"), error.details()  # type: ignore[attr-defined]
        trailers = dict(error.trailing_metadata() or ())  # type: ignore[attr-defined]
        assert str(trailers.get("x-pod", "")).startswith("grpc-say-"), trailers
        # A method no rule matches is answered by the gateway (UNIMPLEMENTED: its 404), reaching no backend.
        with pytest.raises(grpc.RpcError) as unrouted:
            channel.unary_unary("/echo.Other/Say")(b"hi", timeout=5)
        assert unrouted.value.code() == grpc.StatusCode.UNIMPLEMENTED  # type: ignore[attr-defined]
    route = lab.get("grpcroute", "grpc-echo", "-n", APP)
    parents = (route.get("status") or {}).get("parents") or []
    assert parents and condition({"status": parents[0]}, "Accepted").get("status") == "True", route.get("status")


def test_https_sni_picks_between_two_certificates(lab: Lab, certs: Certificates) -> None:
    ip = address(lab)
    for host in ("a.example", "b.example"):
        args = ("--cacert", str(certs.ca_file), "--resolve", f"{host}:8443:{ip}", f"https://{host}:8443/tls")
        answer = wait_until(
            f"https://{host} is served", lambda args=args: through_gateway(*args), timeout=60, interval=1
        )
        assert answer["path"] == "/tls"


def test_a_rotated_certificate_is_served_without_a_restart(lab: Lab, certs: Certificates) -> None:
    ip = address(lab)
    pods_before = {
        p["metadata"]["uid"]: p["status"]["containerStatuses"][0].get("restartCount", 0)
        for p in lab.pods(EDGE, "gateway.networking.k8s.io/gateway-name=edge")
    }
    other_ca = new_ca("e2e rotated CA", now=time.time())
    other_file = certs.directory / "rotated-ca.pem"
    other_file.write_bytes(other_ca.cert_pem)
    lab.apply(tls_secret("cert-a", certs.issue("a.example", other_ca)), namespace=EDGE)
    args = ("--resolve", f"a.example:8443:{ip}", "https://a.example:8443/rotated")
    answer = wait_until(
        "the rotated certificate is served",
        lambda: through_gateway("--cacert", str(other_file), *args),
        timeout=60,
        interval=1,
    )
    assert answer["path"] == "/rotated"
    assert curl("--cacert", str(certs.ca_file), *args).returncode != 0  # the old certificate is gone
    pods_after = {
        p["metadata"]["uid"]: p["status"]["containerStatuses"][0].get("restartCount", 0)
        for p in lab.pods(EDGE, "gateway.networking.k8s.io/gateway-name=edge")
    }
    assert pods_after == pods_before  # same pods, no restarts


def waypoint_requests(lab: Lab) -> int:
    total = 0
    for pod in lab.pods(APP, "gateway.networking.k8s.io/gateway-name=waypoint"):
        ip = (pod.get("status") or {}).get("podIP")
        if not ip:
            continue
        with urllib.request.urlopen(f"http://{ip}:15020/metrics", timeout=5) as response:
            for line in response.read().decode().splitlines():
                if line.startswith("istio_requests_total{") and 'reporter="waypoint"' in line:
                    total += int(float(line.rsplit(" ", 1)[1]))
    return total


def test_ingress_use_waypoint_sends_the_gateway_s_traffic_through_the_waypoint(lab: Lab) -> None:
    ip = address(lab)
    done = ambit(
        "waypoint", "apply", "-n", APP, "--enroll-namespace", "--wait", "--kubeconfig", str(lab.topology.kubeconfig),
        timeout=240,
    )  # fmt: skip
    assert "applied" in done.stdout, done.stdout
    url = f"http://{ip}:8080/"
    wait_until("the gateway still reaches echo", lambda: through_gateway("-H", "Host: a.example", url), 60, 1)
    before = waypoint_requests(lab)
    for _ in range(3):
        assert through_gateway("-H", "Host: a.example", url) is not None
    assert waypoint_requests(lab) == before  # without the label the gateway goes straight to the endpoints
    lab.kubectl("label", "service", "echo", "-n", APP, f"{INGRESS_USE_WAYPOINT}=true")

    def via_waypoint() -> bool:
        start = waypoint_requests(lab)
        answer = through_gateway("-H", "Host: a.example", url)
        return answer is not None and waypoint_requests(lab) > start

    wait_until("requests from the gateway go through the waypoint", via_waypoint, timeout=60, interval=1)


XFCC_ANNOTATION = "ambient.istio.io/xfcc-include-client-identity"
INGRESS_USE_WAYPOINT = "istio.io/ingress-use-waypoint"
WAYPOINT_ID = f"spiffe://cluster.local/ns/{APP}/sa/waypoint"


def echoed_headers(answer: dict[str, Any] | None) -> dict[str, str]:
    """The request headers the echo backend received, names lower-cased."""
    headers = (answer or {}).get("headers") or {}
    return {str(k).lower(): str(v) for k, v in headers.items()}


def test_the_waypoint_adds_the_client_identity_to_xfcc_when_its_gateway_asks(lab: Lab) -> None:
    """TestWaypointXFCCClientIdentity, the source being the ingress gateway; continues from the previous test (the
    waypoint serves echo and the gateway goes through it)."""
    ip = address(lab)
    url = f"http://{ip}:8080/xfcc"
    forged = ("-H", f"X-Forwarded-Client-Cert: URI=spiffe://cluster.local/ns/{APP}/sa/admin")
    answer = wait_until("echo answers", lambda: through_gateway("-H", "Host: a.example", *forged, url), 60, 1)
    assert "x-forwarded-client-cert" not in echoed_headers(answer)  # no annotation: no client URI, forgery dropped
    lab.kubectl("annotate", "gateway", "waypoint", "-n", APP, f"{XFCC_ANNOTATION}=true")
    expected = f"By={WAYPOINT_ID};URI={GATEWAY_ID}"

    def annotated() -> bool:
        headers = echoed_headers(through_gateway("-H", "Host: a.example", *forged, url))
        return headers.get("x-forwarded-client-cert") == expected

    wait_until("the waypoint adds By=<waypoint>;URI=<gateway> and drops the forged one", annotated, 120, 1)
    lab.kubectl("annotate", "gateway", "waypoint", "-n", APP, f"{XFCC_ANNOTATION}-")

    def removed() -> bool:
        answer = through_gateway("-H", "Host: a.example", *forged, url)
        return answer is not None and "x-forwarded-client-cert" not in echoed_headers(answer)

    wait_until("without the annotation again there is no XFCC", removed, 120, 1)


def test_request_authentication_and_a_principal_policy_at_the_gateway(lab: Lab) -> None:
    """RequestAuthentication attached to the Gateway by targetRefs, AuthorizationPolicy selecting its pods: a bad
    token is 401, no token 403, a valid token 200 (and is not forwarded); removing them opens the gateway again."""
    from tests.unit.jwt_keys import claims, rsa_signer

    ip = address(lab)
    url = f"http://{ip}:8080/jwt"
    issuer = "https://issuer.example"
    signer = rsa_signer()
    authn = {
        "apiVersion": "security.istio.io/v1",
        "kind": "RequestAuthentication",
        "metadata": {"name": "jwt"},
        "spec": {
            "targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "edge"}],
            "jwtRules": [{"issuer": issuer, "jwks": signer.jwks()}],
        },
    }
    authz = {
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": "need-jwt"},
        "spec": {
            "selector": {"matchLabels": {"gateway.networking.k8s.io/gateway-name": "edge"}},
            "rules": [{"from": [{"source": {"requestPrincipals": [f"{issuer}/alice"]}}]}],
        },
    }
    lab.apply(authn, authz, namespace=EDGE)

    def status(*headers: str) -> str:
        return curl("-o", "/dev/null", "-w", "%{http_code}", "-H", "Host: a.example", *headers, url).stdout

    garbage = ("-H", "Authorization: Bearer garbage")
    wait_until("no token is 403 and a garbage one 401", lambda: status() == "403" and status(*garbage) == "401", 60, 1)
    now = time.time()
    for token in (signer.sign(claims(issuer, now=now - 7200)), rsa_signer().sign(claims(issuer, now=now))):
        assert status("-H", f"Authorization: Bearer {token}") == "401"
    good = signer.sign(claims(issuer, now=now))
    answer = through_gateway("-H", "Host: a.example", "-H", f"Authorization: Bearer {good}", url)
    assert answer is not None and answer["path"] == "/jwt"
    assert "authorization" not in echoed_headers(answer)
    assert status("-H", f"Authorization: Bearer {signer.sign(claims(issuer, 'mallory', now=now))}") == "403"
    lab.kubectl("delete", "authorizationpolicy", "need-jwt", "-n", EDGE)
    lab.kubectl("delete", "requestauthentication", "jwt", "-n", EDGE)
    wait_until("the gateway is open again", lambda: status() == "200", 60, 1)


HTTPS_ECHO = ["python3", "-m", "ambit.lab.apps", "https-echo"]


def secure_backend() -> tuple[dict[str, Any], dict[str, Any]]:
    """The Deployment and Service ``secure`` in ``in-app``: an HTTPS echo that terminates TLS itself as
    ``secure.example`` (the passthrough listeners' backend)."""
    secure = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "secure"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "secure"}},
            "template": {
                "metadata": {"labels": {"app": "secure"}},
                "spec": {
                    "terminationGracePeriodSeconds": 2,
                    "containers": [
                        {
                            "name": "secure",
                            "image": "none",
                            "command": [*HTTPS_ECHO, "--port", "8443", "--hostname", "secure.example"],
                            "readinessProbe": {"tcpSocket": {"port": 8443}, "periodSeconds": 1},
                        }
                    ],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "secure"},
        "spec": {"selector": {"app": "secure"}, "ports": [{"name": "tls", "port": 443, "targetPort": 8443}]},
    }
    return secure, service


def test_tls_passthrough_reaches_the_backend_that_terminates_it(lab: Lab) -> None:
    """A TLSRoute for ``secure.example`` on the passthrough listener: curl's TLS session is with the backend pod
    (its own certificate), relayed over HBONE by the gateway; another server name gets no connection."""
    ip = address(lab)
    secure, service = secure_backend()
    route = {
        "apiVersion": "gateway.networking.k8s.io/v1alpha2",
        "kind": "TLSRoute",
        "metadata": {"name": "secure"},
        "spec": {
            "parentRefs": [{"name": "edge", "namespace": EDGE, "sectionName": "tls"}],
            "hostnames": ["secure.example"],
            "rules": [{"backendRefs": [{"name": "secure", "port": 443}]}],
        },
    }
    lab.apply(secure, service, route, namespace=APP)
    lab.wait_pods_ready(APP, "app=secure", 1, timeout=120)
    resolve = ("-k", "--resolve", f"secure.example:9443:{ip}")
    answer = wait_until(
        "curl on the host reaches secure through the passthrough listener",
        lambda: through_gateway(*resolve, "https://secure.example:9443/passthrough"),
        timeout=120,
        interval=1,
    )
    assert answer["path"] == "/passthrough" and answer["pod"].startswith("secure-")
    verbose = curl("-v", "-o", "/dev/null", *resolve, "https://secure.example:9443/")
    assert "subject: CN=secure.example" in verbose.stderr  # the backend's own certificate: not terminated
    other = curl("-k", "--resolve", f"other.example:9443:{ip}", "https://other.example:9443/")
    assert other.returncode != 0  # no TLSRoute for that name: closed

    def judged() -> bool:
        obj = lab.get("tlsroute", "secure", "-n", APP)
        parents = (obj.get("status") or {}).get("parents") or []
        accepted = any(
            c.get("type") == "Accepted" and c.get("status") == "True" for p in parents for c in p.get("conditions", ())
        )
        listeners = {item["name"]: item for item in lab.get("gateway", "edge", "-n", EDGE)["status"]["listeners"]}
        tls = listeners.get("tls", {})
        kinds = [k.get("kind") for k in tls.get("supportedKinds", [])]
        return accepted and tls.get("attachedRoutes") == 1 and kinds == ["TLSRoute"]

    wait_until("the TLSRoute is Accepted and attached to the tls listener", judged, 60, 1)


def listener_condition(listener: dict[str, Any], kind: str) -> str:
    return next((str(c.get("status")) for c in listener.get("conditions") or () if c.get("type") == kind), "")


def test_tls_terminate_and_passthrough_listeners_share_a_port(lab: Lab, certs: Certificates) -> None:
    """A second Gateway, ``edge-tls``, with a TLS ``Terminate`` listener for ``term.example`` (its certificate a
    Secret of ``in-app``, allowed by a ReferenceGrant there) and a TLS ``Passthrough`` listener on the same port
    9444: curl's session for ``term.example`` ends at the gateway (our CA's certificate) and its plain HTTP goes on
    by a TCPRoute to ``echo``; for ``secure.example`` it goes through to the backend pod (its own certificate)."""
    grant = {
        "apiVersion": "gateway.networking.k8s.io/v1beta1",
        "kind": "ReferenceGrant",
        "metadata": {"name": "edge-gateways"},
        "spec": {
            "from": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": EDGE}],
            "to": [{"group": "", "kind": "Secret", "name": "cert-term"}],
        },
    }

    def tls_listener(name: str, mode: str, **more: Any) -> dict[str, Any]:
        return {
            "name": name,
            "port": 9444,
            "protocol": "TLS",
            "tls": {"mode": mode, **more.pop("tls", {})},
            "allowedRoutes": {"namespaces": {"from": "All"}},
            **more,
        }

    gateway = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": "edge-tls"},
        "spec": {
            "gatewayClassName": "istio",
            "listeners": [
                tls_listener(
                    "terminate",
                    "Terminate",
                    hostname="term.example",
                    tls={"certificateRefs": [{"name": "cert-term", "namespace": APP}]},
                ),
                tls_listener("passthrough", "Passthrough"),
            ],
        },
    }

    def route(kind: str, name: str, section: str, backend: str, port: int, **spec: Any) -> dict[str, Any]:
        return {
            "apiVersion": "gateway.networking.k8s.io/v1alpha2",
            "kind": kind,
            "metadata": {"name": name},
            "spec": {
                "parentRefs": [{"name": "edge-tls", "namespace": EDGE, "sectionName": section}],
                "rules": [{"backendRefs": [{"name": backend, "port": port}]}],
                **spec,
            },
        }

    secure, service = secure_backend()
    lab.apply(
        secure,
        service,
        tls_secret("cert-term", certs.issue("term.example")),
        grant,
        route("TCPRoute", "term", "terminate", "echo", 80),
        route("TLSRoute", "secure-shared", "passthrough", "secure", 443, hostnames=["secure.example"]),
        namespace=APP,
    )
    lab.apply(gateway, namespace=EDGE)
    lab.wait_pods_ready(APP, "app=secure", 1, timeout=120)
    ip = address(lab, "edge-tls")
    terminated = ("--cacert", str(certs.ca_file), "--resolve", f"term.example:9444:{ip}")
    answer = wait_until(
        "curl on the host reaches echo through the terminating listener",
        lambda: through_gateway(*terminated, "https://term.example:9444/terminated"),
        timeout=180,
        interval=1,
    )
    assert answer["path"] == "/terminated" and answer["pod"].startswith("echo-")
    passed = ("-k", "--resolve", f"secure.example:9444:{ip}")
    answer = wait_until(
        "curl on the host reaches secure through the passthrough listener on the same port",
        lambda: through_gateway(*passed, "https://secure.example:9444/passthrough"),
        timeout=60,
        interval=1,
    )
    assert answer["path"] == "/passthrough" and answer["pod"].startswith("secure-")
    verbose = curl("-v", "-o", "/dev/null", *passed, "https://secure.example:9444/")
    assert "subject: CN=secure.example" in verbose.stderr  # the backend's certificate: passed through
    verbose = curl("-v", "-o", "/dev/null", *terminated, "https://term.example:9444/")
    assert "subject: CN=term.example" in verbose.stderr  # the gateway's: terminated there
    assert curl("-k", "--resolve", f"other.example:9444:{ip}", "https://other.example:9444/").returncode != 0

    def listeners() -> dict[str, Any] | None:
        status = lab.get("gateway", "edge-tls", "-n", EDGE).get("status") or {}
        found = {item["name"]: item for item in status.get("listeners") or ()}
        ok = all(
            listener_condition(item, "Programmed") == "True"
            and listener_condition(item, "Conflicted") == "False"
            and item.get("attachedRoutes") == 1
            for item in found.values()
        )
        return found if ok and len(found) == 2 else None

    found = wait_until("both TLS listeners are Programmed, unconflicted, with their route", listeners, 60, 1)
    assert [k["kind"] for k in found["terminate"]["supportedKinds"]] == ["TLSRoute", "TCPRoute"]
    assert [k["kind"] for k in found["passthrough"]["supportedKinds"]] == ["TLSRoute"]


CLASSIC_GATEWAY = Path(__file__).resolve().parents[2] / "deploy" / "overlays" / "lab-ingressgateway"
CLASSIC_ID = "spiffe://cluster.local/ns/istio-system/sa/istio-ingressgateway-service-account"


def test_istio_gateway_and_virtual_service_route_through_istio_ingressgateway(lab: Lab) -> None:
    """Istio's TestIngress on the classic gateway (deploy/overlays/lab-ingressgateway): an Istio Gateway selecting
    ``istio: ingressgateway`` and a VirtualService bound to it route ``curl`` on the host to the mesh Service; then
    one TestAuthorizationGateway case, a policy on the gateway pods denying a path there (403), the rest allowed."""
    from tests.upstream_objects import authorization_gateway_route, ingress_gateway, ingress_route

    # An earlier test labelled echo istio.io/ingress-use-waypoint: istio-ingressgateway honours it too (as any Istio
    # ingress gateway does), and then the backend sees the waypoint's identity. TestIngress runs without it.
    labelled = lab.get("service", "echo", "-n", APP)["metadata"].get("labels", {}).get(INGRESS_USE_WAYPOINT)
    if labelled is not None:
        lab.kubectl("label", "service", "echo", "-n", APP, f"{INGRESS_USE_WAYPOINT}-")
    lab.kubectl("apply", "-k", str(CLASSIC_GATEWAY))
    try:
        before = classic_peer_connections(lab)
        lab.apply(ingress_gateway(), ingress_route("echo"), namespace=APP)
        lab.wait_pods_ready("istio-system", "istio=ingressgateway", 1, timeout=180)
        ip = wait_until("istio-ingressgateway has its load-balancer address", lambda: lb_address(lab), 60, 1)
        answer = wait_until(
            "curl on the host reaches echo through istio-ingressgateway",
            lambda: through_gateway(f"http://{ip}:80/hello"),
            timeout=120,
            interval=1,
        )
        assert answer["path"] == "/hello" and answer["pod"].startswith("echo-")
        assert wait_until(
            "the backend's node proxy saw the gateway's identity",
            lambda: classic_peer_connections(lab) > before or None,
            30,
        )

        policy = {
            "apiVersion": "security.istio.io/v1",
            "kind": "AuthorizationPolicy",
            "metadata": {"name": "ingress-deny-path"},
            "spec": {
                "selector": {"matchLabels": {"istio": "ingressgateway"}},
                "action": "DENY",
                "rules": [{"to": [{"operation": {"paths": ["/deny"]}}]}],
            },
        }
        lab.apply(authorization_gateway_route("echo", 80, 80), namespace=APP)
        lab.apply(policy, namespace="istio-system")

        def code(path: str) -> str:
            return curl("-o", "/dev/null", "-w", "%{http_code}", f"http://{ip}:80{path}").stdout

        wait_until("/deny is denied at the gateway", lambda: code("/deny") == "403", 60, 1)
        assert code("/allowed") == "200"
        assert code("/hello") == "404"  # the new route has only /allowed and /deny
    finally:
        lab.kubectl("delete", "authorizationpolicy", "ingress-deny-path", "-n", "istio-system", "--ignore-not-found")
        lab.kubectl("delete", "-k", str(CLASSIC_GATEWAY), "--ignore-not-found", "--wait=true")
        if labelled is not None:
            lab.kubectl("label", "service", "echo", "-n", APP, f"{INGRESS_USE_WAYPOINT}={labelled}")


def lb_address(lab: Lab) -> str | None:
    service = lab.get("service", "istio-ingressgateway", "-n", "istio-system")
    ingress = ((service.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
    return str(ingress[0]["ip"]) if ingress and ingress[0].get("ip") else None


def classic_peer_connections(lab: Lab) -> int:
    """Connections the node proxies accepted from istio-ingressgateway's identity (reporter="destination")."""
    total = 0
    for node in ("node-1", "node-2"):
        for line in lab.node_proxy_metrics(node).splitlines():
            if (
                line.startswith("istio_tcp_connections_opened_total{")
                and 'reporter="destination"' in line
                and f'source_principal="{CLASSIC_ID}"' in line
            ):
                total += int(float(line.rsplit(" ", 1)[1]))
    return total


def test_istio_gateway_https_simple_serves_the_credential_from_istio_system(lab: Lab, certs: Certificates) -> None:
    """An Istio Gateway HTTPS server (``tls.mode: SIMPLE``, ``credentialName`` a Secret in istio-system, where the
    gateway runs) on istio-ingressgateway's port 443: ``curl`` verifies the certificate and reaches echo."""
    from tests.upstream_objects import ingress_gateway, ingress_route

    lab.kubectl("apply", "-k", str(CLASSIC_GATEWAY))
    secret = tls_secret("secure-example", certs.issue("secure.example"))
    try:
        lab.apply(secret, namespace="istio-system")
        gateway = ingress_gateway()
        gateway["metadata"]["name"] = "secure"
        gateway["spec"]["servers"] = [
            {
                "port": {"number": 443, "name": "https", "protocol": "HTTPS"},
                "hosts": ["secure.example"],
                "tls": {"mode": "SIMPLE", "credentialName": "secure-example"},
            }
        ]
        route = ingress_route("echo")
        route["metadata"]["name"] = "secure"
        route["spec"]["gateways"] = ["secure"]
        route["spec"]["hosts"] = ["secure.example"]
        lab.apply(gateway, route, namespace=APP)
        lab.wait_pods_ready("istio-system", "istio=ingressgateway", 1, timeout=180)
        ip = wait_until("istio-ingressgateway has its load-balancer address", lambda: lb_address(lab), 60, 1)
        url = "https://secure.example/tls"
        args = ("--cacert", str(certs.ca_file), "--resolve", f"secure.example:443:{ip}", url)
        answer = wait_until("curl verifies the gateway and reaches echo", lambda: through_gateway(*args), 120, 1)
        assert answer["path"] == "/tls" and answer["pod"].startswith("echo-")
    finally:
        lab.kubectl("delete", "secret", "secure-example", "-n", "istio-system", "--ignore-not-found")
        lab.kubectl("delete", "-k", str(CLASSIC_GATEWAY), "--ignore-not-found", "--wait=true")


def test_upstream_ingress_tls_the_gateway_originates_tls_by_destination_rule(lab: Lab) -> None:
    """Istio's TestIngressTLS on the classic gateway: an Istio Gateway on port 80, a VirtualService to ``captured``'s
    ``https`` port (a backend that serves only TLS), and a DestinationRule ``tls.mode: SIMPLE, insecureSkipVerify``:
    istio-ingressgateway originates TLS to the backend inside HBONE, and five plain HTTP calls get 200."""
    from tests.upstream_objects import ingress_tls_objects

    captured = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "captured"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "captured"}},
            "template": {
                "metadata": {"labels": {"app": "captured"}},
                "spec": {
                    "terminationGracePeriodSeconds": 2,
                    "containers": [
                        {
                            "name": "captured",
                            "image": "none",
                            "command": [
                                *HTTPS_ECHO,
                                "--port",
                                "8443",
                                "--hostname",
                                f"captured.{APP}.svc.cluster.local",
                            ],
                            "readinessProbe": {"tcpSocket": {"port": 8443}, "periodSeconds": 1},
                        }
                    ],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "captured"},
        "spec": {"selector": {"app": "captured"}, "ports": [{"name": "https", "port": 443, "targetPort": 8443}]},
    }
    lab.kubectl("apply", "-k", str(CLASSIC_GATEWAY))
    try:
        lab.apply(captured, service, *ingress_tls_objects("captured", 443), namespace=APP)
        lab.wait_pods_ready(APP, "app=captured", 1, timeout=120)
        lab.wait_pods_ready("istio-system", "istio=ingressgateway", 1, timeout=180)
        ip = wait_until("istio-ingressgateway has its load-balancer address", lambda: lb_address(lab), 60, 1)
        url = f"http://{ip}:80/ingress-tls"
        wait_until("the gateway reaches captured's https port", lambda: through_gateway(url), 120, 1)
        answers = [through_gateway(url) for _ in range(5)]
        assert all(a is not None and a["pod"].startswith("captured-") for a in answers), answers
        assert all(a is not None and a["path"] == "/ingress-tls" for a in answers)
    finally:
        lab.kubectl("delete", "destinationrule", "captured", "-n", APP, "--ignore-not-found")
        lab.kubectl("delete", "virtualservice", "route", "-n", APP, "--ignore-not-found")
        lab.kubectl("delete", "gateway.networking.istio.io", "gateway", "-n", APP, "--ignore-not-found")
        lab.kubectl("delete", "deployment,service", "captured", "-n", APP, "--ignore-not-found")
        lab.kubectl("delete", "-k", str(CLASSIC_GATEWAY), "--ignore-not-found", "--wait=true")


def test_istio_gateway_mutual_tls_and_https_redirect(lab: Lab, certs: Certificates) -> None:
    """An Istio Gateway HTTPS server with ``tls.mode: MUTUAL`` (a ``kubernetes.io/tls`` credential in istio-system and
    its client CA in the generic Secret ``<credentialName>-cacert``, as Istio's documentation creates them;
    ``subjectAltNames: [client.example]``) and an HTTP server
    with ``httpsRedirect`` on istio-ingressgateway: ``curl --cert`` with a client certificate of that CA reaches
    echo; no certificate, one from another CA, or one naming another SAN is refused; plain HTTP is answered 301
    with the https URL."""
    from tests.ingress_pki import client_cert, opaque_secret
    from tests.upstream_objects import ingress_gateway, ingress_route

    client_ca = new_ca("e2e partner client CA", now=time.time())
    server = certs.issue("partner.example")
    secret = opaque_secret(
        "partner", "istio-system", "kubernetes.io/tls", tls_crt=server.cert_pem, tls_key=server.key_pem
    )
    ca_secret = opaque_secret("partner-cacert", "istio-system", ca_crt=client_ca.cert_pem)
    for item in (secret, ca_secret):
        item.update({"apiVersion": "v1", "kind": "Secret"})

    def pem_files(name: str, pair: KeyPair) -> tuple[str, str]:
        cert, key = certs.directory / f"{name}.crt", certs.directory / f"{name}.key"
        cert.write_bytes(pair.cert_pem)
        key.write_bytes(pair.key_pem)
        return str(cert), str(key)

    good = pem_files("partner-good", client_cert(client_ca, dns=("client.example",)))
    foreign = pem_files("partner-foreign", client_cert(new_ca("elsewhere", now=time.time()), dns=("client.example",)))
    misnamed = pem_files("partner-misnamed", client_cert(client_ca, dns=("intruder.example",)))
    gateway = ingress_gateway()
    gateway["metadata"]["name"] = "partner"
    gateway["spec"]["servers"] = [
        {
            "port": {"number": 443, "name": "https", "protocol": "HTTPS"},
            "hosts": ["partner.example"],
            "tls": {"mode": "MUTUAL", "credentialName": "partner", "subjectAltNames": ["client.example"]},
        },
        {
            "port": {"number": 80, "name": "http", "protocol": "HTTP"},
            "hosts": ["partner.example"],
            "tls": {"httpsRedirect": True},
        },
    ]
    route = ingress_route("echo")
    route["metadata"]["name"] = "partner"
    route["spec"]["gateways"] = ["partner"]
    route["spec"]["hosts"] = ["partner.example"]
    lab.kubectl("apply", "-k", str(CLASSIC_GATEWAY))
    try:
        lab.apply(secret, ca_secret, namespace="istio-system")
        lab.apply(gateway, route, namespace=APP)
        lab.wait_pods_ready("istio-system", "istio=ingressgateway", 1, timeout=180)
        ip = wait_until("istio-ingressgateway has its load-balancer address", lambda: lb_address(lab), 60, 1)
        https = ("--cacert", str(certs.ca_file), "--resolve", f"partner.example:443:{ip}")
        url = "https://partner.example/mtls"
        try:
            answer = wait_until(
                "curl with a partner client certificate reaches echo",
                lambda: through_gateway(*https, "--cert", good[0], "--key", good[1], url),
                120,
                1,
            )
        except BaseException:
            print("events:", [e.get("message") or e.get("note") for e in lab.events(APP, "partner")])
            print("curl:", curl("-v", *https, "--cert", good[0], "--key", good[1], url).stderr)
            raise
        assert answer["path"] == "/mtls" and answer["pod"].startswith("echo-")
        for name, extra in {
            "no client certificate": (),
            "a certificate of another CA": ("--cert", foreign[0], "--key", foreign[1]),
            "a certificate naming another SAN": ("--cert", misnamed[0], "--key", misnamed[1]),
        }.items():
            done = curl(*https, *extra, "-o", "/dev/null", "-w", "%{http_code}", url)
            assert done.returncode != 0 and done.stdout in ("", "000"), (name, done.stdout, done.stderr)
        redirect = curl(
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %{redirect_url}",
            "-H",
            "Host: partner.example",
            f"http://{ip}:80/a?b=c",
        )
        assert redirect.stdout == "301 https://partner.example/a?b=c", redirect
    finally:
        lab.kubectl("delete", "gateway.networking.istio.io", "partner", "-n", APP, "--ignore-not-found")
        lab.kubectl("delete", "virtualservice", "partner", "-n", APP, "--ignore-not-found")
        lab.kubectl("delete", "secret", "partner", "partner-cacert", "-n", "istio-system", "--ignore-not-found")
        lab.kubectl("delete", "-k", str(CLASSIC_GATEWAY), "--ignore-not-found", "--wait=true")


SANDWICH = "in-sandwich"
SANDWICH_HOSTS = (
    "captured",
    f"captured.{SANDWICH}",
    f"captured.{SANDWICH}.svc",
    f"captured.{SANDWICH}.svc.cluster.local",
)
"""The upstream test's ``HostnameVariants()`` of Service ``captured``."""
SANDWICH_CALLS = """
import json, sys, urllib.request
out = []
for host in sys.argv[1:]:
    for _ in range(3):
        try:
            with urllib.request.urlopen(f"http://{host}/sandwich", timeout=5) as r:
                answer = json.loads(r.read())
                out.append([host, r.status, r.headers.get("traversed-waypoint", ""), answer.get("pod", "")])
        except Exception as exc:
            out.append([host, getattr(exc, "code", 0), type(exc).__name__, ""])
print(json.dumps(out))
"""


def sandwich_objects() -> tuple[dict[str, Any], ...]:
    """TestSimpleHTTPSandwich's ProxyConfig, Gateway (class ``istio``, captured pods, a ClusterIP Service, one
    listener per hostname variant and the fake 15008 TCP listener) and HTTPRoute, for Service ``captured``."""
    same = {"namespaces": {"from": "Same"}}
    names = ("short", "namespace", "svc", "fqdn")
    proxy_config = {
        "apiVersion": "networking.istio.io/v1beta1",
        "kind": "ProxyConfig",
        "metadata": {"name": "disable-hbone"},
        "spec": {
            "selector": {"matchLabels": {"gateway.networking.k8s.io/gateway-name": "simple-http-waypoint"}},
            "environmentVariables": {"ISTIO_META_DISABLE_HBONE_SEND": "true"},
        },
    }
    gateway = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {
            "name": "simple-http-waypoint",
            "labels": {"istio.io/dataplane-mode": "ambient"},
            "annotations": {"networking.istio.io/service-type": "ClusterIP"},
        },
        "spec": {
            "gatewayClassName": "istio",
            "listeners": [
                *(
                    {"name": f"captured-{n}", "hostname": h, "port": 80, "protocol": "HTTP", "allowedRoutes": same}
                    for n, h in zip(names, SANDWICH_HOSTS, strict=True)
                ),
                {"name": "fake-hbone-port", "port": 15008, "protocol": "TCP"},
            ],
        },
    }
    route = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "captured-httproute"},
        "spec": {
            "parentRefs": [{"name": "simple-http-waypoint"}],
            "hostnames": list(SANDWICH_HOSTS),
            "rules": [
                {
                    "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                    "filters": [
                        {
                            "type": "ResponseHeaderModifier",
                            "responseHeaderModifier": {
                                "add": [{"name": "traversed-waypoint", "value": "captured-gateway"}]
                            },
                        }
                    ],
                    "backendRefs": [{"name": "captured", "port": 80}],
                }
            ],
        },
    }
    return proxy_config, gateway, route


def test_simple_http_sandwich_an_istio_class_gateway_serves_as_the_waypoint(lab: Lab) -> None:
    """Istio's TestSimpleHTTPSandwich: Service ``captured`` labelled ``istio.io/use-waypoint`` with a Gateway of class
    ``istio`` whose pods the node proxy captures; every hostname variant from a captured client gets the route's
    response header, and the Service's answer comes from its own pod."""
    lab.namespace(SANDWICH)
    lab.kubectl("label", "namespace", SANDWICH, "istio.io/dataplane-mode=ambient")
    captured = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "captured"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "captured"}},
            "template": {
                "metadata": {"labels": {"app": "captured"}},
                "spec": {"terminationGracePeriodSeconds": 2, "containers": [http_echo_container(8080)]},
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "captured"},
        "spec": {"selector": {"app": "captured"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
    }
    client = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "client", "labels": {"app": "client"}},
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "containers": [{"name": "main", "image": "none", "command": ["sleep", "3600"]}],
        },
    }
    lab.apply(captured, service, client, *sandwich_objects(), namespace=SANDWICH)
    lab.wait_pods_ready(SANDWICH, "app=captured", 1, timeout=120)
    lab.wait_pods_ready(SANDWICH, "app=client", 1, timeout=120)
    (gateway_pod,) = lab.wait_pods_ready(
        SANDWICH, "gateway.networking.k8s.io/gateway-name=simple-http-waypoint", 1, timeout=180
    )
    assert gateway_pod["metadata"]["labels"]["istio.io/dataplane-mode"] == "ambient"
    generated = lab.get("service", "simple-http-waypoint-istio", "-n", SANDWICH)
    assert generated["spec"]["type"] == "ClusterIP"

    def addressed() -> list[dict[str, Any]] | None:
        gateway = lab.get("gateway", "simple-http-waypoint", "-n", SANDWICH)
        return (gateway.get("status") or {}).get("addresses") or None

    addresses = wait_until("the sandwich Gateway has an address", addressed, timeout=120, interval=1)
    assert addresses == [{"type": "Hostname", "value": f"simple-http-waypoint-istio.{SANDWICH}.svc.cluster.local"}]
    wait_until(
        "the gateway pod is captured",
        lambda: (
            lab.pod(gateway_pod["metadata"]["name"], SANDWICH)["metadata"]
            .get("annotations", {})
            .get("ambient.istio.io/redirection")
            == "enabled"
        ),
        timeout=60,
        interval=1,
    )
    lab.kubectl("label", "service", "captured", "-n", SANDWICH, "istio.io/use-waypoint=simple-http-waypoint")

    def calls() -> list[list[Any]] | None:
        out: list[list[Any]] = json.loads(
            lab.exec("client", SANDWICH, "python3", "-c", SANDWICH_CALLS, *SANDWICH_HOSTS, timeout=120)
        )
        return out if all(status == 200 and header == "captured-gateway" for _, status, header, _ in out) else None

    try:
        answers = wait_until("every hostname variant traverses the gateway", calls, timeout=90, interval=1)
    except BaseException:
        print("last calls:", lab.exec("client", SANDWICH, "python3", "-c", SANDWICH_CALLS, *SANDWICH_HOSTS))
        logs = sorted((lab.directory / "pods" / gateway_pod["metadata"]["uid"]).glob("*.log"))
        print("gateway log:", "".join(log.read_text(errors="replace") for log in logs)[-6000:])
        for node in ("node-1", "node-2"):
            lines = [line for line in lab.component_log("nodeproxy", node).splitlines() if SANDWICH in line]
            print(f"{node} node proxy, {SANDWICH} lines:", "\n".join(lines[-40:]))
        raise
    assert answers is not None
    assert {host for host, *_ in answers} == set(SANDWICH_HOSTS)
    assert all(pod.startswith("captured-") for *_, pod in answers)
    service_status = lab.get("service", "captured", "-n", SANDWICH)
    bound = condition(service_status, "istio.io/WaypointBound")
    assert bound.get("status") == "True", bound
    assert bound.get("message") == f"Successfully attached to waypoint {SANDWICH}/simple-http-waypoint"


def test_sandwich_with_a_proxy_inbound_binding_authorizes_by_the_client_principal(lab: Lab) -> None:
    """The sandwich above, annotated ``ambient.istio.io/waypoint-inbound-binding: PROXY/15088``: the gateway pod's
    node proxy delivers each tunnel to the gateway's loopback port 15088 after a PROXY header with the client's
    SPIFFE id, so an AuthorizationPolicy on the Gateway that allows that principal lets the client in. Without the
    binding the gateway does not know the client (403); allowing another principal refuses it again (403)."""
    client_principal = f"cluster.local/ns/{SANDWICH}/sa/default"

    def policy(principal: str) -> dict[str, Any]:
        return {
            "apiVersion": "security.istio.io/v1",
            "kind": "AuthorizationPolicy",
            "metadata": {"name": "only-the-client"},
            "spec": {
                "targetRefs": [
                    {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "simple-http-waypoint"}
                ],
                "action": "ALLOW",
                "rules": [{"from": [{"source": {"principals": [principal]}}]}],
            },
        }

    def statuses() -> set[int]:
        out: list[list[Any]] = json.loads(
            lab.exec("client", SANDWICH, "python3", "-c", SANDWICH_CALLS, "captured", timeout=60)
        )
        return {status for _, status, *_ in out}

    lab.apply(policy(client_principal), namespace=SANDWICH)
    try:
        wait_until("without the binding the gateway cannot tell the client (403)", lambda: statuses() == {403}, 60, 1)
        lab.kubectl(
            "annotate",
            "gateway",
            "simple-http-waypoint",
            "-n",
            SANDWICH,
            "ambient.istio.io/waypoint-inbound-binding=PROXY/15088",
        )
        try:
            wait_until(
                "the client's principal is allowed through the PROXY binding", lambda: statuses() == {200}, 90, 1
            )
        except BaseException:
            print("last statuses:", statuses())
            for node in ("node-1", "node-2"):
                lines = [line for line in lab.component_log("nodeproxy", node).splitlines() if SANDWICH in line]
                print(f"{node} node proxy, {SANDWICH} lines:", "\n".join(lines[-40:]))
            raise
        gateway = lab.get("gateway", "simple-http-waypoint", "-n", SANDWICH)
        assert gateway["metadata"]["annotations"]["ambient.istio.io/waypoint-inbound-binding"] == "PROXY/15088"
        lab.apply(policy(f"cluster.local/ns/{SANDWICH}/sa/someone-else"), namespace=SANDWICH)
        wait_until("another principal's policy refuses the client", lambda: statuses() == {403}, 60, 1)
    finally:
        lab.kubectl("delete", "authorizationpolicy", "only-the-client", "-n", SANDWICH, "--ignore-not-found")
        lab.kubectl(
            "annotate", "gateway", "simple-http-waypoint", "-n", SANDWICH, "ambient.istio.io/waypoint-inbound-binding-"
        )


def test_upstream_jwt_claim_route_and_trusted_forwarded_proto_through_istio_ingressgateway(lab: Lab) -> None:
    """Upstream pilot/common ``jwt-claim-route`` on istio-ingressgateway: a RequestAuthentication in istio-system
    (no selector: every workload, the gateway's pods too) with ``outputClaimToHeaders``, an Istio Gateway for every
    host and a VirtualService for ``echo.foo.bar`` routing only requests whose verified token has the claim
    ``nested.key1 == valueA`` (``@request.auth.claims.nested.key1``, then the bracket form): 200 with such a token,
    404 with another, without one or with a header of the claim's name, 401 with an expired one. Then "https with
    x-forwarded-proto": the HTTP server with ``httpsRedirect`` and an EnvoyFilter merging
    ``xff_num_trusted_hops: 1`` into the gateway's connection manager: ``X-Forwarded-Proto: https`` is routed,
    a request without it redirected."""
    from tests.unit.jwt_keys import claims, rsa_signer
    from tests.upstream_objects import ingress_gateway

    issuer = "test-issuer-1@istio.io"
    signer = rsa_signer()
    authn = {
        "apiVersion": "security.istio.io/v1",
        "kind": "RequestAuthentication",
        "metadata": {"name": "default", "namespace": "istio-system"},
        "spec": {
            "jwtRules": [
                {
                    "issuer": issuer,
                    "jwks": signer.jwks(),
                    "outputClaimToHeaders": [{"header": "x-jwt-nested-key", "claim": "nested.nested-2.key2"}],
                }
            ]
        },
    }

    def route(claim_header: str) -> dict[str, Any]:
        match = {"uri": {"prefix": "/"}, "headers": {claim_header: {"exact": "valueA"}}}
        return {
            "apiVersion": "networking.istio.io/v1",
            "kind": "VirtualService",
            "metadata": {"name": "default", "namespace": APP},
            "spec": {
                "hosts": ["echo.foo.bar"],
                "gateways": ["gateway"],
                "http": [{"match": [match], "route": [{"destination": {"host": "echo"}}]}],
            },
        }

    hops = {
        "apiVersion": "networking.istio.io/v1alpha3",
        "kind": "EnvoyFilter",
        "metadata": {"name": "ingressgateway-redirect-config", "namespace": "istio-system"},
        "spec": {
            "configPatches": [
                {
                    "applyTo": "NETWORK_FILTER",
                    "match": {
                        "context": "GATEWAY",
                        "listener": {
                            "filterChain": {"filter": {"name": "envoy.filters.network.http_connection_manager"}}
                        },
                    },
                    "patch": {
                        "operation": "MERGE",
                        "value": {
                            "typed_config": {
                                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager"
                                ".v3.HttpConnectionManager",
                                "xff_num_trusted_hops": 1,
                                "normalize_path": True,
                            }
                        },
                    },
                }
            ],
            "workloadSelector": {"labels": {"istio": "ingressgateway"}},
        },
    }
    labelled = lab.get("service", "echo", "-n", APP)["metadata"].get("labels", {}).get(INGRESS_USE_WAYPOINT)
    if labelled is not None:
        lab.kubectl("label", "service", "echo", "-n", APP, f"{INGRESS_USE_WAYPOINT}-")
    lab.kubectl("apply", "-k", str(CLASSIC_GATEWAY))
    try:
        lab.apply(ingress_gateway(), route("@request.auth.claims.nested.key1"), namespace=APP)
        lab.apply(authn)
        lab.wait_pods_ready("istio-system", "istio=ingressgateway", 1, timeout=180)
        ip = wait_until("istio-ingressgateway has its load-balancer address", lambda: lb_address(lab), 60, 1)
        now = time.time()
        nested = {"key1": "valueA", "nested-2": {"key2": "valueC"}}
        good = signer.sign(claims(issuer, "sub-1", now=now, nested=nested))
        other = signer.sign(claims(issuer, "sub-1", now=now, nested={"key1": "valueB"}))
        expired = signer.sign(claims(issuer, "sub-1", now=now - 7200, nested=nested))

        def code(*headers: str) -> str:
            return curl(
                "-o", "/dev/null", "-w", "%{http_code}", "-H", "Host: echo.foo.bar", *headers, f"http://{ip}:80/"
            ).stdout

        def bearer(token: str) -> tuple[str, str]:
            return ("-H", f"Authorization: Bearer {token}")

        wait_until("a token with the claim is routed", lambda: code(*bearer(good)) == "200", 120, 1)
        assert code(*bearer(other)) == "404"  # "unmatched token"
        assert code() == "404"  # "unmatched with no token"
        assert code("-H", "request.auth.claims.nested.key1: valueA") == "404"  # "… but same header"
        assert code(*bearer(expired)) == "401"  # "unmatched with invalid token"
        answer = through_gateway("-H", "Host: echo.foo.bar", *bearer(good), f"http://{ip}:80/claims")
        assert answer is not None and echoed_headers(answer).get("x-jwt-nested-key") == "valueC"

        lab.apply(route("@request.auth.claims[nested][key1]"), namespace=APP)  # "usage2"
        wait_until(
            "the bracket form routes too", lambda: code(*bearer(other)) == "404" and code(*bearer(good)) == "200", 60, 1
        )

        redirecting = ingress_gateway()
        redirecting["spec"]["servers"][0]["tls"] = {"httpsRedirect": True}
        everything = {
            "apiVersion": "networking.istio.io/v1",
            "kind": "VirtualService",
            "metadata": {"name": "default", "namespace": APP},
            "spec": {
                "hosts": ["echo.foo.bar"],
                "gateways": ["gateway"],
                "http": [{"route": [{"destination": {"host": "echo"}}]}],
            },
        }
        lab.apply(redirecting, everything, namespace=APP)
        wait_until("plain HTTP is redirected", lambda: code() == "301", 60, 1)
        assert code("-H", "X-Forwarded-Proto: https") == "301"  # not trusted yet
        lab.apply(hops)
        wait_until(
            "a trusted X-Forwarded-Proto: https is routed",
            lambda: code("-H", "X-Forwarded-Proto: https") == "200",
            60,
            1,
        )
        assert code() == "301"
    finally:
        lab.kubectl(
            "delete", "envoyfilter", "ingressgateway-redirect-config", "-n", "istio-system", "--ignore-not-found"
        )
        lab.kubectl("delete", "requestauthentication", "default", "-n", "istio-system", "--ignore-not-found")
        lab.kubectl("delete", "virtualservice", "default", "-n", APP, "--ignore-not-found")
        lab.kubectl("delete", "-k", str(CLASSIC_GATEWAY), "--ignore-not-found", "--wait=true")
        if labelled is not None:
            lab.kubectl("label", "service", "echo", "-n", APP, f"{INGRESS_USE_WAYPOINT}={labelled}")


def test_istio_gateway_passthrough_and_simple_servers_share_port_443_by_sni(lab: Lab, certs: Certificates) -> None:
    """An Istio Gateway on istio-ingressgateway with a ``PASSTHROUGH`` server for ``secure.example`` and a ``SIMPLE``
    server for ``web.example`` (its credential a Secret in istio-system) on the same port 443, as istiod builds them
    into SNI filter chains of one listener: ``curl`` on the host verifies the gateway's certificate for
    ``web.example`` and reaches echo by the VirtualService's HTTP route; for ``secure.example`` its TLS session is
    with the backend pod (the pod's own certificate), relayed by the VirtualService's ``tls`` route; a server name
    no server has gets no connection."""
    from tests.upstream_objects import ingress_gateway

    lab.kubectl("apply", "-k", str(CLASSIC_GATEWAY))
    secret = tls_secret("mixed-web", certs.issue("web.example"))
    secure, service = secure_backend()
    gateway = ingress_gateway(name="mixed")
    gateway["spec"]["servers"] = [
        {
            "port": {"number": 443, "name": "tls-secure", "protocol": "TLS"},
            "hosts": ["secure.example"],
            "tls": {"mode": "PASSTHROUGH"},
        },
        {
            "port": {"number": 443, "name": "https-web", "protocol": "HTTPS"},
            "hosts": ["web.example"],
            "tls": {"mode": "SIMPLE", "credentialName": "mixed-web"},
        },
    ]
    web = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": "mixed-web"},
        "spec": {
            "gateways": ["mixed"],
            "hosts": ["web.example"],
            "http": [{"route": [{"destination": {"host": "echo", "port": {"number": 80}}}]}],
        },
    }
    passthrough = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": "mixed-secure"},
        "spec": {
            "gateways": ["mixed"],
            "hosts": ["secure.example"],
            "tls": [
                {
                    "match": [{"port": 443, "sniHosts": ["secure.example"]}],
                    "route": [{"destination": {"host": "secure", "port": {"number": 443}}}],
                }
            ],
        },
    }
    try:
        lab.apply(secret, namespace="istio-system")
        lab.apply(secure, service, gateway, web, passthrough, namespace=APP)
        lab.wait_pods_ready(APP, "app=secure", 1, timeout=120)
        lab.wait_pods_ready("istio-system", "istio=ingressgateway", 1, timeout=180)
        ip = wait_until("istio-ingressgateway has its load-balancer address", lambda: lb_address(lab), 60, 1)
        terminated = ("--cacert", str(certs.ca_file), "--resolve", f"web.example:443:{ip}")
        answer = wait_until(
            "curl verifies the gateway's certificate for web.example and reaches echo",
            lambda: through_gateway(*terminated, "https://web.example/mixed"),
            120,
            1,
        )
        assert answer["path"] == "/mixed" and answer["pod"].startswith("echo-")
        relayed = ("-k", "--resolve", f"secure.example:443:{ip}")
        answer = wait_until(
            "curl reaches secure through the passthrough server",
            lambda: through_gateway(*relayed, "https://secure.example/passthrough"),
            120,
            1,
        )
        assert answer["path"] == "/passthrough" and answer["pod"].startswith("secure-")
        assert "subject: CN=secure.example" in curl("-v", "-o", "/dev/null", *relayed, "https://secure.example/").stderr
        assert "subject: CN=web.example" in curl("-v", "-o", "/dev/null", *terminated, "https://web.example/").stderr
        other = curl("-k", "--resolve", f"other.example:443:{ip}", "https://other.example/")
        assert other.returncode != 0  # no server for that name: closed, nothing relayed
    finally:
        lab.kubectl("delete", "virtualservice", "mixed-web", "mixed-secure", "-n", APP, "--ignore-not-found")
        lab.kubectl("delete", "gateway.networking.istio.io", "mixed", "-n", APP, "--ignore-not-found")
        lab.kubectl("delete", "secret", "mixed-web", "-n", "istio-system", "--ignore-not-found")
        lab.kubectl("delete", "-k", str(CLASSIC_GATEWAY), "--ignore-not-found", "--wait=true")


def backend_tls_policy(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "BackendTLSPolicy",
        "metadata": {"name": name},
        "spec": {
            "targetRefs": [{"group": "", "kind": "Service", "name": "secure", "sectionName": "tls"}],
            "validation": {
                "hostname": "secure.example",
                "caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": "secure-ca"}],
            },
        },
    }


def ancestors(lab: Lab, name: str) -> list[tuple[str, str, list[tuple[str, str, str]]]]:
    """(ancestor name, controller, [(type, status, reason)]) of each ancestor, as kubectl reads the policy."""
    obj = lab.get("backendtlspolicy", name, "-n", APP)
    return [
        (
            str(a["ancestorRef"]["name"]),
            str(a["controllerName"]),
            [(c["type"], c["status"], c["reason"]) for c in a.get("conditions") or ()],
        )
        for a in (obj.get("status") or {}).get("ancestors") or ()
    ]


def _ancestor(found: list[tuple[str, str, list[tuple[str, str, str]]]], name: str) -> list[tuple[str, str, str]]:
    """The conditions of the ancestor ``name``. Other ancestors may be listed too: earlier tests of this module leave
    routes from other Gateways (``edge-tls``) to ``secure``, and each such Gateway is an ancestor."""
    return next((conditions for ancestor, _, conditions in found if ancestor == name), [])


def _controllers(found: list[tuple[str, str, list[tuple[str, str, str]]]]) -> dict[str, str]:
    return {ancestor: controller for ancestor, controller, _ in found}


def _wait_ancestors(lab: Lab, policy: str, what: str, holds: Callable[[list[Any]], bool]) -> list[Any]:
    """Poll the policy's ancestors until ``holds``; on time-out, fail showing the last ones read."""
    deadline = time.monotonic() + 60
    while True:
        found = ancestors(lab, policy)
        if holds(found):
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"not within 60 s: {what} (last: {found!r})")
        time.sleep(1)


def test_backend_tls_policy_ancestors_as_kubectl_reads_them(lab: Lab, certs: Certificates) -> None:
    """A BackendTLSPolicy on the Service ``secure`` (port ``tls``), its CA a ConfigMap, with an HTTPRoute attached to
    the Gateway ``edge`` and sending to ``secure``: kubectl reads istiod's ancestors, the Service (mesh controller)
    then the Gateway (gateway controller), both Accepted with ResolvedRefs. A second, younger policy on the same
    target (a tenant trying to replace the TLS settings) is Conflicted and the first stays Accepted; a missing CA
    fails closed (NoValidCACertificate)."""
    secure, service = secure_backend()
    ca = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "secure-ca"},
        "data": {"ca.crt": certs.ca.cert_pem.decode()},
    }
    route = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "to-secure"},
        "spec": {
            "parentRefs": [{"name": "edge", "namespace": EDGE}],
            "hostnames": ["btls.example"],
            "rules": [{"backendRefs": [{"name": "secure", "port": 443}]}],
        },
    }
    valid = [("Accepted", "True", "Accepted"), ("ResolvedRefs", "True", "ResolvedRefs")]
    try:
        lab.apply(secure, service, ca, route, backend_tls_policy("secure-tls"), namespace=APP)

        def written(found: list[Any]) -> bool:
            return _ancestor(found, "secure") == valid and _ancestor(found, "edge") == valid

        found = _wait_ancestors(lab, "secure-tls", "the policy's ancestors are written", written)
        controllers = _controllers(found)
        assert (controllers["secure"], controllers["edge"]) == (
            "istio.io/mesh-controller",
            "istio.io/gateway-controller",
        )
        obj = lab.get("backendtlspolicy", "secure-tls", "-n", APP)
        refs = [a["ancestorRef"] for a in obj["status"]["ancestors"]]
        assert refs[0] == {"group": "", "kind": "Service", "name": "secure", "sectionName": "tls"}  # target refs first
        assert {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "edge"} in refs[1:]

        lab.apply(backend_tls_policy("zz-override"), namespace=APP)

        def conflicted() -> tuple[str, str, str] | None:
            mine = _ancestor(ancestors(lab, "zz-override"), "secure")
            return mine[0] if mine and mine[0][1] == "False" else None

        assert wait_until("the younger policy is Conflicted", conflicted, 60, 1) == ("Accepted", "False", "Conflicted")
        assert written(ancestors(lab, "secure-tls"))

        lab.kubectl("delete", "configmap", "secure-ca", "-n", APP)
        broken = [("Accepted", "False", "NoValidCACertificate"), ("ResolvedRefs", "False", "InvalidCACertificateRef")]
        _wait_ancestors(
            lab, "secure-tls", "a missing CA fails closed in the status", lambda f: _ancestor(f, "secure") == broken
        )
    finally:
        lab.kubectl("delete", "backendtlspolicy", "secure-tls", "zz-override", "-n", APP, "--ignore-not-found")
        lab.kubectl("delete", "httproute", "to-secure", "-n", APP, "--ignore-not-found")
        lab.kubectl("delete", "configmap", "secure-ca", "-n", APP, "--ignore-not-found")


def test_a_listener_set_adds_a_hostname_and_port_that_curl_reaches_through_a_route_attached_to_it(lab: Lab) -> None:
    """A ListenerSet in the Gateway's namespace (which ``allowedListeners`` admits) adds ``c.example`` on port 8090;
    an HTTPRoute of ``in-app`` names the ListenerSet and its listener, and curl on the host reaches echo there.
    The Gateway's own listeners and routes are not touched; everything added is removed at the end."""
    ip = address(lab)
    lab.kubectl("patch", "gateway", "edge", "-n", EDGE, "--type=merge", "-p", ALLOW_SAME)
    listener_set = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "ListenerSet",
        "metadata": {"name": "team-c"},
        "spec": {
            "parentRef": {"name": "edge", "kind": "Gateway", "group": "gateway.networking.k8s.io"},
            "listeners": [
                {
                    "name": "extra",
                    "port": 8090,
                    "protocol": "HTTP",
                    "hostname": "c.example",
                    "allowedRoutes": {"namespaces": {"from": "All"}},
                }
            ],
        },
    }
    route = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "echo-c"},
        "spec": {
            "parentRefs": [
                {
                    "name": "team-c",
                    "namespace": EDGE,
                    "kind": "ListenerSet",
                    "group": "gateway.networking.k8s.io",
                    "sectionName": "extra",
                }
            ],
            "rules": [{"backendRefs": [{"name": "echo", "port": 80}]}],
        },
    }
    try:
        lab.apply(listener_set, namespace=EDGE)
        lab.apply(route, namespace=APP)
        answer = wait_until(
            "curl on the host reaches echo through the ListenerSet's listener",
            lambda: through_gateway("-H", "Host: c.example", f"http://{ip}:8090/from-set"),
            timeout=120,
            interval=1,
        )
        assert answer["path"] == "/from-set" and answer["pod"].startswith("echo-")
        other = curl("-o", "/dev/null", "-w", "%{http_code}", "-H", "Host: a.example", f"http://{ip}:8090/")
        assert other.stdout == "404"  # the listener serves its own hostname, not the Gateway's routes

        def accepted() -> dict[str, Any] | None:
            found: dict[str, Any] = lab.get("listenerset", "team-c", "-n", EDGE)
            listeners = (found.get("status") or {}).get("listeners") or []
            ok = condition(found, "Accepted").get("status") == "True" and listeners
            return found if ok and listeners[0].get("attachedRoutes") == 1 else None

        found = wait_until("the ListenerSet is Accepted with its route attached", accepted, timeout=60, interval=1)
        assert condition(found, "Programmed")["status"] == "True"
        gateway = lab.get("gateway", "edge", "-n", EDGE)
        assert gateway["status"]["attachedListenerSets"] == 1
        assert condition(gateway, "ResolvedRefs")["status"] == "True"
        assert {item["name"] for item in gateway["status"]["listeners"]} == {"http", "https-a", "https-b", "tls"}
        assert lab.get("httproute", "echo-c", "-n", APP)["status"]["parents"][0]["parentRef"]["kind"] == "ListenerSet"
    finally:
        lab.kubectl("delete", "httproute", "echo-c", "-n", APP, "--ignore-not-found")
        lab.kubectl("delete", "listenerset", "team-c", "-n", EDGE, "--ignore-not-found")
        lab.kubectl("patch", "gateway", "edge", "-n", EDGE, "--type=json", "-p", DROP_ALLOWED)


ALLOW_SAME = json.dumps({"spec": {"allowedListeners": {"namespaces": {"from": "Same"}}}})
DROP_ALLOWED = json.dumps([{"op": "remove", "path": "/spec/allowedListeners"}])


def test_a_forged_x_forwarded_for_moves_remote_ip_blocks_only_behind_trusted_proxies(lab: Lab) -> None:
    """The attack: a client sends ``X-Forwarded-For`` naming a denied range. With Istio's default of no trusted
    proxies the gateway judges the connection's address (200), and tells the backend so; once the Gateway says one
    proxy stands in front of it (``proxy.istio.io/config`` ``gatewayTopology.numTrustedProxies: 1``), the last
    address of the header is the client's, and the DENY on ``remoteIpBlocks`` applies (403)."""
    ip = address(lab)
    url = f"http://{ip}:8080/xff"
    deny = {
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": "deny-forged-range"},
        "spec": {
            "selector": {"matchLabels": {"gateway.networking.k8s.io/gateway-name": "edge"}},
            "action": "DENY",
            "rules": [
                {"from": [{"source": {"remoteIpBlocks": ["198.19.77.0/24"]}}]},
                {"to": [{"operation": {"paths": ["/deny-probe"]}}]},
            ],
        },
    }
    forged = ("-H", "X-Forwarded-For: 198.19.77.5")

    def status(path: str = "/xff", *headers: str) -> str:
        target = f"http://{ip}:8080{path}"
        return curl("-o", "/dev/null", "-w", "%{http_code}", "-H", "Host: a.example", *headers, target).stdout

    trusting = json.dumps({"gatewayTopology": {"numTrustedProxies": 1}})
    try:
        lab.apply(deny, namespace=EDGE)
        wait_until("the DENY policy is in force at the gateway", lambda: status("/deny-probe") == "403", 60, 1)
        assert status("/xff", *forged) == "200"  # no trusted proxy: the forged header moves nothing
        headers = echoed_headers(through_gateway("-H", "Host: a.example", *forged, url))
        peer = headers["x-envoy-external-address"]
        assert peer != "198.19.77.5"
        assert headers["x-forwarded-for"] == f"198.19.77.5, {peer}"  # the gateway appends what it saw

        lab.kubectl("annotate", "gateway", "edge", "-n", EDGE, f"proxy.istio.io/config={trusting}", "--overwrite")
        wait_until("one trusted proxy: the forged range is denied", lambda: status("/xff", *forged) == "403", 120, 1)
        assert status("/xff") == "200"  # fewer addresses than trusted hops: the peer is the client
        vouched = echoed_headers(through_gateway("-H", "Host: a.example", "-H", "X-Forwarded-For: 198.19.1.1", url))
        assert vouched["x-envoy-external-address"] == "198.19.1.1"
    finally:
        lab.kubectl("annotate", "gateway", "edge", "-n", EDGE, "proxy.istio.io/config-", check=False)
        lab.kubectl("delete", "authorizationpolicy", "deny-forged-range", "-n", EDGE, "--ignore-not-found")
    wait_until("the gateway trusts no proxy again", lambda: status("/xff", *forged) == "200", 120, 1)


def test_a_mutual_tls_listener_forwards_the_verified_client_certificate_in_xfcc_never_a_forged_one(
    lab: Lab, certs: Certificates
) -> None:
    """Gateway API frontend client validation on a listener added to ``edge`` (port 9444, ``m.example``, a
    ``perPort`` validation with a ConfigMap CA): ``curl --cert`` with a client certificate of that CA and a forged
    ``X-Forwarded-Client-Cert`` reaches echo, which receives only the element the gateway wrote from the certificate
    it verified (Istio's gateway default ``SANITIZE_SET``: Hash, Cert, Subject, URI, DNS); without a certificate
    the handshake is refused. Everything added is removed at the end."""
    import hashlib
    import urllib.parse

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from tests.ingress_pki import client_cert

    client_ca = new_ca("e2e xfcc client CA", now=time.time())
    pair = client_cert(client_ca, "partner", dns=("partner.example",), uris=("spiffe://partner.example/ns/a/sa/b",))
    cert_file, key_file = certs.directory / "xfcc-client.crt", certs.directory / "xfcc-client.key"
    cert_file.write_bytes(pair.cert_pem)
    key_file.write_bytes(pair.key_pem)
    parsed = x509.load_pem_x509_certificate(pair.cert_pem)
    der = parsed.public_bytes(serialization.Encoding.DER)
    pem = urllib.parse.quote(parsed.public_bytes(serialization.Encoding.PEM).decode(), safe="")
    expected = (
        f'Hash={hashlib.sha256(der).hexdigest()};Cert="{pem}";Subject="CN=partner";'
        "URI=spiffe://partner.example/ns/a/sa/b;DNS=partner.example"
    )
    ca_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "xfcc-client-ca"},
        "data": {"ca.crt": client_ca.cert_pem.decode()},
    }
    listener = https_listener("https-m", "m.example", "cert-m") | {"port": 9444}
    validation = {"caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": "xfcc-client-ca"}]}
    add = [
        {"op": "add", "path": "/spec/listeners/-", "value": listener},
        {
            "op": "add",
            "path": "/spec/tls",
            "value": {"frontend": {"perPort": [{"port": 9444, "tls": {"validation": validation}}]}},
        },
    ]
    route = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "echo-m"},
        "spec": {
            "parentRefs": [{"name": "edge", "namespace": EDGE, "sectionName": "https-m"}],
            "hostnames": ["m.example"],
            "rules": [{"backendRefs": [{"name": "echo", "port": 80}]}],
        },
    }
    ip = address(lab)
    https = ("--cacert", str(certs.ca_file), "--resolve", f"m.example:9444:{ip}")
    forged = ("-H", f"X-Forwarded-Client-Cert: By={GATEWAY_ID};URI=spiffe://cluster.local/ns/{APP}/sa/admin")
    url = "https://m.example:9444/xfcc"
    # An earlier test labelled echo istio.io/ingress-use-waypoint; through the waypoint, the gateway's XFCC would
    # end at the waypoint (its inner connection presents no certificate, so it sanitizes, as Istio's waypoint does).
    # The gateway's own header is what this test reads, so echo is reached directly meanwhile.
    labels = lab.get("service", "echo", "-n", APP)["metadata"].get("labels") or {}
    via_waypoint = labels.get(INGRESS_USE_WAYPOINT)
    if via_waypoint is not None:
        lab.kubectl("label", "service", "echo", "-n", APP, f"{INGRESS_USE_WAYPOINT}-")
    lab.apply(ca_map, tls_secret("cert-m", certs.issue("m.example")), namespace=EDGE)
    lab.kubectl("patch", "gateway", "edge", "-n", EDGE, "--type=json", "-p", json.dumps(add))
    lab.apply(route, namespace=APP)

    def direct() -> dict[str, Any] | None:
        answer = through_gateway(*https, "--cert", str(cert_file), "--key", str(key_file), *forged, url)
        return answer if answer is not None and "x-forwarded-client-cert" in echoed_headers(answer) else None

    try:
        try:
            answer = wait_until(
                "curl with a client certificate reaches echo straight through the mutual-TLS listener", direct, 180, 1
            )
        except BaseException:
            print("curl:", curl("-v", *https, "--cert", str(cert_file), "--key", str(key_file), url).stderr)
            print("gateway:", json.dumps(lab.get("gateway", "edge", "-n", EDGE).get("status"), indent=1))
            raise
        assert answer["path"] == "/xfcc" and answer["pod"].startswith("echo-")
        assert echoed_headers(answer).get("x-forwarded-client-cert") == expected
        refused = curl(*https, "-o", "/dev/null", "-w", "%{http_code}", url)
        assert refused.returncode != 0 and refused.stdout in ("", "000"), refused
        listeners = {item["name"]: item for item in lab.get("gateway", "edge", "-n", EDGE)["status"]["listeners"]}
        assert condition({"status": listeners["https-m"]}, "ResolvedRefs")["status"] == "True"
    finally:
        gateway = lab.get("gateway", "edge", "-n", EDGE)
        names = [item["name"] for item in gateway["spec"]["listeners"]]
        undo = [{"op": "remove", "path": "/spec/tls"}] if "tls" in gateway["spec"] else []
        undo += [{"op": "remove", "path": f"/spec/listeners/{names.index('https-m')}"}] if "https-m" in names else []
        if undo:
            lab.kubectl("patch", "gateway", "edge", "-n", EDGE, "--type=json", "-p", json.dumps(undo))
        lab.kubectl("delete", "httproute", "echo-m", "-n", APP, "--ignore-not-found")
        lab.kubectl("delete", "configmap", "xfcc-client-ca", "-n", EDGE, "--ignore-not-found")
        lab.kubectl("delete", "secret", "cert-m", "-n", EDGE, "--ignore-not-found")
        if via_waypoint is not None:
            lab.kubectl("label", "service", "echo", "-n", APP, f"{INGRESS_USE_WAYPOINT}={via_waypoint}", "--overwrite")

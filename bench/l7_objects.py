"""What the L7 benchmark (:mod:`bench.l7`) puts on the lab: Kubernetes objects and haproxy configurations, as pure
functions of names, addresses and file paths.

Theory of operation: one answer server per server pod (``plain-srv``, ``amb-srv``; :func:`answer_config`), haproxy
in HTTP mode answering every request with the same 1 KiB body from a file, on ``:8080`` (HTTP/1.1, and HTTP/2 with
prior knowledge: haproxy recognises the HTTP/2 preface on a clear-text bind) and on ``:8443`` over TLS (the
listener's certificate, ALPN ``h2,http/1.1``: the bare path of the ingress scenarios). A C server is used so that
the server is never what limits a mode; every mode reaches the same kind of server the same way.

The mesh objects (:func:`mesh_objects`): in ``bench-amb`` two Services over ``amb-srv``, ``amb-l4`` (no waypoint:
the L4 path) and ``amb-wp`` (``istio.io/use-waypoint: waypoint``: Service traffic through the namespace's waypoint,
applied with ``ambit waypoint apply``), so the two paths run side by side without relabelling between rounds; the
ingress Gateway (class ``istio``, an HTTPS listener for :data:`INGRESS_HOST` terminating TLS with a
``kubernetes.io/tls`` Secret) in ``bench-edge``, and an HTTPRoute from it to ``amb-l4``.

The C peers (:func:`haproxy_http_config`, :func:`haproxy_ingress_config`) are set up as
:mod:`bench.mesh.tunnels` sets up ``haproxy-tls`` (ECDSA P-256 from one throw-away CA, each side verifying the
other's chain, OpenSSL's default TLS 1.3 suite) but in ``mode http``:

1. ``haproxy-http``: a client-side haproxy in ``plain-cli`` takes HTTP/1.1 or h2c on 127.0.0.1 and forwards each
   request over mutual TLS with ALPN ``h2`` (requests multiplexed on pooled connections, as HBONE multiplexes
   tunnels) to a server-side haproxy in ``plain-srv``, which verifies the client certificate and forwards to the
   answer server on 127.0.0.1:8080 over HTTP/1.1 keep-alive;
2. ``haproxy-ingress``: an haproxy on the host terminates TLS with the Gateway's own certificate and key (ALPN
   ``h2,http/1.1``) and forwards over mutual TLS (ALPN ``h2``) to the same server-side haproxy in ``plain-srv``:
   the C peer of the gateway (TLS from the host, mutual TLS to the server's side).

Every haproxy keeps its defaults otherwise (TLS session tickets and cache on, ``http-reuse safe``).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.mesh.tunnels import Credentials

BODY_BYTES = 1024
ANSWER_PORT, ANSWER_TLS_PORT = 8080, 8443
SERVICE_PORT = 80
L4_SERVICE, WAYPOINT_SERVICE = "amb-l4", "amb-wp"
WAYPOINT = "waypoint"
EDGE_NAMESPACE, GATEWAY, GATEWAY_PORT = "bench-edge", "bench-ingress", 8443
INGRESS_HOST = "bench.example"
CERT_SECRET = "bench-ingress-cert"
GATEWAY_NAME_LABEL = "gateway.networking.k8s.io/gateway-name"

HTTP_LOCAL_PORT = 18080
"""haproxy-http's client side listens on 127.0.0.1 of ``plain-cli`` here."""
HTTP_TLS_PORT = 28080
"""haproxy-http's server side (and haproxy-ingress's upstream) listens on ``plain-srv``'s address here."""
INGRESS_LOCAL_PORT = 18443
"""haproxy-ingress listens on the host's 127.0.0.1 here."""
MAXCONN = 4000
"""Well under the open-files limit haproxy can raise itself to in a lab pod (each connection costs it two)."""


@dataclass(frozen=True, slots=True)
class AnswerFiles:
    body: Path
    """:data:`BODY_BYTES` bytes."""
    listener_pem: Path
    """The certificate for :data:`INGRESS_HOST` then its key (the Gateway's Secret holds the same pair)."""


def _head(*, stats_socket: Path | None = None) -> list[str]:
    lines = ["global", f"  maxconn {MAXCONN}"]
    if stats_socket is not None:
        lines += [f"  stats socket {stats_socket} mode 600 level user"]
    return [
        *lines,
        "defaults",
        "  mode http",
        "  timeout connect 5s",
        "  timeout client 1h",
        "  timeout server 1h",
        "  timeout http-keep-alive 1h",
    ]


def answer_config(files: AnswerFiles) -> str:
    """The answer server: 200 with the body file to every request, on :8080 (clear) and :8443 (TLS)."""
    lines = _head()
    lines += [
        "frontend answer",
        f"  bind :{ANSWER_PORT}",
        f"  bind :{ANSWER_TLS_PORT} ssl crt {files.listener_pem} alpn h2,http/1.1",
        f"  http-request return status 200 content-type application/octet-stream file {files.body}",
    ]
    return "\n".join(lines) + "\n"


def haproxy_http_config(creds: Credentials, *, client: bool, server_ip: str) -> str:
    """One side of ``haproxy-http`` (rule 1 of the module docstring)."""
    lines = _head()
    if client:
        upstream = f"{server_ip}:{HTTP_TLS_PORT} ssl crt {creds.client_pem} ca-file {creds.ca} verify required alpn h2"
        lines += ["frontend f_http", f"  bind 127.0.0.1:{HTTP_LOCAL_PORT}", "  default_backend b_http"]
        # HTTP/2 carries no reason phrase, and haproxy writes none into the HTTP/1.1 status line it relays from an
        # HTTP/2 upstream ("HTTP/1.1 200 "), which h2load counts as a failed request; the phrase is put back.
        lines += ["  http-response set-status 200 reason OK if { status 200 }"]
        lines += ["backend b_http", f"  server s {upstream}"]
    else:
        bind = f"{server_ip}:{HTTP_TLS_PORT} ssl crt {creds.server_pem} ca-file {creds.ca} verify required alpn h2"
        lines += ["frontend f_mtls", f"  bind {bind}", "  default_backend b_answer"]
        lines += ["backend b_answer", f"  server s 127.0.0.1:{ANSWER_PORT}"]
    return "\n".join(lines) + "\n"


def haproxy_ingress_config(creds: Credentials, files: AnswerFiles, *, server_ip: str, stats_socket: Path) -> str:
    """``haproxy-ingress`` on the host (rule 2); its stats socket tells how many TLS handshakes were resumed."""
    upstream = f"{server_ip}:{HTTP_TLS_PORT} ssl crt {creds.client_pem} ca-file {creds.ca} verify required alpn h2"
    lines = _head(stats_socket=stats_socket)
    bind = f"127.0.0.1:{INGRESS_LOCAL_PORT} ssl crt {files.listener_pem} alpn h2,http/1.1"
    lines += ["frontend f_ingress", f"  bind {bind}", "  default_backend b_mesh"]
    lines += ["  http-response set-status 200 reason OK if { status 200 }"]  # as haproxy_http_config's client side
    lines += ["backend b_mesh", f"  server s {upstream}"]
    return "\n".join(lines) + "\n"


def _service(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "bench-amb", "labels": labels},
        "spec": {
            "selector": {"app": "amb-srv"},
            "ports": [{"name": "http", "port": SERVICE_PORT, "targetPort": ANSWER_PORT, "protocol": "TCP"}],
        },
    }


def mesh_objects(cert_pem: bytes, key_pem: bytes) -> list[dict[str, Any]]:
    """The Services, the ingress namespace, its certificate Secret, Gateway and the HTTPRoute (in apply order)."""
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": CERT_SECRET, "namespace": EDGE_NAMESPACE},
        "type": "kubernetes.io/tls",
        "data": {"tls.crt": base64.b64encode(cert_pem).decode(), "tls.key": base64.b64encode(key_pem).decode()},
    }
    gateway = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": GATEWAY, "namespace": EDGE_NAMESPACE},
        "spec": {
            "gatewayClassName": "istio",
            "listeners": [
                {
                    "name": "https",
                    "port": GATEWAY_PORT,
                    "protocol": "HTTPS",
                    "hostname": INGRESS_HOST,
                    "tls": {"mode": "Terminate", "certificateRefs": [{"name": CERT_SECRET}]},
                    "allowedRoutes": {"namespaces": {"from": "All"}},
                }
            ],
        },
    }
    route = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": GATEWAY, "namespace": "bench-amb"},
        "spec": {
            "parentRefs": [{"name": GATEWAY, "namespace": EDGE_NAMESPACE}],
            "hostnames": [INGRESS_HOST],
            "rules": [{"backendRefs": [{"name": L4_SERVICE, "port": SERVICE_PORT}]}],
        },
    }
    return [
        _service(L4_SERVICE, {}),
        _service(WAYPOINT_SERVICE, {"istio.io/use-waypoint": WAYPOINT}),
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": EDGE_NAMESPACE}},
        secret,
        gateway,
        route,
    ]


def parse_stats_info(text: str) -> dict[str, str]:
    """haproxy's ``show info`` (``Name: value`` lines) as a mapping; lines without a colon are skipped."""
    found = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip():
            found[name.strip()] = value.strip()
    return found

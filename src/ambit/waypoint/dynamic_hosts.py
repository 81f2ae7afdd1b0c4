"""Where a request to a ``DYNAMIC_DNS`` ServiceEntry host goes: the name the client asks for, when the host covers it.

Theory of operation: a ServiceEntry with ``resolution: DYNAMIC_DNS`` and a wildcard host (``*.example.com``) bound
to an egress waypoint has no endpoints. The client's node proxy sends its connection to the address allocated to
the wildcard (every name under it resolves there, spec §9), and the waypoint, as Istio's does with Envoy's dynamic
forward proxy, reads the name the client meant from the request itself: an HTTP request's ``Host`` (``:authority``),
a TLS connection's server name (SNI). :func:`judge_name` decides whether that name may be looked up;
:func:`dynamic_endpoint` makes the :class:`~ambit.waypoint.destinations.Endpoint` the upstream shell resolves
(:class:`~ambit.proxy.hostnames.HostnameResolver`, whose cache and concurrent lookups are bounded, then
:func:`~ambit.waypoint.destinations.judge_resolved`) and dials. Pure: no I/O.

The name comes from the client and is not to be trusted: the waypoint must not become an open proxy.

Rules:

1. Which Services: those the waypoint's WaypointConfig lists in ``dynamic_dns`` (the control plane knows the
   entry's resolution; the workload state does not carry it). A waypoint without that configuration forwards
   nothing this way: such a Service has no endpoint and answers 503.
2. Which ports: a port declared HTTP (HTTP/1.1, HTTP/2, gRPC) forwards each request by its ``Host``; a port declared
   TLS relays each connection by its SNI (:func:`dynamic_protocol`). Any other port has no endpoint, as istiod
   builds no dynamic forward proxy cluster for it.
3. The name: a ``Host`` value loses its port (``name:8080`` is ``name``; the port dialled is never the client's
   choice, rule 5), then one trailing dot; it is compared in lower case. Refused, 404: an empty name, an IP literal
   (``10.0.0.1``, ``[::1]``, or a name whose labels are all digits, which some resolvers read as an address), a
   name that is not a DNS host name (characters other than letters, digits, ``-`` and ``_``; an empty label; a
   label over 63 or a name over 253 characters; a wildcard), and a name the Service's host does not cover.
4. Coverage, as Envoy matches a virtual host's wildcard domain and the DNS proxy answers it: ``*.example.com``
   covers every name that ends in ``.example.com`` with at least one label before it, at any depth; a host without
   a wildcard covers only itself; a bare ``*`` or a wildcard that is not a whole first label (``*foo.com``) covers
   nothing (fail closed).
5. The endpoint: the judged name, resolved as the request comes in the IP version of the entry address the client
   called (:func:`~ambit.waypoint.destinations.in_dialled_family`), at the Service port's target port (its ``number``
   when the entry gives no ``targetPort``); plain TCP, then what the DestinationRule asks (originated TLS: the SNI
   is the rule's ``sni``, else the name, as Envoy's ``auto_sni``; the certificate is checked against it unless the
   rule skips verification).
"""

from __future__ import annotations

import dataclasses

from ambit.model.dnsname import MAX_NAME, check_dns_name, is_ip
from ambit.model.workload import AppProtocol, Service, Workload
from ambit.waypoint.destinations import UNRESOLVED, Endpoint, Refusal, Transport

__all__ = [
    "HTTP_PROTOCOLS",
    "covers",
    "dynamic_endpoint",
    "dynamic_protocol",
    "judge_name",
    "name_of_host",
    "plan_request",
    "plan_server_name",
]

HTTP_PROTOCOLS = frozenset({AppProtocol.HTTP11, AppProtocol.HTTP2, AppProtocol.GRPC})
SHOWN = 80
"""Characters of a refused name quoted in a reason (the rest is the client's, and could be long)."""


def dynamic_protocol(service: Service, port: int) -> AppProtocol | None:
    """Rule 2: the declared protocol of ``port`` when requests on it are forwarded by name, else None."""
    mapping = next((m for m in service.ports if m.service_port == port), None)
    if mapping is None:
        return None
    if mapping.app_protocol in HTTP_PROTOCOLS or mapping.app_protocol is AppProtocol.TLS:
        return mapping.app_protocol
    return None


def name_of_host(host: str) -> str | Refusal:
    """Rule 3's first step: the name in a ``Host`` value (its port dropped), or a 404 :class:`Refusal`."""
    if host.startswith("["):
        return Refusal(404, f"host {_shown(host)} is an IP literal")
    name, colon, port = host.rpartition(":")
    if not colon:
        return host
    if not port.isdigit() or len(port) > 5 or not port.isascii():
        return Refusal(404, f"host {_shown(host)} has no valid port")
    return name


def judge_name(name: str, pattern: str) -> str | Refusal:
    """Rules 3 and 4: ``name`` (a host name without port) in lower case without a trailing dot when ``pattern`` (the
    Service's hostname) covers it and it may be looked up; else a 404 :class:`Refusal` saying why."""
    if len(name) > MAX_NAME + 1:  # before any other work on it
        return Refusal(404, f"host {_shown(name)} is longer than {MAX_NAME} characters")
    text = name.lower()
    text = text[:-1] if text.endswith(".") else text
    if not text:
        return Refusal(404, "empty host")
    if is_ip(text) or all(label.isdigit() for label in text.split(".")):  # rule 3: digit labels read as one
        return Refusal(404, f"host {_shown(text)} is an IP literal")
    problem = check_dns_name(text)
    if problem:
        return Refusal(404, f"host {_shown(text)} is not a host name: {problem[:SHOWN]}")
    if not covers(pattern, text):
        return Refusal(404, f"host {_shown(text)} does not match {pattern}")
    return text


def covers(pattern: str, name: str) -> bool:
    """Rule 4: whether the Service host ``pattern`` covers ``name`` (both without trailing dots)."""
    pattern = pattern.lower().rstrip(".")
    if not pattern.startswith("*"):
        return bool(pattern) and name == pattern
    suffix = pattern[1:]
    if not suffix.startswith(".") or len(suffix) < 2 or "*" in suffix:
        return False
    return name.endswith(suffix) and len(name) > len(suffix)


def dynamic_endpoint(service: Service, name: str, port: int, transport: Transport) -> Endpoint:
    """Rule 5: the endpoint for a judged ``name`` (from :func:`judge_name`) on service port ``port``."""
    target = next((m.target_port for m in service.ports if m.service_port == port and m.target_port), port)
    workload = Workload(
        uid=f"{service.key}/dynamic/{name}",
        name="",
        namespace=service.namespace,
        addresses=(),
        hostname=name,
        workload_name="",
    )
    if transport.tls is not None and not transport.tls.sni:
        transport = dataclasses.replace(transport, sni=name)
    return Endpoint(workload, UNRESOLVED, target, service, resolve_hostname=name, transport=transport)


def plan_request(service: Service, port: int, host: str, transport: Transport) -> Endpoint | Refusal | None:
    """Rules 2-5 for one HTTP request with ``Host`` (or ``:authority``) ``host`` to service port ``port``: the
    endpoint, a 404 :class:`Refusal`, or None when the port forwards nothing by name (rule 2)."""
    if dynamic_protocol(service, port) not in HTTP_PROTOCOLS:
        return None
    name = name_of_host(host)
    if isinstance(name, Refusal):
        return name
    judged = judge_name(name, service.hostname)
    if isinstance(judged, Refusal):
        return judged
    return dynamic_endpoint(service, judged, port, transport)


def plan_server_name(service: Service, port: int, server_name: str | None, transport: Transport) -> Endpoint | Refusal:
    """Rules 2-5 for one TLS connection whose ClientHello names ``server_name`` (None: it names none, refused)."""
    if dynamic_protocol(service, port) is not AppProtocol.TLS:
        return Refusal(503, f"port {port} of {service.key} is not forwarded by server name")
    if not server_name:
        return Refusal(404, "the ClientHello names no server")
    judged = judge_name(server_name, service.hostname)
    if isinstance(judged, Refusal):
        return judged
    return dynamic_endpoint(service, judged, port, transport)


def _shown(text: str) -> str:
    return repr(text[:SHOWN] + ("..." if len(text) > SHOWN else ""))

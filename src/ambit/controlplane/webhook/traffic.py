"""Shallow validation of ``networking.istio.io`` DestinationRule, VirtualService, Sidecar and Gateway (Istio's own).

Theory of operation. Only their structure and the obvious field errors are checked: top-level fields are decoded
strictly, required hosts and names are present (a DestinationRule subset's name a DNS label, as Istio requires),
enums hold known values, port numbers are in range, and a route says where it goes. A VirtualService's HTTP
``match`` conditions and ``rewrite`` are checked as istiod checks them (:mod:`ambit.controlplane.webhook.http_match`:
string matches, RE2 regular expressions, header names). A ``loadBalancer.localityLbSetting`` (top level, subsets,
port level) is judged in full, by the translation's own reader, as istiod's webhook refuses a bad one. Other nested
settings only have to be objects; the translation (:mod:`ambit.controlplane.translate.destinationrules`, ...)
judges the rest and reports a rule it cannot use as skipped.
"""

from __future__ import annotations

from typing import Any

from ambit.controlplane.translate.locality_lb import read_locality_lb
from ambit.controlplane.translate.shapes import ShapeError
from ambit.controlplane.webhook.fields import Fields, is_dns_label, is_hostname
from ambit.controlplane.webhook.http_match import MatchChecker

TLS_MODES = ("DISABLE", "SIMPLE", "MUTUAL", "ISTIO_MUTUAL")
LOAD_BALANCERS = ("UNSPECIFIED", "LEAST_CONN", "RANDOM", "PASSTHROUGH", "ROUND_ROBIN", "LEAST_REQUEST")
OUTBOUND_MODES = ("REGISTRY_ONLY", "ALLOW_ANY")
SERVER_PROTOCOLS = ("HTTP", "HTTPS", "HTTP2", "GRPC", "GRPC-WEB", "HTTP_PROXY", "TCP", "TLS", "MONGO", "REDIS", "MYSQL")
"""Istio's protocol names a Gateway server may use (case-insensitive)."""
SERVER_TLS_MODES = ("PASSTHROUGH", "SIMPLE", "MUTUAL", "AUTO_PASSTHROUGH", "ISTIO_MUTUAL", "OPTIONAL_MUTUAL")
_TRAFFIC_POLICY = (
    "loadBalancer",
    "connectionPool",
    "outlierDetection",
    "tls",
    "portLevelSettings",
    "tunnel",
    "proxyProtocol",
)


def validate_destination_rule(obj: dict[str, Any]) -> Fields:
    f = Fields()
    spec = f.mapping(
        obj.get("spec"), "spec", known=("host", "trafficPolicy", "subsets", "exportTo", "workloadSelector")
    )
    _host(f, spec.get("host"), "spec.host", required=True)
    _traffic_policy(f, f.get(spec, "trafficPolicy"), "spec.trafficPolicy")
    names: set[str] = set()
    for path, subset in f.objects(spec.get("subsets"), "spec.subsets"):
        f.mapping(subset, path, known=("name", "labels", "trafficPolicy"))
        name = f.string(subset.get("name"), f"{path}.name", required=True)
        if name is not None:
            if not is_dns_label(name):
                f.error(f"{path}.name", f"subset name {name!r} is not a DNS label (lower case, digits, '-')")
            elif name in names:
                f.error(f"{path}.name", f"subset name {name!r} is not unique")
            names.add(name)
        f.labels(subset.get("labels"), f"{path}.labels")
        _traffic_policy(f, f.get(subset, "trafficPolicy"), f"{path}.trafficPolicy")
    f.strings(f.get(spec, "exportTo"), "spec.exportTo")
    f.selector(f.get(spec, "workloadSelector"), "spec.workloadSelector")
    return f


def _traffic_policy(f: Fields, value: Any, path: str) -> None:
    policy = f.mapping(value, path, known=_TRAFFIC_POLICY)
    _load_balancer(f, f.get(policy, "loadBalancer"), f"{path}.loadBalancer")
    tls = f.mapping(policy.get("tls"), f"{path}.tls")
    f.enum(tls.get("mode"), f"{path}.tls.mode", TLS_MODES)
    for name in ("connectionPool", "outlierDetection", "tunnel", "proxyProtocol"):
        f.mapping(f.get(policy, name), f"{path}.{name}")
    for port_path, setting in f.objects(f.get(policy, "portLevelSettings"), f"{path}.portLevelSettings"):
        port = f.mapping(setting.get("port"), f"{port_path}.port", required=True)
        f.port(port.get("number"), f"{port_path}.port.number", required=True)
        _load_balancer(f, f.get(setting, "loadBalancer"), f"{port_path}.loadBalancer")


def _load_balancer(f: Fields, value: Any, path: str) -> None:
    balancer = f.mapping(value, path)
    f.enum(balancer.get("simple"), f"{path}.simple", LOAD_BALANCERS)
    locality = f.get(balancer, "localityLbSetting")
    if locality is not None:  # judged as istiod's webhook does (ValidateLocalityLbSetting)
        try:
            read_locality_lb(locality, f"{path}.localityLbSetting")
        except ShapeError as error:
            f.error(error.field, error.reason)


def validate_virtual_service(obj: dict[str, Any]) -> Fields:
    f = Fields()
    spec = f.mapping(obj.get("spec"), "spec", known=("hosts", "gateways", "http", "tls", "tcp", "exportTo"))
    for path, host in f.strings(spec.get("hosts"), "spec.hosts", required=True):
        if host != "*" and not is_hostname(host):
            f.error(path, f"{host!r} is not a DNS name, a '*.' wildcard or '*'")
    f.strings(spec.get("gateways"), "spec.gateways")
    checker = MatchChecker(f)
    for path, http in f.objects(spec.get("http"), "spec.http"):
        for match_path, match in f.objects(http.get("match"), f"{path}.match"):
            checker.match(match, match_path)
        checker.rewrite(http.get("rewrite"), f"{path}.rewrite")
        has = [name for name in ("route", "redirect", "directResponse", "delegate") if http.get(name)]
        if not has:
            f.error(path, "needs one of route, redirect, directResponse or delegate")
        elif "route" in has and len(has) > 1:
            f.error(f"{path}.route", f"cannot be set together with {has[1]}")
        _routes(f, http.get("route"), f"{path}.route", required=False)
    for path, tls in f.objects(spec.get("tls"), "spec.tls"):
        for match_path, match in f.objects(tls.get("match"), f"{path}.match", required=True):
            f.strings(f.get(match, "sniHosts"), f"{match_path}.sniHosts", required=True)
        _routes(f, tls.get("route"), f"{path}.route", required=True)
    for path, tcp in f.objects(spec.get("tcp"), "spec.tcp"):
        f.objects(tcp.get("match"), f"{path}.match")
        _routes(f, tcp.get("route"), f"{path}.route", required=True)
    f.strings(f.get(spec, "exportTo"), "spec.exportTo")
    return f


def _routes(f: Fields, value: Any, path: str, *, required: bool) -> None:
    for route_path, route in f.objects(value, path, required=required):
        destination = f.mapping(route.get("destination"), f"{route_path}.destination", required=True)
        given = route.get("destination") is not None
        _host(f, destination.get("host"), f"{route_path}.destination.host", required=given)
        f.string(destination.get("subset"), f"{route_path}.destination.subset")
        port = f.mapping(destination.get("port"), f"{route_path}.destination.port")
        f.port(port.get("number"), f"{route_path}.destination.port.number")
        f.integer(route.get("weight"), f"{route_path}.weight", low=0, high=2**31 - 1, what="weight")


def validate_sidecar(obj: dict[str, Any]) -> Fields:
    f = Fields()
    spec = f.mapping(
        obj.get("spec"),
        "spec",
        known=("workloadSelector", "ingress", "egress", "outboundTrafficPolicy", "inboundConnectionPool"),
    )
    f.selector(f.get(spec, "workloadSelector"), "spec.workloadSelector", labels_name="labels")
    for path, ingress in f.objects(spec.get("ingress"), "spec.ingress"):
        port = f.mapping(ingress.get("port"), f"{path}.port", required=True)
        f.port(port.get("number"), f"{path}.port.number", required=True)
        f.string(f.get(ingress, "defaultEndpoint"), f"{path}.defaultEndpoint")
    for path, egress in f.objects(spec.get("egress"), "spec.egress"):
        for host_path, host in f.strings(egress.get("hosts"), f"{path}.hosts", required=True):
            namespace, slash, name = host.partition("/")
            if not slash or not (namespace in ("*", ".", "~") or is_dns_label(namespace)):
                f.error(host_path, f"{host!r} is not namespace/host (namespace '*', '.', '~' or a name)")
            elif name != "*" and not is_hostname(name):
                f.error(host_path, f"{name!r} is not a DNS name, a '*.' wildcard or '*'")
        port = f.mapping(egress.get("port"), f"{path}.port")
        f.port(port.get("number"), f"{path}.port.number")
    outbound = f.mapping(f.get(spec, "outboundTrafficPolicy"), "spec.outboundTrafficPolicy")
    f.enum(outbound.get("mode"), "spec.outboundTrafficPolicy.mode", OUTBOUND_MODES)
    f.mapping(f.get(spec, "inboundConnectionPool"), "spec.inboundConnectionPool")
    return f


def validate_istio_gateway(obj: dict[str, Any]) -> Fields:
    """Istio's ``Gateway`` (not Gateway API's): a selector and servers, each with a port and hosts."""
    f = Fields()
    spec = f.mapping(obj.get("spec"), "spec", known=("selector", "servers"))
    f.labels(f.get(spec, "selector"), "spec.selector")
    for path, server in f.objects(spec.get("servers"), "spec.servers", required=True):
        f.mapping(server, path, known=("port", "bind", "hosts", "tls", "name", "defaultEndpoint"))
        port = f.mapping(server.get("port"), f"{path}.port", required=True)
        f.port(port.get("number"), f"{path}.port.number", required=True)
        protocol = f.string(port.get("protocol"), f"{path}.port.protocol", required=True)
        if protocol is not None and protocol.upper() not in SERVER_PROTOCOLS:
            f.error(f"{path}.port.protocol", f"{protocol!r} is not one of {', '.join(SERVER_PROTOCOLS)}")
        f.string(port.get("name"), f"{path}.port.name", required=bool(port))
        if port.get("targetPort") is not None:
            f.error(f"{path}.port.targetPort", "targetPort has no effect on a Gateway: the Service maps ports")
        for host_path, host in f.strings(server.get("hosts"), f"{path}.hosts", required=True):
            namespace, slash, name = host.rpartition("/")
            if slash and not (namespace in ("*", ".") or is_dns_label(namespace)):
                f.error(host_path, f"{host!r}: the namespace before '/' must be '*', '.' or a name")
            elif name != "*" and not is_hostname(name):
                f.error(host_path, f"{name!r} is not a DNS name, a '*.' wildcard or '*'")
        tls = f.mapping(f.get(server, "tls"), f"{path}.tls")
        f.enum(tls.get("mode"), f"{path}.tls.mode", SERVER_TLS_MODES)
        if isinstance(protocol, str) and protocol.upper() in SERVER_PROTOCOLS:
            _server_tls(f, protocol.upper(), server.get("tls"), tls, f"{path}.tls")
        _tls_sources(f, tls, f"{path}.tls")
        f.string(f.get(server, "bind"), f"{path}.bind")
        f.string(f.get(server, "name"), f"{path}.name")
    return f


def _server_tls(f: Fields, protocol: str, given: Any, tls: dict[str, Any], path: str) -> None:
    """Istio's rules for a server's TLS settings: HTTPS and TLS need them; a plain-text port takes none (HTTP only
    ``httpsRedirect``); SIMPLE and MUTUAL need a certificate source; ISTIO_MUTUAL takes none."""
    if protocol in ("HTTPS", "TLS"):
        if given is None:
            f.error(path, f"a {protocol} server needs TLS settings (tls.mode)")
        return
    if given is None:
        return
    certificates = ("credentialName", "credentialNames", "serverCertificate", "privateKey", "caCertificates")
    plain_redirect = (
        protocol == "HTTP" and tls.get("mode") in (None, "PASSTHROUGH") and not any(tls.get(k) for k in certificates)
    )
    if not plain_redirect:
        f.error(path, f"a {protocol} server cannot have TLS settings (only httpsRedirect on HTTP)")


def _tls_sources(f: Fields, tls: dict[str, Any], path: str) -> None:
    mode = tls.get("mode")
    named = bool(tls.get("credentialName") or tls.get("credentialNames"))
    files = bool(tls.get("serverCertificate") and tls.get("privateKey")) or bool(tls.get("tlsCertificates"))
    if mode == "ISTIO_MUTUAL" and (named or files):
        f.error(path, "ISTIO_MUTUAL uses the gateway's mesh certificate: no credentialName or certificate files")
    elif mode in ("SIMPLE", "MUTUAL", "OPTIONAL_MUTUAL") and not (named or files):
        f.error(f"{path}.credentialName", f"{mode} TLS needs credentialName (a kubernetes.io/tls Secret)")


def _host(f: Fields, value: Any, path: str, *, required: bool) -> None:
    host = f.string(value, path, required=required)
    if host is not None and not is_hostname(host):
        f.error(path, f"{host!r} is not a DNS name (a '*.' prefix is allowed)")

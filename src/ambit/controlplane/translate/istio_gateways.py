"""Istio's own ``Gateway`` (``networking.istio.io``) and the VirtualServices bound to it → the
:class:`~ambit.model.ingress.GatewayConfig` of the gateway pods it selects (spec §1.5), as istiod builds a gateway
proxy's listeners and routes (``pilot/pkg/model/gateway.go`` ``MergeGateways``; ``networking/core/gateway.go``).

Theory of operation: a classic gateway is a group of pods (istio's ``istio-ingressgateway`` Deployment, label
``istio: ingressgateway``), not a Gateway object: every Gateway whose ``selector`` matches a pod's labels puts its
servers on that pod. :func:`~ambit.controlplane.translate.istio_gateway_pods.find_gateway_pods` groups the selected
pods; :func:`translate_istio_gateways` merges the servers of every Gateway selecting a group into that group's
listeners and fills them with the VirtualServices bound to those Gateways, converting each VirtualService's rules
once per server port with the waypoints' rule translation (:mod:`ambit.controlplane.translate.virtualservice_rules`,
its ``RuleContext`` naming the Gateway). Pure: no I/O, deterministic output; what cannot be served is a
:class:`~ambit.controlplane.translate.skips.Skipped` on the Gateway or VirtualService, never an exception.

Rules (1 and 2, which pods a Gateway selects and how they group into gateways, are
:mod:`ambit.controlplane.translate.istio_gateway_pods`'s; 3, 4 and 7, what a server is, its hosts and its TLS
settings, :mod:`ambit.controlplane.translate.istio_gateway_servers`'s):

5. Binding: a VirtualService binds when its ``gateways`` name the Gateway (``name`` in the VirtualService's
   namespace, or ``namespace/name``), it is exported to the gateway pods' namespace (``exportTo`` empty, ``*``,
   ``.`` in its own namespace, or naming it), and one of its ``hosts`` intersects a visible server host (either
   covers the other: the narrower is served, istiod's ``Intersection``). Bound VirtualServices are ordered by
   creation time, then name, then namespace.
6. HTTP ports: one listener, without hostname, whose virtual hosts are the intersected hostnames, each with the
   rules of every bound VirtualService for it, concatenated in rule 5's order (istiod appends to a duplicate
   virtual host). A server with ``tls.httpsRedirect: true`` marks every virtual host it contributes, and one per
   host of its own (without rules when no VirtualService binds there), to answer 301 with the ``https`` URL
   (istiod's ``RequireTls: ALL``); the flag means nothing on other servers. HTTPS ports: one listener per server
   host (its hostname picks by SNI; ``*`` takes the rest), with that server's certificate, client verification
   and the virtual hosts of that server; a host another server took on that port first is skipped. TCP ports:
   one virtual host ``*`` with the first bound VirtualService's first ``tcp`` rule that holds for the port.
   ``TLS_TERMINATE`` ports: one listener per server host as for HTTPS, each with one virtual host ``*`` whose
   backends are those of the first ``tcp`` rule holding for the port of the first VirtualService bound to that
   server (istiod's ``buildGatewayNetworkFiltersFromTCPRoutes``: the SNI picks the server, not the rule). TLS
   passthrough ports: a virtual host per ``sniHosts`` entry of the bound VirtualServices' ``tls`` rules that a
   server host covers, the first VirtualService in rule 5's order winning a name. A port where passthrough and
   terminating servers meet: a listener per server host, each of its server's kind (the terminating ones as on
   their own ports; a passthrough one with the virtual hosts of its server that its host covers), so that the
   ClientHello's server name picks the server as Envoy's filter chain match does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ambit.controlplane.translate.fields import mapping as _mapping
from ambit.controlplane.translate.fields import object_key as _key
from ambit.controlplane.translate.fields import strings as _strings
from ambit.controlplane.translate.fields import text as _text
from ambit.controlplane.translate.istio_gateway_pods import ISTIO_GATEWAY, GatewayPods, find_gateway_pods
from ambit.controlplane.translate.istio_gateway_servers import (
    TLS_FAMILY,
    GatewayServer,
    duplicate_hosts,
    read_server,
    target_port,
)
from ambit.controlplane.translate.listeners import SecretLookup
from ambit.controlplane.translate.skips import Skipped, skipped
from ambit.controlplane.translate.virtualservice_rules import (
    BadField,
    RuleContext,
    connection_backends,
    connection_match_holds,
    fqdn,
    gateway_key,
    http_rules,
)
from ambit.controlplane.translate.virtualservice_values import read_list, read_mapping
from ambit.controlplane.translate.virtualservices import VIRTUAL_SERVICE, host_matches
from ambit.model.ingress import (
    GatewayConfig,
    IngressListener,
    ListenerProtocol,
    VirtualHost,
    host_order,
)
from ambit.model.routes import ISTIO_RETRY, HttpRetry, RouteRule, WeightedBackend
from ambit.model.workload import Service

__all__ = ["IstioGatewayTranslation", "translate_istio_gateways"]

Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class IstioGatewayTranslation:
    configs: tuple[GatewayConfig, ...] = ()
    accounts: tuple[tuple[str, str], ...] = ()
    """(gateway key, service account): who may read each config (certificates included)."""
    pods: tuple[GatewayPods, ...] = ()


def _intersect(server_host: str, vs_host: str) -> str | None:
    """The narrower of two hostnames when one covers the other (istiod's ``Intersection``), else None."""
    if not (host_matches(server_host, vs_host) or host_matches(vs_host, server_host)):
        return None
    if not server_host.startswith("*"):
        return server_host
    if not vs_host.startswith("*"):
        return vs_host
    return server_host if len(server_host) >= len(vs_host) else vs_host


def _exported_to(spec: Obj, vs_namespace: str, consumer: str, default: tuple[str, ...] | None) -> bool:
    export = spec.get("exportTo")
    entries = {e for e in export if isinstance(e, str)} if isinstance(export, list) and export else set(default or "*")
    if "*" in entries:
        return True
    return consumer in {vs_namespace if e == "." else e for e in entries}


@dataclass(slots=True)
class _Bound:
    """The VirtualServices of one group, with their hosts and the gateways they name."""

    obj: Obj
    namespace: str
    name: str
    hosts: tuple[str, ...]
    gateways: frozenset[str]
    rules: dict[tuple[str, int], tuple[RouteRule, ...]] = field(default_factory=dict)


def _bound_virtual_services(
    virtual_services: Iterable[Obj], consumer: str, domain: str, default_export_to: tuple[str, ...] | None
) -> list[_Bound]:
    out: list[_Bound] = []
    for obj in virtual_services:
        if not isinstance(obj, Mapping):
            continue
        meta, spec = _mapping(obj.get("metadata")), _mapping(obj.get("spec"))
        namespace, name = _text(meta.get("namespace")), _text(meta.get("name"))
        raw = spec.get("gateways")
        gateways = frozenset(
            gateway_key(g, namespace) for g in (raw if isinstance(raw, list) else ()) if isinstance(g, str)
        )
        if not namespace or not name or not gateways or not _exported_to(spec, namespace, consumer, default_export_to):
            continue
        raw_hosts = spec.get("hosts")
        hosts = tuple(
            fqdn(h.lower(), namespace, domain)
            for h in (raw_hosts if isinstance(raw_hosts, list) else ())
            if isinstance(h, str) and h
        )
        out.append(_Bound(obj, namespace, name, hosts, gateways))
    out.sort(key=lambda b: (_text(_mapping(b.obj.get("metadata")).get("creationTimestamp")), b.name, b.namespace))
    return out


def _served(server: GatewayServer, bound: _Bound) -> list[str]:
    """Rule 5: the hostnames ``bound`` serves on ``server`` (empty: not bound there)."""
    if server.gateway_key not in bound.gateways:
        return []
    visible = [host for namespace, host in server.hosts if namespace in ("*", bound.namespace)]
    found = (_intersect(s, v) for s in visible for v in bound.hosts)
    return list(dict.fromkeys(h for h in found if h is not None))


@dataclass(slots=True)
class _Builder:
    pods: GatewayPods
    services: Mapping[str, tuple[Service, ...]]
    domain: str
    problems: set[Skipped]
    default_retry: HttpRetry = ISTIO_RETRY

    def http_rules(self, bound: _Bound, server: GatewayServer) -> tuple[RouteRule, ...]:
        cached = bound.rules.get((server.gateway_key, server.port))
        if cached is not None:
            return cached
        ctx = self.context(bound, server)
        problems: list[tuple[str, str]] = []
        rules = http_rules(_mapping(bound.obj.get("spec")), ctx, problems)
        self.problems.update(skipped(VIRTUAL_SERVICE, bound.obj, f, r) for f, r in problems)
        bound.rules[(server.gateway_key, server.port)] = rules
        return rules

    def context(self, bound: _Bound, server: GatewayServer) -> RuleContext:
        return RuleContext(
            bound.namespace,
            bound.name,
            self.domain,
            server.port,
            self.services,
            server.gateway_key,
            default_retry=self.default_retry,
        )

    def virtual_hosts(self, servers: list[GatewayServer], bound: list[_Bound]) -> tuple[VirtualHost, ...]:
        hosts: dict[str, list[RouteRule]] = {}
        redirect: set[str] = set()
        added: set[tuple[str, int, str, str]] = set()
        for vs in bound:
            for server in servers:
                served = _served(server, vs)
                if not served:
                    continue
                rules = self.http_rules(vs, server)
                for host in served:
                    once = (server.gateway_key, server.port, _key(vs.obj), host)
                    if once not in added:
                        added.add(once)
                        hosts.setdefault(host, []).extend(rules)
                    if server.https_redirect:
                        redirect.add(host)
        for server in servers:
            if server.https_redirect:
                for _, host in server.hosts:
                    hosts.setdefault(host, [])
                    redirect.add(host)
        return tuple(VirtualHost(h, tuple(hosts[h]), (), h in redirect) for h in sorted(hosts, key=host_order))

    def tcp_host(self, servers: list[GatewayServer], bound: list[_Bound]) -> tuple[VirtualHost, ...]:
        for vs in bound:
            for server in servers:
                if not _served(server, vs):
                    continue
                try:
                    backends = _tcp_route(_mapping(vs.obj.get("spec")), self.context(vs, server))
                except BadField as bad:
                    self.problems.add(skipped(VIRTUAL_SERVICE, vs.obj, bad.field, bad.reason))
                    continue
                if backends is not None:
                    return (VirtualHost("*", tcp_backends=backends),)
        return ()

    def tls_hosts(self, servers: list[GatewayServer], bound: list[_Bound]) -> tuple[VirtualHost, ...]:
        hosts: dict[str, tuple[WeightedBackend, ...]] = {}
        for vs in bound:
            for server in servers:
                if server.gateway_key not in vs.gateways:
                    continue
                try:
                    routes = _tls_routes(_mapping(vs.obj.get("spec")), self.context(vs, server))
                except BadField as bad:
                    self.problems.add(skipped(VIRTUAL_SERVICE, vs.obj, bad.field, bad.reason))
                    continue
                visible = [h for ns, h in server.hosts if ns in ("*", vs.namespace)]
                for sni_hosts, backends in routes:
                    for sni in sni_hosts:
                        if any(host_matches(s, sni) for s in visible):
                            hosts.setdefault(sni, backends)
        return tuple(VirtualHost(h, tcp_backends=hosts[h]) for h in sorted(hosts, key=host_order))


def translate_istio_gateways(
    *,
    gateways: Iterable[Obj],
    virtual_services: Iterable[Obj],
    pods: Iterable[Obj],
    services: Iterable[Service],
    service_objects: Iterable[Obj] = (),
    find_secret: SecretLookup,
    taken: frozenset[str] = frozenset(),
    domain: str = "cluster.local",
    skips: list[Skipped] | None = None,
    default_export_to: tuple[str, ...] | None = None,
    default_retry: HttpRetry = ISTIO_RETRY,
) -> IstioGatewayTranslation:
    """Rules 1-6: each classic gateway's config, who may read it, and its pods (for policy selectors).
    ``services`` are the translated Services (VirtualService destinations), ``service_objects`` the Kubernetes
    Services (the gateway pods' port mapping); ``default_export_to`` is the mesh config's
    ``defaultVirtualServiceExportTo``, ``default_retry`` its ``defaultHttpRetryPolicy``."""
    service_objects = [s for s in service_objects if isinstance(s, Mapping)]
    problems: set[Skipped] = set()
    own: list[Skipped] = []
    groups = find_gateway_pods(pods, gateways, taken=taken, skips=own)
    problems.update(own)
    by_hostname: dict[str, list[Service]] = {}
    for service in services:
        by_hostname.setdefault(service.hostname, []).append(service)
    hostnames = {k: tuple(v) for k, v in by_hostname.items()}
    vs_list = [v for v in virtual_services if isinstance(v, Mapping)]
    configs: list[GatewayConfig] = []
    for group in groups:
        selecting = [
            svc
            for svc in service_objects
            if _text(_mapping(svc.get("metadata")).get("namespace")) == group.namespace
            and (selector := _strings(_mapping(svc.get("spec")).get("selector")))
            and all(group.labels.get(k) == v for k, v in selector.items())
        ]
        selecting.sort(key=lambda svc: _text(_mapping(svc.get("metadata")).get("name")))
        servers: dict[int, list[GatewayServer]] = {}
        for gateway in group.gateways:
            raw = _mapping(gateway.get("spec")).get("servers")
            for i, item in enumerate(raw if isinstance(raw, list) else ()):
                judged = read_server(gateway, i, item, group.namespace, find_secret)
                if isinstance(judged, tuple):
                    problems.add(skipped(ISTIO_GATEWAY, gateway, *judged))
                    continue
                judged = replace(judged, bind=target_port(judged.port, selecting))
                on_port = servers.setdefault(judged.bind, [])
                mixable = judged.protocol in TLS_FAMILY and all(s.protocol in TLS_FAMILY for s in on_port)
                if on_port and on_port[0].protocol is not judged.protocol and not mixable:
                    reason = (
                        f"port {judged.bind} already serves {on_port[0].protocol.value} for {on_port[0].gateway_key}"
                        f" on {group.key}: this {judged.protocol.value} server is left out"
                    )
                    problems.add(skipped(ISTIO_GATEWAY, gateway, f"{judged.field}.port", reason))
                    continue
                duplicates = duplicate_hosts(judged, on_port)
                if duplicates:
                    reason = (
                        f"duplicate host names on port {judged.bind}: {', '.join(duplicates)}; the server is left out"
                    )
                    problems.add(skipped(ISTIO_GATEWAY, gateway, f"{judged.field}.hosts", reason))
                    continue
                on_port.append(judged)
        builder = _Builder(group, hostnames, domain, problems, default_retry)
        bound = _bound_virtual_services(vs_list, group.namespace, domain, default_export_to)
        listeners: list[IngressListener] = []
        for port in sorted(servers):
            on_port = servers[port]
            protocol = on_port[0].protocol
            name = f"{protocol.value.lower()}.{port}"
            if len({s.protocol for s in on_port}) > 1:
                listeners.extend(_mixed_tls_listeners(on_port, bound, builder, problems))
            elif protocol is ListenerProtocol.HTTP:
                listeners.append(IngressListener(name, port, protocol, "", (), builder.virtual_hosts(on_port, bound)))
            elif protocol is ListenerProtocol.TCP:
                listeners.append(IngressListener(name, port, protocol, "", (), builder.tcp_host(on_port, bound)))
            elif protocol is ListenerProtocol.TLS:
                listeners.append(IngressListener(name, port, protocol, "", (), builder.tls_hosts(on_port, bound)))
            else:
                listeners.extend(_terminating_listeners(protocol, on_port, bound, builder, problems))
        configs.append(GatewayConfig(group.key, tuple(listeners)))
    if skips is not None:
        skips.extend(sorted(problems))
    return IstioGatewayTranslation(tuple(configs), tuple((g.key, g.account) for g in groups), tuple(groups))


def _tcp_route(spec: Obj, ctx: RuleContext) -> tuple[WeightedBackend, ...] | None:
    """At an Istio Gateway's TCP server: the backends of the first ``tcp`` rule holding for ``ctx`` (its port and
    gateway), None when none does."""
    for i, raw in enumerate(read_list(spec.get("tcp"), "spec.tcp")):
        rule = read_mapping(raw, f"spec.tcp[{i}]")
        matches = [
            read_mapping(m, f"spec.tcp[{i}].match") for m in read_list(rule.get("match"), f"spec.tcp[{i}].match")
        ]
        if not matches or any(connection_match_holds(m, ctx) for m in matches):
            return connection_backends(rule.get("route"), ctx, f"spec.tcp[{i}].route")
    return None


def _tls_routes(spec: Obj, ctx: RuleContext) -> list[tuple[tuple[str, ...], tuple[WeightedBackend, ...]]]:
    """At an Istio Gateway's TLS passthrough server: each ``tls`` rule holding for ``ctx`` as (the ``sniHosts`` of
    its matches that hold, its backends), in written order."""
    out: list[tuple[tuple[str, ...], tuple[WeightedBackend, ...]]] = []
    for i, raw in enumerate(read_list(spec.get("tls"), "spec.tls")):
        rule = read_mapping(raw, f"spec.tls[{i}]")
        hosts: list[str] = []
        for j, m in enumerate(read_list(rule.get("match"), f"spec.tls[{i}].match")):
            match = read_mapping(m, f"spec.tls[{i}].match[{j}]")
            if connection_match_holds(match, ctx):
                sni = read_list(match.get("sniHosts"), f"spec.tls[{i}].match[{j}].sniHosts")
                hosts.extend(h.lower() for h in sni if isinstance(h, str) and h)
        if hosts:
            out.append(
                (tuple(dict.fromkeys(hosts)), connection_backends(rule.get("route"), ctx, f"spec.tls[{i}].route"))
            )
    return out


def _mixed_tls_listeners(
    servers: list[GatewayServer], bound: list[_Bound], builder: _Builder, problems: set[Skipped]
) -> list[IngressListener]:
    """Rule 6 for a port whose TLS servers pass through and terminate side by side: a listener per server host, each
    of its server's kind, the ClientHello's server name picking one (a passthrough listener's virtual hosts are
    its server's ``sniHosts``)."""
    out: list[IngressListener] = []
    for server in servers:
        if server.protocol is ListenerProtocol.TLS:
            virtual_hosts = builder.tls_hosts([server], bound)
            for _, host in server.hosts:
                hostname = "" if host == "*" else host
                covered = tuple(v for v in virtual_hosts if host_matches(host, v.hostname))
                name = f"tls.{server.bind}.{server.gateway_key}.{server.index}.{host}"
                out.append(IngressListener(name, server.bind, ListenerProtocol.TLS, hostname, (), covered))
        else:
            out.extend(_terminating_listeners(server.protocol, [server], bound, builder, problems))
    return out


def _terminating_listeners(
    protocol: ListenerProtocol,
    servers: list[GatewayServer],
    bound: list[_Bound],
    builder: _Builder,
    problems: set[Skipped],
) -> list[IngressListener]:
    """Rule 6 for an HTTPS or TLS_TERMINATE port: a listener per server host, first come first served."""
    out: list[IngressListener] = []
    taken: set[str] = set()
    for server in servers:
        if protocol is ListenerProtocol.HTTPS:
            virtual_hosts = builder.virtual_hosts([server], bound)
        else:
            virtual_hosts = builder.tcp_host([server], bound)
        certificates = (server.certificate,) if server.certificate is not None else ()
        for _, host in server.hosts:
            hostname = "" if host == "*" else host
            if hostname in taken:
                reason = f"host {host} on port {server.bind} is already served by another server"
                problems.add(skipped(ISTIO_GATEWAY, server.gateway, f"{server.field}.hosts", reason))
                continue
            taken.add(hostname)
            name = f"{protocol.value.lower()}.{server.bind}.{server.gateway_key}.{server.index}.{host}"
            out.append(IngressListener(name, server.bind, protocol, hostname, certificates, virtual_hosts, server.tls))
    return out

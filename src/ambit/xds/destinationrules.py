"""Model DestinationRules ↔ ``ambit.waypoint.v1.DestinationPolicy`` (``proto/waypoint.proto``), carried in
WaypointConfig field 6.

Theory of operation: :func:`destination_policy_to_proto` encodes field for field (the control plane's side);
:class:`DestinationPolicyReader` judges what a waypoint was sent, the first problem raising
:class:`~ambit.xds.errors.XdsConversionError` naming the resource and the field (e.g. ``app/waypoint:
destination_rules[0].subsets[1].name: not a DNS label``), so that the client NACKs that resource and keeps its
last good config.

Rules:

1. At most :data:`MAX_DESTINATION_RULES` rules, one per service key (printable, non-empty); at most
   :data:`MAX_SUBSETS` subsets each, their names DNS labels, unique; at most :data:`MAX_SUBSET_WORKLOADS` workload
   uids per subset (printable, non-empty, at most 512 characters).
2. Port-level entries: at most :data:`MAX_PORT_LEVEL`, ports 1..65535, each port once.
3. Enum values this build does not know are refused (they would change where or how requests go).
4. Durations are non-negative; a connect timeout or ejection time of 0 is refused (it would fail every try);
   ``max_ejection_percent`` is 0..100.
5. TLS: ``sni`` and each SAN are DNS names (at most 253 characters); ``ca_certificates`` is at most
   :data:`MAX_CA_BYTES` and, when set, PEM (``-----BEGIN CERTIFICATE-----``); whether it parses the waypoint judges
   when it builds the context (a failure then answers 503 for that Service, never takes the waypoint down).
   ``client_certificate`` likewise (at most :data:`MAX_CA_BYTES`); ``private_key`` at most :data:`MAX_KEY_BYTES`,
   a PEM private key, never quoted in an error. The three file paths are absolute and printable, at most
   :data:`MAX_PATH` characters; the waypoint reads them when it builds the context (rule 5's failure holds).
6. A consistent hash names a header (an HTTP token), a query parameter, or the source IP.
7. A locality setting is judged as istiod's validation judges the rule's
   (:func:`~ambit.model.locality_lb.setting_problems`: weights 1..100 adding up to 100, localities without
   overlap, failover regions distinct and plain, no region/zone/subzone priority label with failover, bounded
   lists and strings).
8. The mesh config's ``localityLbSetting`` (``mesh_locality_lb`` of a WaypointConfig or GatewayConfig) is judged
   as rule 7 says; absent, it is Istio's default (:data:`~ambit.model.locality_lb.MESH_DEFAULT`), which is also
   how that default is written.
"""

from __future__ import annotations

import re

from google.protobuf import duration_pb2

from ambit.api import waypoint_pb2 as pb
from ambit.model.destination_policy import (
    ClientTls,
    ConnectionPool,
    ConsistentHash,
    DestinationPolicy,
    H2Upgrade,
    LoadBalancer,
    LoadBalancerType,
    OutlierDetection,
    PortTrafficPolicy,
    ProxyProtocolVersion,
    Subset,
    TlsMode,
    TrafficPolicy,
)
from ambit.model.field_names import is_token
from ambit.model.locality_lb import (
    MAX_DISTRIBUTE,
    MESH_DEFAULT,
    LocalityDistribute,
    LocalityFailover,
    LocalityLbSetting,
    setting_problems,
)
from ambit.xds.convert import FieldReader

__all__ = [
    "MAX_CA_BYTES",
    "MAX_DESTINATION_RULES",
    "MAX_PORT_LEVEL",
    "MAX_SUBSETS",
    "MAX_SUBSET_WORKLOADS",
    "DestinationPolicyReader",
    "destination_policy_to_proto",
    "mesh_locality_to_proto",
]

MAX_DESTINATION_RULES = 10_000
MAX_SUBSETS = 256
MAX_SUBSET_WORKLOADS = 65_536
MAX_PORT_LEVEL = 256
MAX_CA_BYTES = 256 * 1024
MAX_KEY_BYTES = 64 * 1024
MAX_PATH = 4096
MAX_UID = 512
MAX_SANS = 64
_MAX_TO = 100
"""Localities of one ``distribute`` entry: each weighs at least 1 and they add up to 100."""
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_NAME = re.compile(
    r"(\*\.)?[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?)*"
)

_LB = {
    LoadBalancerType.LEAST_REQUEST: pb.LB_LEAST_REQUEST,
    LoadBalancerType.ROUND_ROBIN: pb.LB_ROUND_ROBIN,
    LoadBalancerType.RANDOM: pb.LB_RANDOM,
    LoadBalancerType.PASSTHROUGH: pb.LB_PASSTHROUGH,
}
_LB_NAMES = {v: k for k, v in _LB.items()}
_H2 = {
    H2Upgrade.DEFAULT: pb.H2_UPGRADE_DEFAULT,
    H2Upgrade.DO_NOT_UPGRADE: pb.H2_DO_NOT_UPGRADE,
    H2Upgrade.UPGRADE: pb.H2_UPGRADE,
}
_H2_NAMES = {v: k for k, v in _H2.items()}
_TLS = {
    TlsMode.DISABLE: pb.TLS_DISABLE,
    TlsMode.SIMPLE: pb.TLS_SIMPLE,
    TlsMode.MUTUAL: pb.TLS_MUTUAL,
    TlsMode.ISTIO_MUTUAL: pb.TLS_ISTIO_MUTUAL,
}
_TLS_NAMES = {v: k for k, v in _TLS.items()}
_PROXY = {ProxyProtocolVersion.V1: pb.PROXY_PROTOCOL_V1, ProxyProtocolVersion.V2: pb.PROXY_PROTOCOL_V2}
_PROXY_NAMES = {v: k for k, v in _PROXY.items()}


# Encoding.


def _duration(seconds: float) -> duration_pb2.Duration:
    nanos = round(seconds * 1_000_000_000)
    return duration_pb2.Duration(seconds=nanos // 1_000_000_000, nanos=nanos % 1_000_000_000)


def _load_balancer(lb: LoadBalancer) -> pb.LoadBalancer:
    out = pb.LoadBalancer(simple=_LB[lb.simple])
    if lb.consistent_hash is not None:
        h = lb.consistent_hash
        out.consistent_hash.CopyFrom(
            pb.ConsistentHash(
                header_name=h.header_name, query_parameter=h.query_parameter, use_source_ip=h.use_source_ip
            )
        )
    if lb.locality is not None:
        out.locality.CopyFrom(_locality(lb.locality))
    return out


def mesh_locality_to_proto(setting: LocalityLbSetting) -> pb.LocalityLbSetting | None:
    """Rule 8: the mesh config's setting, None (an absent field) for Istio's default."""
    return None if setting == MESH_DEFAULT else _locality(setting)


def _locality(setting: LocalityLbSetting) -> pb.LocalityLbSetting:
    return pb.LocalityLbSetting(
        disabled=not setting.enabled,
        distribute=[
            pb.LocalityDistribute(
                source=entry.source, to=[pb.LocalityWeight(locality=n, weight=w) for n, w in entry.to]
            )
            for entry in setting.distribute
        ],
        failover=[pb.LocalityFailover(source=f.source, to=f.to) for f in setting.failover],
        failover_priority=setting.failover_priority,
    )


def _connection_pool(pool: ConnectionPool) -> pb.ConnectionPool:
    out = pb.ConnectionPool(
        max_connections=pool.max_connections,
        http1_max_pending_requests=pool.http1_max_pending_requests,
        http2_max_requests=pool.http2_max_requests,
        max_requests_per_connection=pool.max_requests_per_connection,
        h2_upgrade=_H2[pool.h2_upgrade],
        use_client_protocol=pool.use_client_protocol,
    )
    if pool.connect_timeout is not None:
        out.connect_timeout.CopyFrom(_duration(pool.connect_timeout))
    return out


def _outlier(outlier: OutlierDetection) -> pb.OutlierDetection:
    return pb.OutlierDetection(
        consecutive_5xx=outlier.consecutive_5xx,
        interval=_duration(outlier.interval),
        base_ejection_time=_duration(outlier.base_ejection_time),
        max_ejection_percent=outlier.max_ejection_percent,
    )


def _tls(tls: ClientTls) -> pb.ClientTls:
    return pb.ClientTls(
        mode=_TLS[tls.mode],
        sni=tls.sni,
        insecure_skip_verify=tls.insecure_skip_verify,
        ca_certificates=tls.ca_certificates,
        subject_alt_names=list(tls.subject_alt_names),
        client_certificate=tls.client_certificate,
        private_key=tls.private_key,
        ca_certificates_path=tls.ca_certificates_path,
        client_certificate_path=tls.client_certificate_path,
        private_key_path=tls.private_key_path,
        trust_unresolved=tls.trust_unresolved,
    )


def _traffic_policy(policy: TrafficPolicy) -> pb.TrafficPolicy:
    out = pb.TrafficPolicy()
    if policy.load_balancer is not None:
        out.load_balancer.CopyFrom(_load_balancer(policy.load_balancer))
    if policy.connection_pool is not None:
        out.connection_pool.CopyFrom(_connection_pool(policy.connection_pool))
    if policy.outlier_detection is not None:
        out.outlier_detection.CopyFrom(_outlier(policy.outlier_detection))
    if policy.tls is not None:
        out.tls.CopyFrom(_tls(policy.tls))
    if policy.proxy_protocol is not None:
        out.proxy_protocol = _PROXY[policy.proxy_protocol]
    for entry in policy.port_level:
        port = out.port_level.add(port=entry.port)
        if entry.load_balancer is not None:
            port.load_balancer.CopyFrom(_load_balancer(entry.load_balancer))
        if entry.connection_pool is not None:
            port.connection_pool.CopyFrom(_connection_pool(entry.connection_pool))
        if entry.outlier_detection is not None:
            port.outlier_detection.CopyFrom(_outlier(entry.outlier_detection))
        if entry.tls is not None:
            port.tls.CopyFrom(_tls(entry.tls))
    return out


def destination_policy_to_proto(policy: DestinationPolicy) -> pb.DestinationPolicy:
    out = pb.DestinationPolicy(service_key=policy.service_key, rule=policy.rule)
    if policy.traffic_policy is not None:
        out.traffic_policy.CopyFrom(_traffic_policy(policy.traffic_policy))
    for subset in policy.subsets:
        item = out.subsets.add(name=subset.name, workloads=sorted(subset.workloads))
        if subset.traffic_policy is not None:
            item.traffic_policy.CopyFrom(_traffic_policy(subset.traffic_policy))
    return out


# Decoding.


class DestinationPolicyReader(FieldReader):
    """Judges ``destination_rules`` of one WaypointConfig resource (the module's rules)."""

    def destination_rules(self, messages: list[pb.DestinationPolicy]) -> tuple[DestinationPolicy, ...]:
        if len(messages) > MAX_DESTINATION_RULES:
            raise self.fail("destination_rules", f"more than {MAX_DESTINATION_RULES} rules")
        out = tuple(self.destination_policy(f"destination_rules[{i}]", m) for i, m in enumerate(messages))
        if len({d.service_key for d in out}) != len(out):
            raise self.fail("destination_rules", "a service key is given twice")
        return out

    def destination_policy(self, field: str, message: pb.DestinationPolicy) -> DestinationPolicy:
        if len(message.subsets) > MAX_SUBSETS:
            raise self.fail(f"{field}.subsets", f"more than {MAX_SUBSETS} subsets")
        subsets = tuple(self.subset(f"{field}.subsets[{i}]", s) for i, s in enumerate(message.subsets))
        if len({s.name for s in subsets}) != len(subsets):
            raise self.fail(f"{field}.subsets", "a subset name is given twice")
        return DestinationPolicy(
            service_key=self.text(f"{field}.service_key", message.service_key, required=True),
            rule=self.text(f"{field}.rule", message.rule),
            traffic_policy=self.traffic_policy(f"{field}.traffic_policy", message.traffic_policy)
            if message.HasField("traffic_policy")
            else None,
            subsets=subsets,
        )

    def subset(self, field: str, message: pb.Subset) -> Subset:
        if not _DNS_LABEL.fullmatch(message.name):
            raise self.fail(f"{field}.name", f"not a DNS label: {message.name!r}")
        if len(message.workloads) > MAX_SUBSET_WORKLOADS:
            raise self.fail(f"{field}.workloads", f"more than {MAX_SUBSET_WORKLOADS} workloads")
        uids = []
        for i, uid in enumerate(message.workloads):
            if len(uid) > MAX_UID:
                raise self.fail(f"{field}.workloads[{i}]", f"longer than {MAX_UID} characters")
            uids.append(self.text(f"{field}.workloads[{i}]", uid, required=True))
        return Subset(
            name=message.name,
            workloads=frozenset(uids),
            traffic_policy=self.traffic_policy(f"{field}.traffic_policy", message.traffic_policy)
            if message.HasField("traffic_policy")
            else None,
        )

    def traffic_policy(self, field: str, message: pb.TrafficPolicy) -> TrafficPolicy:
        if len(message.port_level) > MAX_PORT_LEVEL:
            raise self.fail(f"{field}.port_level", f"more than {MAX_PORT_LEVEL} entries")
        port_level = []
        for i, entry in enumerate(message.port_level):
            at = f"{field}.port_level[{i}]"
            if not 1 <= entry.port <= 65535:
                raise self.fail(f"{at}.port", f"out of range 1..65535: {entry.port}")
            port_level.append(
                PortTrafficPolicy(
                    port=entry.port,
                    load_balancer=self.load_balancer(f"{at}.load_balancer", entry.load_balancer)
                    if entry.HasField("load_balancer")
                    else None,
                    connection_pool=self.connection_pool(f"{at}.connection_pool", entry.connection_pool)
                    if entry.HasField("connection_pool")
                    else None,
                    outlier_detection=self.outlier(f"{at}.outlier_detection", entry.outlier_detection)
                    if entry.HasField("outlier_detection")
                    else None,
                    tls=self.tls(f"{at}.tls", entry.tls) if entry.HasField("tls") else None,
                )
            )
        if len({p.port for p in port_level}) != len(port_level):
            raise self.fail(f"{field}.port_level", "a port is given twice")
        proxy = None
        if message.proxy_protocol:
            proxy = self.enum(f"{field}.proxy_protocol", message.proxy_protocol, _PROXY_NAMES)
        return TrafficPolicy(
            load_balancer=self.load_balancer(f"{field}.load_balancer", message.load_balancer)
            if message.HasField("load_balancer")
            else None,
            connection_pool=self.connection_pool(f"{field}.connection_pool", message.connection_pool)
            if message.HasField("connection_pool")
            else None,
            outlier_detection=self.outlier(f"{field}.outlier_detection", message.outlier_detection)
            if message.HasField("outlier_detection")
            else None,
            tls=self.tls(f"{field}.tls", message.tls) if message.HasField("tls") else None,
            proxy_protocol=proxy,
            port_level=tuple(port_level),
        )

    def seconds(self, field: str, value: duration_pb2.Duration, *, positive: bool = False) -> float:
        if value.seconds < 0 or value.nanos < 0 or value.nanos >= 1_000_000_000:
            raise self.fail(field, "must be a non-negative duration")
        seconds = (value.seconds * 1_000_000_000 + value.nanos) / 1_000_000_000
        if positive and seconds <= 0:
            raise self.fail(field, "must be positive")
        return seconds

    def load_balancer(self, field: str, message: pb.LoadBalancer) -> LoadBalancer:
        simple = self.enum(f"{field}.simple", message.simple, _LB_NAMES)
        consistent = None
        if message.HasField("consistent_hash"):
            h = message.consistent_hash
            given = sum((bool(h.header_name), bool(h.query_parameter), h.use_source_ip))
            if given != 1:
                raise self.fail(f"{field}.consistent_hash", "needs exactly one of header, query parameter, source IP")
            if h.header_name and not is_token(h.header_name):
                raise self.fail(f"{field}.consistent_hash.header_name", f"not a header name: {h.header_name!r}")
            consistent = ConsistentHash(
                header_name=h.header_name.lower(),
                query_parameter=self.text(f"{field}.consistent_hash.query_parameter", h.query_parameter),
                use_source_ip=h.use_source_ip,
            )
        locality = self.locality(f"{field}.locality", message.locality) if message.HasField("locality") else None
        return LoadBalancer(simple, consistent, locality)

    def locality(self, field: str, message: pb.LocalityLbSetting) -> LocalityLbSetting:
        """Rule 7: measured before it is walked, then judged as the control plane judged the rule."""
        if len(message.distribute) > MAX_DISTRIBUTE or any(len(d.to) > _MAX_TO for d in message.distribute):
            raise self.fail(f"{field}.distribute", f"more than {MAX_DISTRIBUTE} entries or {_MAX_TO} localities")
        setting = LocalityLbSetting(
            enabled=not message.disabled,
            distribute=tuple(
                LocalityDistribute(d.source, tuple((w.locality, w.weight) for w in d.to)) for d in message.distribute
            ),
            failover=tuple(LocalityFailover(f.source, f.to) for f in message.failover),
            failover_priority=tuple(message.failover_priority),
        )
        problems = setting_problems(setting)
        if problems:
            name, problem = problems[0]
            raise self.fail(f"{field}.{name}", problem)
        return setting

    def mesh_locality(self, field: str, message: pb.LocalityLbSetting, *, present: bool) -> LocalityLbSetting:
        """Rule 8."""
        return self.locality(field, message) if present else MESH_DEFAULT

    def connection_pool(self, field: str, message: pb.ConnectionPool) -> ConnectionPool:
        return ConnectionPool(
            max_connections=message.max_connections,
            connect_timeout=self.seconds(f"{field}.connect_timeout", message.connect_timeout, positive=True)
            if message.HasField("connect_timeout")
            else None,
            http1_max_pending_requests=message.http1_max_pending_requests,
            http2_max_requests=message.http2_max_requests,
            max_requests_per_connection=message.max_requests_per_connection,
            h2_upgrade=self.enum(f"{field}.h2_upgrade", message.h2_upgrade, _H2_NAMES),
            use_client_protocol=message.use_client_protocol,
        )

    def outlier(self, field: str, message: pb.OutlierDetection) -> OutlierDetection:
        if message.max_ejection_percent > 100:
            raise self.fail(f"{field}.max_ejection_percent", f"out of range 0..100: {message.max_ejection_percent}")
        return OutlierDetection(
            consecutive_5xx=message.consecutive_5xx,
            interval=self.seconds(f"{field}.interval", message.interval, positive=True),
            base_ejection_time=self.seconds(f"{field}.base_ejection_time", message.base_ejection_time, positive=True),
            max_ejection_percent=message.max_ejection_percent,
        )

    def dns_name(self, field: str, value: str) -> str:
        if len(value) > 253 or not _DNS_NAME.fullmatch(value):
            raise self.fail(field, f"not a DNS name: {value[:80]!r}")
        return value

    def tls(self, field: str, message: pb.ClientTls) -> ClientTls:
        mode = self.enum(f"{field}.mode", message.mode, _TLS_NAMES)
        if len(message.ca_certificates) > MAX_CA_BYTES:
            raise self.fail(f"{field}.ca_certificates", f"longer than {MAX_CA_BYTES} bytes")
        if message.ca_certificates and "-----BEGIN CERTIFICATE-----" not in message.ca_certificates:
            raise self.fail(f"{field}.ca_certificates", "not PEM certificates")
        if len(message.subject_alt_names) > MAX_SANS:
            raise self.fail(f"{field}.subject_alt_names", f"more than {MAX_SANS} names")
        if len(message.client_certificate) > MAX_CA_BYTES:
            raise self.fail(f"{field}.client_certificate", f"longer than {MAX_CA_BYTES} bytes")
        if message.client_certificate and "-----BEGIN CERTIFICATE-----" not in message.client_certificate:
            raise self.fail(f"{field}.client_certificate", "not a PEM certificate chain")
        if len(message.private_key) > MAX_KEY_BYTES:
            raise self.fail(f"{field}.private_key", f"longer than {MAX_KEY_BYTES} bytes")
        if message.private_key and "PRIVATE KEY-----" not in message.private_key:
            raise self.fail(f"{field}.private_key", "not a PEM private key")  # never quoted: it is a secret
        return ClientTls(
            mode=mode,
            sni=self.dns_name(f"{field}.sni", message.sni) if message.sni else "",
            insecure_skip_verify=message.insecure_skip_verify,
            ca_certificates=message.ca_certificates,
            subject_alt_names=tuple(
                self.dns_name(f"{field}.subject_alt_names[{i}]", n) for i, n in enumerate(message.subject_alt_names)
            ),
            client_certificate=message.client_certificate,
            private_key=message.private_key,
            ca_certificates_path=self.path(f"{field}.ca_certificates_path", message.ca_certificates_path),
            client_certificate_path=self.path(f"{field}.client_certificate_path", message.client_certificate_path),
            private_key_path=self.path(f"{field}.private_key_path", message.private_key_path),
            trust_unresolved=message.trust_unresolved,
        )

    def path(self, field: str, value: str) -> str:
        if value and (len(value) > MAX_PATH or not value.startswith("/") or not value.isprintable()):
            raise self.fail(field, f"not an absolute file path: {value[:80]!r}")
        return value

"""A DestinationRule's ``trafficPolicy`` (top-level, per port, per subset) →
:class:`~ambit.model.destination_policy.TrafficPolicy`, as a waypoint or an ingress gateway applies it: load balancing
(locality settings by :mod:`.locality_lb`), connection pool, outlier detection, client TLS with the ``credentialName``
Secret's material, PROXY protocol. Which rule applies where is :mod:`ambit.controlplane.translate.destinationrules`'s
business.
:class:`TrafficPolicyReader` raises :class:`~ambit.controlplane.translate.shapes.ShapeError` for a bad field (the
rule is then skipped whole) and keeps a note for each setting it drops (the rest is kept).

Rules (numbered with :mod:`ambit.controlplane.translate.destinationrules`'s):

7. Settings a waypoint does not honour are dropped with a note: ``tls.caCrl``, the ``consistentHash`` kinds other
   than header, query parameter and source IP, ``tunnel``. (``localityLbSetting`` is honoured:
   :mod:`.locality_lb` reads it, :mod:`ambit.model.locality_lb` applies it.) TLS material, as istiod hands it to
   a waypoint:
   ``credentialName`` names a Secret of the rule's namespace (of any type the control plane watches:
   :data:`~ambit.controlplane.view.CREDENTIAL_SECRETS`) whose ``ca.crt`` (or ``cacert``) becomes the trust
   anchors and, for ``MUTUAL``, whose ``tls.crt``/``tls.key`` (or ``cert``/``key``) the client certificate and key
   (the file fields are then ignored, with a note); a ``credentialName`` that names no Secret marks the settings
   ``trust_unresolved``: the waypoint refuses the endpoint rather than verify it against its system trust store;
   without it ``caCertificates``, ``clientCertificate`` and
   ``privateKey`` are paths the waypoint reads itself. Anything missing is noted and left empty: the waypoint
   then refuses MUTUAL traffic (503) rather than send it without the certificate asked for. ``ISTIO_MUTUAL`` is
   kept and changes nothing at a waypoint (HBONE already is mutual TLS; istiod builds no context for it either).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ambit.controlplane.translate import shapes
from ambit.controlplane.translate.locality_lb import failover_note, read_locality_lb
from ambit.controlplane.translate.requestauth import parse_duration
from ambit.model.destination_policy import (
    ClientTls,
    ConnectionPool,
    ConsistentHash,
    H2Upgrade,
    LoadBalancer,
    LoadBalancerType,
    OutlierDetection,
    PortTrafficPolicy,
    ProxyProtocolVersion,
    TlsMode,
    TrafficPolicy,
)

__all__ = ["MAX_COUNT", "SecretFinder", "TrafficPolicyReader"]

Obj = Mapping[str, Any]
MAX_COUNT = 2**32 - 1
_LB = {
    "UNSPECIFIED": LoadBalancerType.LEAST_REQUEST,
    "LEAST_CONN": LoadBalancerType.LEAST_REQUEST,
    "LEAST_REQUEST": LoadBalancerType.LEAST_REQUEST,
    "ROUND_ROBIN": LoadBalancerType.ROUND_ROBIN,
    "RANDOM": LoadBalancerType.RANDOM,
    "PASSTHROUGH": LoadBalancerType.PASSTHROUGH,
}
_H2 = {"DEFAULT": H2Upgrade.DEFAULT, "DO_NOT_UPGRADE": H2Upgrade.DO_NOT_UPGRADE, "UPGRADE": H2Upgrade.UPGRADE}
_TLS = {m.value: m for m in TlsMode}
_PROXY = {"V1": ProxyProtocolVersion.V1, "V2": ProxyProtocolVersion.V2}
SecretFinder = Callable[[str, str], Obj | None]
"""``find_secret(namespace, name)``: a Secret object, or None."""


def _count(value: Any, path: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise shapes.ShapeError(path, f"expected a whole number 0..{MAX_COUNT}, got {value!r}")
    return value


def _flag(value: Any, path: str) -> bool:
    if value is not None and not isinstance(value, bool):
        raise shapes.ShapeError(path, f"expected true or false, got {value!r}")
    return bool(value)


def _seconds(value: Any, path: str) -> float | None:
    if value is None:
        return None
    seconds = parse_duration(value) if isinstance(value, str) else None
    if seconds is None or seconds <= 0:
        raise shapes.ShapeError(path, f"expected a positive duration such as 1s or 500ms, got {value!r}")
    return seconds


def _choice(value: Any, path: str, table: Mapping[str, Any], default: Any) -> Any:
    if value is None:
        return default
    if not isinstance(value, str) or value not in table:
        raise shapes.ShapeError(path, f"expected one of {', '.join(table)}, got {value!r}")
    return table[value]


_TLS_FILES = ("caCertificates", "clientCertificate", "privateKey")


@dataclass(frozen=True, slots=True)
class _Material:
    """What a ``credentialName`` Secret gave (rule 7)."""

    ca: str = ""
    certificate: str = ""
    key: str = field(default="", repr=False)
    unresolved: bool = False
    """The Secret does not exist: the proxy must refuse, not fall back to its system trust store."""


class TrafficPolicyReader:
    """Reads one rule's traffic policies; notes what it drops (rule 7)."""

    def __init__(self, namespace: str, find_secret: SecretFinder) -> None:
        self.namespace = namespace
        self.find_secret = find_secret
        self.notes: list[tuple[str, str]] = []

    def load_balancer(self, value: Any, path: str) -> LoadBalancer | None:
        if value is None:
            return None
        spec = shapes.mapping(value, path)
        simple = _choice(spec.get("simple"), f"{path}.simple", _LB, LoadBalancerType.LEAST_REQUEST)
        consistent = None
        if spec.get("consistentHash") is not None:
            at = f"{path}.consistentHash"
            hashed = shapes.mapping(spec.get("consistentHash"), at)
            header = shapes.text(hashed.get("httpHeaderName"), f"{at}.httpHeaderName")
            query = shapes.text(hashed.get("httpQueryParameterName"), f"{at}.httpQueryParameterName")
            source_ip = hashed.get("useSourceIp") is True
            if sum((bool(header), bool(query), source_ip)) == 1:
                consistent = ConsistentHash(header.lower(), query, source_ip)
            else:
                self.notes.append((at, "only httpHeaderName, httpQueryParameterName or useSourceIp is honoured"))
        locality = None
        if spec.get("localityLbSetting") is not None:
            locality, notes = read_locality_lb(spec.get("localityLbSetting"), f"{path}.localityLbSetting")
            self.notes.extend(notes)
        return LoadBalancer(simple, consistent, locality)

    def note_failover(self, policy: TrafficPolicy | PortTrafficPolicy, path: str) -> None:
        """istiod's warning for failover without outlier detection in the same policy."""
        locality = policy.load_balancer.locality if policy.load_balancer is not None else None
        self.notes.extend(failover_note(locality, policy.outlier_detection, f"{path}.loadBalancer.localityLbSetting"))

    def connection_pool(self, value: Any, path: str) -> ConnectionPool | None:
        if value is None:
            return None
        spec = shapes.mapping(value, path)
        tcp = shapes.mapping(spec.get("tcp"), f"{path}.tcp")
        http = shapes.mapping(spec.get("http"), f"{path}.http")
        return ConnectionPool(
            max_connections=_count(tcp.get("maxConnections"), f"{path}.tcp.maxConnections"),
            connect_timeout=_seconds(tcp.get("connectTimeout"), f"{path}.tcp.connectTimeout"),
            http1_max_pending_requests=_count(
                http.get("http1MaxPendingRequests"), f"{path}.http.http1MaxPendingRequests"
            ),
            http2_max_requests=_count(http.get("http2MaxRequests"), f"{path}.http.http2MaxRequests"),
            max_requests_per_connection=_count(
                http.get("maxRequestsPerConnection"), f"{path}.http.maxRequestsPerConnection"
            ),
            h2_upgrade=_choice(http.get("h2UpgradePolicy"), f"{path}.http.h2UpgradePolicy", _H2, H2Upgrade.DEFAULT),
            use_client_protocol=_flag(http.get("useClientProtocol"), f"{path}.http.useClientProtocol"),
        )

    def outlier(self, value: Any, path: str) -> OutlierDetection | None:
        if value is None:
            return None
        spec = shapes.mapping(value, path)
        errors = spec.get("consecutive5xxErrors", spec.get("consecutiveErrors"))
        percent = (
            _count(spec.get("maxEjectionPercent"), f"{path}.maxEjectionPercent")
            if (spec.get("maxEjectionPercent") is not None)
            else 10
        )
        if percent > 100:
            raise shapes.ShapeError(f"{path}.maxEjectionPercent", f"expected 0..100, got {percent}")
        return OutlierDetection(
            consecutive_5xx=_count(errors, f"{path}.consecutive5xxErrors") if errors is not None else 5,
            interval=_seconds(spec.get("interval"), f"{path}.interval") or 10.0,
            base_ejection_time=_seconds(spec.get("baseEjectionTime"), f"{path}.baseEjectionTime") or 30.0,
            max_ejection_percent=percent,
        )

    def tls(self, value: Any, path: str) -> ClientTls | None:
        if value is None:
            return None
        spec = shapes.mapping(value, path)
        mode = _choice(spec.get("mode"), f"{path}.mode", _TLS, TlsMode.DISABLE)
        if spec.get("caCrl"):
            self.notes.append((f"{path}.caCrl", "not honoured at a waypoint"))
        files = {name: shapes.text(spec.get(name), f"{path}.{name}") for name in _TLS_FILES}
        credential = shapes.text(spec.get("credentialName"), f"{path}.credentialName")
        material = _Material()
        if credential:
            for name in (n for n, given in files.items() if given):
                self.notes.append((f"{path}.{name}", "credentialName is set: the file is not read"))
            files = dict.fromkeys(files, "")
            material = self._from_secret(credential, f"{path}.credentialName", mutual=mode is TlsMode.MUTUAL)
        elif mode is TlsMode.MUTUAL and not (files["clientCertificate"] and files["privateKey"]):
            self.notes.append((path, "MUTUAL needs credentialName, or clientCertificate and privateKey"))
        skip = spec.get("insecureSkipVerify")
        if skip is not None and not isinstance(skip, bool):
            raise shapes.ShapeError(f"{path}.insecureSkipVerify", f"expected true or false, got {skip!r}")
        return ClientTls(
            mode=mode,
            sni=shapes.text(spec.get("sni"), f"{path}.sni"),
            insecure_skip_verify=bool(skip),
            ca_certificates=material.ca,
            subject_alt_names=tuple(shapes.strings(spec.get("subjectAltNames"), f"{path}.subjectAltNames")),
            client_certificate=material.certificate,
            private_key=material.key,
            ca_certificates_path=files["caCertificates"],
            client_certificate_path=files["clientCertificate"],
            private_key_path=files["privateKey"],
            trust_unresolved=material.unresolved,
        )

    def _from_secret(self, name: str, path: str, *, mutual: bool) -> _Material:
        """Rule 7: ``ca.crt`` (or ``cacert``), and for MUTUAL ``tls.crt``/``tls.key`` (or ``cert``/``key``)."""
        secret = self.find_secret(self.namespace, name)
        data = (secret or {}).get("data") if isinstance(secret, Mapping) else None
        if not isinstance(data, Mapping):
            self.notes.append((path, f"Secret {self.namespace}/{name} not found"))
            return _Material(unresolved=True)
        ca = self._secret_pem(data, ("ca.crt", "cacert"), name, path, "-----BEGIN CERTIFICATE-----")
        if not mutual:
            if ca is None:
                self.notes.append((path, f"Secret {self.namespace}/{name} with a ca.crt not found"))
            return _Material(ca or "")
        certificate = self._secret_pem(data, ("tls.crt", "cert"), name, path, "-----BEGIN CERTIFICATE-----")
        key = self._secret_pem(data, ("tls.key", "key"), name, path, "PRIVATE KEY-----")
        if certificate is None or key is None:
            self.notes.append((path, f"Secret {self.namespace}/{name}: MUTUAL needs tls.crt and tls.key"))
            return _Material(ca or "")
        return _Material(ca or "", certificate, key)

    def _secret_pem(
        self, data: Mapping[str, Any], keys: tuple[str, str], name: str, path: str, marker: str
    ) -> str | None:
        """The first of ``keys`` the Secret has, decoded; None when absent or not PEM (noted; never quoted)."""
        raw = next((data[k] for k in keys if k in data), None)
        if raw is None:
            return None
        try:
            text = base64.b64decode(raw, validate=True).decode("ascii") if isinstance(raw, str) else ""
        except (binascii.Error, UnicodeDecodeError):
            text = ""
        if marker not in text:
            self.notes.append((path, f"Secret {self.namespace}/{name}: {keys[0]} is not base64 PEM"))
            return None
        return text

    def port_level(self, value: Any, path: str) -> tuple[PortTrafficPolicy, ...]:
        out: dict[int, PortTrafficPolicy] = {}
        for i, item in enumerate(shapes.list_of(value, path)):
            at = f"{path}[{i}]"
            spec = shapes.mapping(item, at, required=True)
            number = shapes.mapping(spec.get("port"), f"{at}.port", required=True).get("number")
            if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= 65535:
                raise shapes.ShapeError(f"{at}.port.number", f"expected a port 1..65535, got {number!r}")
            entry = PortTrafficPolicy(
                number,
                self.load_balancer(spec.get("loadBalancer"), f"{at}.loadBalancer"),
                self.connection_pool(spec.get("connectionPool"), f"{at}.connectionPool"),
                self.outlier(spec.get("outlierDetection"), f"{at}.outlierDetection"),
                self.tls(spec.get("tls"), f"{at}.tls"),
            )
            self.note_failover(entry, at)
            out.setdefault(number, entry)
        return tuple(out.values())

    def traffic_policy(self, value: Any, path: str) -> TrafficPolicy | None:
        if value is None:
            return None
        spec = shapes.mapping(value, path)
        if spec.get("tunnel") is not None:
            self.notes.append((f"{path}.tunnel", "not honoured at a waypoint"))
        proxy = None
        if spec.get("proxyProtocol") is not None:
            at = f"{path}.proxyProtocol"
            proxy = _choice(shapes.mapping(spec.get("proxyProtocol"), at).get("version"), f"{at}.version", _PROXY, None)
            proxy = proxy or ProxyProtocolVersion.V1
        policy = TrafficPolicy(
            load_balancer=self.load_balancer(spec.get("loadBalancer"), f"{path}.loadBalancer"),
            connection_pool=self.connection_pool(spec.get("connectionPool"), f"{path}.connectionPool"),
            outlier_detection=self.outlier(spec.get("outlierDetection"), f"{path}.outlierDetection"),
            tls=self.tls(spec.get("tls"), f"{path}.tls"),
            proxy_protocol=proxy,
            port_level=self.port_level(spec.get("portLevelSettings"), f"{path}.portLevelSettings"),
        )
        self.note_failover(policy, path)
        return policy

"""Model gateway configurations ↔ the ``ambit.gateway.v1.GatewayConfig`` resource (``proto/gateway.proto``).

Theory of operation: :func:`gateway_config_to_proto` encodes a :class:`~ambit.model.ingress.GatewayConfig` field
for field (the control plane's side); route rules are encoded and judged exactly as a waypoint's
(:mod:`ambit.xds.routes`). :func:`decode_gateway_config` is where a gateway judges what it was sent: the first
problem raises :class:`XdsConversionError` naming the resource and the field, so that the client NACKs it and
keeps serving what it had.

Rules:

1. The resource name is the body's ``gateway`` (``namespace/name``); a resource whose name disagrees is refused.
2. A listener has a name, a port 1..65535 and a known protocol; a listener terminating TLS (HTTPS,
   TLS_TERMINATE) has at least one certificate, each with a non-empty chain and key (whether they load is the TLS
   layer's judgement, when the gateway builds its contexts), except an ``ISTIO_MUTUAL`` one, which has none (it
   serves the gateway's own); other listeners have none. HTTP rules belong to HTTP and HTTPS listeners, TCP
   backends to TLS, TCP and TLS_TERMINATE listeners; a listener with the other kind is refused. Client
   verification (``tls``) belongs to listeners terminating TLS: a known mode, a CA for ``MUTUAL`` and
   ``OPTIONAL_MUTUAL`` and none otherwise, 32-byte digests, versions 0, ``0x0303`` or ``0x0304`` (the lowest not
   above the highest), cipher suites named with letters, digits, ``-`` and ``_``; a listener of another protocol
   with it, or ``https_redirect`` on a virtual host of a non-HTTP listener, is refused.
3. A virtual host's hostname is ``*``, a name, or ``*.`` and a name, without whitespace.
4. Policies, RequestAuthentications, destination rules, the mesh's ``localityLbSetting`` and EnvoyFilter patches
   are judged as a waypoint's
   (:mod:`ambit.xds.waypoint_policies`, :mod:`ambit.xds.requestauth`, :mod:`ambit.xds.destinationrules`,
   :mod:`ambit.xds.envoy_patches`).
5. Nothing but :class:`XdsConversionError` escapes decoding.
6. ``forward_client_cert`` is one of the enum's values; unspecified is ``SANITIZE_SET`` (Istio's gateway default), a
   number the enum does not name is refused.
"""

from __future__ import annotations

import re

from google.protobuf import any_pb2
from google.protobuf.message import DecodeError

from ambit.api import gateway_pb2 as pb
from ambit.model.ingress import (
    ForwardClientCert,
    GatewayConfig,
    IngressCertificate,
    IngressListener,
    ListenerProtocol,
    ListenerTls,
    TlsMode,
    VirtualHost,
)
from ambit.xds.authorization import PolicyReader
from ambit.xds.destinationrules import DestinationPolicyReader, destination_policy_to_proto, mesh_locality_to_proto
from ambit.xds.envoy_patches import EnvoyPatchesReader, envoy_patches_to_proto
from ambit.xds.errors import XdsConversionError
from ambit.xds.requestauth import RequestAuthReader, request_authentication_to_proto
from ambit.xds.route_encoding import rule_to_proto, weighted_to_proto
from ambit.xds.route_reader import RouteReader
from ambit.xds.waypoint_policies import waypoint_policy_from_proto, waypoint_policy_to_proto

__all__ = ["GATEWAY_CONFIG_TYPE_URL", "decode_gateway_config", "gateway_config_to_proto", "pack_gateway_config"]

GATEWAY_CONFIG_TYPE_URL = "type.googleapis.com/ambit.gateway.v1.GatewayConfig"
_PROTOCOLS = {
    ListenerProtocol.HTTP: pb.HTTP,
    ListenerProtocol.HTTPS: pb.HTTPS,
    ListenerProtocol.TLS: pb.TLS,
    ListenerProtocol.TCP: pb.TCP,
    ListenerProtocol.TLS_TERMINATE: pb.TLS_TERMINATE,
}
_PROTOCOL_NAMES = {v: k for k, v in _PROTOCOLS.items()}
_TLS_MODES = {
    TlsMode.SIMPLE: pb.SIMPLE,
    TlsMode.MUTUAL: pb.MUTUAL,
    TlsMode.ISTIO_MUTUAL: pb.ISTIO_MUTUAL,
    TlsMode.OPTIONAL_MUTUAL: pb.OPTIONAL_MUTUAL,
}
_TLS_MODE_NAMES = {v: k for k, v in _TLS_MODES.items()}
_FORWARD_CLIENT_CERT = {
    ForwardClientCert.SANITIZE: pb.SANITIZE,
    ForwardClientCert.FORWARD_ONLY: pb.FORWARD_ONLY,
    ForwardClientCert.APPEND_FORWARD: pb.APPEND_FORWARD,
    ForwardClientCert.SANITIZE_SET: pb.SANITIZE_SET,
    ForwardClientCert.ALWAYS_FORWARD_ONLY: pb.ALWAYS_FORWARD_ONLY,
}
_FORWARD_CLIENT_CERT_NAMES = {v: k for k, v in _FORWARD_CLIENT_CERT.items()}
_FORWARD_CLIENT_CERT_NAMES[pb.FORWARD_CLIENT_CERT_UNSPECIFIED] = ForwardClientCert.SANITIZE_SET
_TLS_VERSIONS = frozenset({0, 0x0303, 0x0304})
_CIPHER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_HOSTNAME = re.compile(r"\*|(\*\.)?[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?")


def gateway_config_to_proto(config: GatewayConfig) -> pb.GatewayConfig:
    return pb.GatewayConfig(
        gateway=config.gateway,
        listeners=[
            pb.Listener(
                name=item.name,
                port=item.port,
                protocol=_PROTOCOLS[item.protocol],
                hostname=item.hostname,
                certificates=[pb.Certificate(cert_pem=c.cert_pem, key_pem=c.key_pem) for c in item.certificates],
                virtual_hosts=[
                    pb.VirtualHost(
                        hostname=v.hostname,
                        http=[rule_to_proto(r) for r in v.http],
                        tcp_backends=[weighted_to_proto(b) for b in v.tcp_backends],
                        https_redirect=v.https_redirect,
                    )
                    for v in item.virtual_hosts
                ],
                tls=_tls_to_proto(item.tls),
            )
            for item in config.listeners
        ],
        policies=[waypoint_policy_to_proto(p) for p in config.policies],
        request_authentications=[request_authentication_to_proto(p) for p in config.request_authentications],
        envoy_patches=envoy_patches_to_proto(config.envoy_patches) if config.envoy_patches else None,
        destination_rules=[destination_policy_to_proto(d) for d in config.destination_rules],
        forward_client_cert=_FORWARD_CLIENT_CERT[config.forward_client_cert],
        mesh_locality_lb=mesh_locality_to_proto(config.mesh_locality),
    )


def _tls_to_proto(tls: ListenerTls) -> pb.ListenerTls | None:
    if tls == ListenerTls():
        return None
    return pb.ListenerTls(
        mode=_TLS_MODES[tls.mode],
        ca_pem=tls.ca_pem,
        subject_alt_names=list(tls.subject_alt_names),
        spki_sha256=list(tls.spki_sha256),
        cert_sha256=list(tls.cert_sha256),
        min_version=tls.min_version,
        max_version=tls.max_version,
        cipher_suites=list(tls.cipher_suites),
    )


def _tls(reader: RouteReader, field: str, message: pb.ListenerTls) -> ListenerTls:
    mode = _TLS_MODE_NAMES.get(message.mode)
    if mode is None:
        raise reader.fail(f"{field}.mode", f"unknown TLS mode {message.mode}")
    if mode.takes_ca and not message.ca_pem:
        raise reader.fail(f"{field}.ca_pem", f"a {mode.value} listener needs the CA its clients chain to")
    if not mode.takes_ca and message.ca_pem:
        raise reader.fail(f"{field}.ca_pem", f"a {mode.value} listener takes no CA")
    for key in ("spki_sha256", "cert_sha256"):
        for i, digest in enumerate(getattr(message, key)):
            if len(digest) != 32:
                raise reader.fail(f"{field}.{key}[{i}]", f"a SHA-256 digest is 32 bytes, not {len(digest)}")
    for key in ("min_version", "max_version"):
        if getattr(message, key) not in _TLS_VERSIONS:
            raise reader.fail(f"{field}.{key}", f"expected 0, 0x0303 or 0x0304, got {getattr(message, key):#x}")
    if message.min_version and message.max_version and message.min_version > message.max_version:
        raise reader.fail(f"{field}.min_version", "the lowest version is above the highest")
    for i, suite in enumerate(message.cipher_suites):
        if not _CIPHER_NAME.fullmatch(suite):
            raise reader.fail(f"{field}.cipher_suites[{i}]", f"not a cipher suite name: {suite!r}")
    names = tuple(
        reader.text(f"{field}.subject_alt_names[{i}]", n, required=True)
        for i, n in enumerate(message.subject_alt_names)
    )
    return ListenerTls(
        mode,
        bytes(message.ca_pem),
        names,
        tuple(bytes(d) for d in message.spki_sha256),
        tuple(bytes(d) for d in message.cert_sha256),
        message.min_version,
        message.max_version,
        tuple(message.cipher_suites),
    )


def pack_gateway_config(message: pb.GatewayConfig) -> any_pb2.Any:
    return any_pb2.Any(type_url=GATEWAY_CONFIG_TYPE_URL, value=message.SerializeToString(deterministic=True))


def _listener(reader: RouteReader, field: str, message: pb.Listener) -> IngressListener:
    name = reader.text(f"{field}.name", message.name, required=True)
    port = reader.port(f"{field}.port", message.port)
    protocol = _PROTOCOL_NAMES.get(message.protocol)
    if protocol is None:
        raise reader.fail(f"{field}.protocol", f"unknown protocol {message.protocol}")
    certificates = []
    for i, cert in enumerate(message.certificates):
        if not cert.cert_pem or not cert.key_pem:
            raise reader.fail(f"{field}.certificates[{i}]", "a certificate needs a chain and a key")
        certificates.append(IngressCertificate(cert.cert_pem, cert.key_pem))
    tls = _tls(reader, f"{field}.tls", message.tls) if message.HasField("tls") else ListenerTls()
    if tls != ListenerTls() and not protocol.terminates_tls:
        raise reader.fail(f"{field}.tls", f"a {protocol.value} listener takes no client verification")
    if certificates and not protocol.terminates_tls:
        raise reader.fail(f"{field}.certificates", f"a {protocol.value} listener takes no certificates")
    if tls.mode is TlsMode.ISTIO_MUTUAL and certificates:
        raise reader.fail(f"{field}.certificates", "an ISTIO_MUTUAL listener serves the gateway's own certificate")
    if protocol.terminates_tls and not certificates and tls.mode is not TlsMode.ISTIO_MUTUAL:
        raise reader.fail(f"{field}.certificates", f"an {protocol.value} listener needs a certificate")
    hosts = []
    for i, vhost in enumerate(message.virtual_hosts):
        if not _HOSTNAME.fullmatch(vhost.hostname):
            raise reader.fail(f"{field}.virtual_hosts[{i}].hostname", f"not a hostname: {vhost.hostname!r}")
        where = f"{field}.virtual_hosts[{i}]"
        rules = tuple(reader.rule(f"{where}.http[{j}]", r) for j, r in enumerate(vhost.http))
        backends = tuple(reader.weighted(f"{where}.tcp_backends[{j}]", b) for j, b in enumerate(vhost.tcp_backends))
        if rules and not protocol.carries_http:
            raise reader.fail(f"{where}.http", f"a {protocol.value} listener takes no HTTP rules")
        if backends and protocol.carries_http:
            raise reader.fail(f"{where}.tcp_backends", f"an {protocol.value} listener takes no TCP backends")
        if vhost.https_redirect and protocol is not ListenerProtocol.HTTP:
            raise reader.fail(f"{where}.https_redirect", f"a {protocol.value} listener does not redirect to HTTPS")
        hosts.append(VirtualHost(vhost.hostname.lower(), rules, backends, vhost.https_redirect))
    hostname = message.hostname.lower()
    if hostname and not _HOSTNAME.fullmatch(hostname):
        raise reader.fail(f"{field}.hostname", f"not a hostname: {hostname!r}")
    return IngressListener(name, port, protocol, hostname, tuple(certificates), tuple(hosts), tls)


def gateway_config_from_proto(message: pb.GatewayConfig, name: str) -> GatewayConfig:
    """Judge and convert a GatewayConfig received as resource ``name`` (rules 1-5)."""
    reader = RouteReader(name)
    if message.gateway != name:
        raise reader.fail("gateway", f"the resource is named {name!r} but describes {message.gateway!r}")
    try:
        listeners = tuple(_listener(reader, f"listeners[{i}]", item) for i, item in enumerate(message.listeners))
        policies = tuple(
            waypoint_policy_from_proto(PolicyReader(name), f"policies[{i}]", p) for i, p in enumerate(message.policies)
        )
        authn = RequestAuthReader(name)
        request_authentications = tuple(
            authn.request_authentication(f"request_authentications[{i}]", p)
            for i, p in enumerate(message.request_authentications)
        )
        rules = DestinationPolicyReader(name)
        destination_rules = rules.destination_rules(list(message.destination_rules))
        mesh_locality = rules.mesh_locality(
            "mesh_locality_lb", message.mesh_locality_lb, present=message.HasField("mesh_locality_lb")
        )
        envoy_patches = EnvoyPatchesReader(name).patches("envoy_patches", message.envoy_patches)
        forward_client_cert = _FORWARD_CLIENT_CERT_NAMES.get(message.forward_client_cert)
        if forward_client_cert is None:
            raise reader.fail("forward_client_cert", f"unknown mode {message.forward_client_cert}")
    except XdsConversionError:
        raise
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise reader.fail("(message)", f"cannot be read: {exc}") from None
    return GatewayConfig(
        message.gateway,
        listeners,
        policies,
        request_authentications,
        destination_rules,
        envoy_patches,
        forward_client_cert,
        mesh_locality,
    )


def decode_gateway_config(name: str, body: any_pb2.Any) -> GatewayConfig:
    """Unpack and convert one xDS resource body of type :data:`GATEWAY_CONFIG_TYPE_URL`."""
    if body.type_url != GATEWAY_CONFIG_TYPE_URL:
        raise XdsConversionError(
            name, "resource.type_url", f"expected {GATEWAY_CONFIG_TYPE_URL}, got {body.type_url!r}"
        )
    message = pb.GatewayConfig()
    try:
        message.ParseFromString(body.value)
    except (DecodeError, ValueError, RecursionError) as exc:
        raise XdsConversionError(name, "resource.value", f"not a valid GatewayConfig message: {exc}") from None
    return gateway_config_from_proto(message, name)

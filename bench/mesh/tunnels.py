"""The C baselines: a client-side and a server-side mutual-TLS tunnel (stunnel, haproxy) between two pods.

Each tunnel pair carries every application port of the server pod: the client-side proxy listens on 127.0.0.1 of
the client pod at ``app port + local offset`` and connects to the server pod at ``app port + TLS offset``, where the
server-side proxy verifies the client certificate and forwards to 127.0.0.1 at the application port. Both sides
use ECDSA P-256 keys signed by one throw-away CA and verify the peer's chain, as the mesh's mutual TLS does; the
TLS version and cipher are OpenSSL's defaults (TLS 1.3), as they are for the node proxy.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

APP_PORTS = {"iperf3": 5201, "sockperf": 11111, "echo": 9000}


@dataclass(frozen=True, slots=True)
class TunnelKind:
    name: str
    local_offset: int
    tls_offset: int

    def local_port(self, app: str, app_ports: Mapping[str, int] = APP_PORTS) -> int:
        return app_ports[app] + self.local_offset

    def tls_port(self, app: str, app_ports: Mapping[str, int] = APP_PORTS) -> int:
        return app_ports[app] + self.tls_offset


STUNNEL = TunnelKind("stunnel", 10000, 20000)
HAPROXY = TunnelKind("haproxy-tls", 12000, 22000)


@dataclass(frozen=True, slots=True)
class Credentials:
    ca: Path
    server_pem: Path
    """Certificate then key, as haproxy wants them; stunnel reads the same file."""
    client_pem: Path


def make_credentials(directory: Path) -> Credentials:
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ambit bench CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    (directory / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))

    def leaf(name: str) -> Path:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        path = directory / f"{name}.pem"
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM) + key_pem)
        path.chmod(0o600)
        return path

    return Credentials(directory / "ca.crt", leaf("server"), leaf("client"))


def stunnel_config(
    creds: Credentials,
    *,
    client: bool,
    server_ip: str,
    resume: bool = True,
    app_ports: Mapping[str, int] = APP_PORTS,
) -> str:
    """One stunnel process's configuration: a service per application port.

    ``resume=False``: the client side never offers a session (``sessionResume = no``), and the server side neither
    issues tickets nor keeps a session cache: ``sessionResume = no`` in a server service sends no TLS 1.3 ticket
    at all and turns OpenSSL's session cache off. ``options = NO_TICKET`` alone is not enough: OpenSSL then sends
    stateful TLS 1.3 tickets, which stunnel's own cache resumes (10 of 19 offers on loopback, even with
    ``sessionCacheSize = 1`` and ``sessionCacheTimeout = 0``); it is kept for clarity.
    """
    pem = creds.client_pem if client else creds.server_pem
    lines = [
        "foreground = yes",
        "pid =",
        "debug = 3",
        "syslog = no",
        "socket = l:TCP_NODELAY=1",
        "socket = r:TCP_NODELAY=1",
    ]
    for app, port in app_ports.items():
        lines += [f"[{app}]", f"cert = {pem}", f"CAfile = {creds.ca}", "verifyChain = yes"]
        if client:
            lines += ["client = yes", f"accept = 127.0.0.1:{STUNNEL.local_port(app, app_ports)}"]
            lines += [f"connect = {server_ip}:{STUNNEL.tls_port(app, app_ports)}"]
            if not resume:
                lines += ["sessionResume = no"]
        else:
            lines += [f"accept = {server_ip}:{STUNNEL.tls_port(app, app_ports)}", f"connect = 127.0.0.1:{port}"]
            if not resume:
                lines += ["sessionResume = no", "options = NO_TICKET"]
    return "\n".join(lines) + "\n"


def haproxy_config(
    creds: Credentials,
    *,
    client: bool,
    server_ip: str,
    resume: bool = True,
    app_ports: Mapping[str, int] = APP_PORTS,
) -> str:
    """One haproxy process's configuration (TCP mode): a frontend and backend per application port.

    ``resume=False``: the client side's server lines never reuse a session (``no-ssl-reuse``), and the server
    side neither issues tickets (``no-tls-tickets``) nor keeps a session cache (``tune.ssl.cachesize 0``).
    """
    lines = ["global", "  maxconn 9000"]
    if not resume and not client:
        lines += ["  tune.ssl.cachesize 0"]
    lines += [
        "defaults",
        "  mode tcp",
        "  timeout connect 5s",
        "  timeout client 1h",
        "  timeout server 1h",
    ]
    for app, port in app_ports.items():
        if client:
            bind = f"127.0.0.1:{HAPROXY.local_port(app, app_ports)}"
            server = (
                f"{server_ip}:{HAPROXY.tls_port(app, app_ports)} ssl crt {creds.client_pem} ca-file {creds.ca} "
                "verify required"
            )
            if not resume:
                server += " no-ssl-reuse"
        else:
            bind = (
                f"{server_ip}:{HAPROXY.tls_port(app, app_ports)} ssl crt {creds.server_pem} ca-file {creds.ca} "
                "verify required"
            )
            if not resume:
                bind += " no-tls-tickets"
            server = f"127.0.0.1:{port}"
        lines += [f"frontend f_{app}", f"  bind {bind}", f"  default_backend b_{app}"]
        lines += [f"backend b_{app}", f"  server s {server}"]
    return "\n".join(lines) + "\n"

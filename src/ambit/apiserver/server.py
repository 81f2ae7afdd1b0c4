"""Assembly of the embedded API server: state directory, PKI, kubeconfig, and the HTTPS listener.

The listener (:class:`~ambit.tls.listener.TlsListener`) owns every connection it accepts: ``aclose()`` stops
accepting, lets aiohttp finish or close each request and keep-alive connection, and aborts whatever is still open
a second later (a client that never answers TLS close_notify), so nothing outlives the server.

The data directory holds everything the server needs to come back after a restart or a crash (the directory
0700 and state.db 0600 whatever the umask)::

    DIR/state.db            objects and the event log (SQLite, WAL)
    DIR/pki/ca.{crt,key}    the server's CA (kubeconfig trusts it)
    DIR/pki/sa.key          the service-account token signing key
    DIR/admin.token         the admin bearer token written into the kubeconfig
    DIR/kubeconfig          an admin kubeconfig that kubectl uses unchanged
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import os
import secrets
import socket
import ssl
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from ambit.apiserver.admission import AdmissionController
from ambit.apiserver.http import ApiHttp, HttpSettings
from ambit.apiserver.kubernetes_service import (
    SERVICE_FIELDS,
    SLICE_FIELDS,
    advertised_address,
    kubernetes_endpoint_slice,
    kubernetes_service,
)
from ambit.apiserver.limits import LimitSettings
from ambit.apiserver.pod_security import PodSecuritySettings
from ambit.apiserver.registry import Registry, enabled_builtins
from ambit.apiserver.service_resolver import StoreServiceResolver
from ambit.apiserver.store import LOG_BYTES, Store
from ambit.apiserver.token_binding import DEFAULT_MAX_TOKEN_EXPIRATION
from ambit.apiserver.token_file import load_token_file
from ambit.apiserver.tokens import TokenIssuer
from ambit.apiserver.verbs import ResourceManager
from ambit.apiserver.watch import WatchHub
from ambit.model import untrusted_yaml
from ambit.telemetry import unparsed_requests
from ambit.tls.certs import issue_server_cert, load_or_create_ca
from ambit.tls.listener import TlsListener

DEFAULT_CRD_DIR = Path(__file__).resolve().parents[3] / "deploy" / "crds"
DEFAULT_RBAC_DIR = Path(__file__).resolve().parents[3] / "deploy" / "rbac"


@dataclass(frozen=True, slots=True)
class ApiServerSettings:
    """How to run one embedded API server."""

    data_dir: Path
    """Where state, PKI and the kubeconfig live (created if missing)."""
    host: str = "127.0.0.1"
    """Address to listen on."""
    port: int = 6443
    """Port to listen on; 0 picks a free one."""
    kubeconfig: Path | None = None
    """Where to write the admin kubeconfig; default ``data_dir/kubeconfig``."""
    extra_sans: tuple[str, ...] = ()
    """More DNS names or IPs the serving certificate covers (the lab adds the bridge address)."""
    crd_dir: Path | None = DEFAULT_CRD_DIR
    """CRDs installed at start (``deploy/crds``); None installs none."""
    rbac_dir: Path | None = DEFAULT_RBAC_DIR
    """The components' ClusterRoles and bindings installed at start (``deploy/rbac``), besides kube's defaults."""
    token_auth_file: Path | None = None
    """Static tokens (kube's ``--token-auth-file`` CSV, mode 0600): the lab's nodes and controllers."""
    service_cidr: str = "198.19.0.0/16"
    """Where Service cluster IPs come from."""
    api_audiences: tuple[str, ...] = ()
    """The audiences a token must carry for this server to accept it (kube's ``--api-audiences``); empty: the
    service-account issuer alone, as kube defaults it."""
    advertise_address: str = ""
    """The address pods reach this server at (kube's ``--advertise-address``), listed in ``default/kubernetes``'s
    EndpointSlice; empty: ``host`` when that is one specific non-loopback IP
    (:mod:`ambit.apiserver.kubernetes_service`)."""
    max_token_expiration: int = DEFAULT_MAX_TOKEN_EXPIRATION
    """Longest TokenRequest lifetime granted, in seconds (``--service-account-max-token-expiration``); 0: none."""
    log_capacity: int = 50_000
    """How many recent events watches can resume from."""
    log_bytes: int = LOG_BYTES
    """Bound on the encoded objects those events keep in memory; the oldest go first."""
    bookmark_interval: float = 60.0
    """Seconds between watch bookmarks, for clients that ask for them."""
    runtime_config: frozenset[tuple[str, str]] = frozenset()
    """Built-in (group, version) pairs not served (kube's ``--runtime-config GROUP/VERSION=false``; see
    :func:`ambit.apiserver.registry.runtime_config`)."""
    limits: LimitSettings = field(default_factory=LimitSettings)
    """What one user may ask: requests per second, open watches, how long a watch may stall (admins exempt)."""
    pod_security: PodSecuritySettings = field(default_factory=PodSecuritySettings)
    kubelet_socket_dir: Path | None = None
    """Where nodes' kubelets listen (``DIR/<node>/kubelet.sock``) for pods/log, exec, portforward; None: those
    answer kube's error for an unreachable kubelet (:mod:`ambit.apiserver.pod_streams`)."""
    """Pod Security Admission: the defaults for unlabelled namespaces (enforce baseline) and the exemptions."""


@dataclass
class ApiServer:
    """One running server: ``await start()``, then ``url``, ``kubeconfig`` and ``admin_token`` are known."""

    settings: ApiServerSettings
    url: str = ""
    kubeconfig: Path = field(default_factory=Path)
    admin_token: str = ""
    manager: ResourceManager | None = None
    _runner: web.AppRunner | None = None
    _http: ApiHttp | None = None
    _listener: TlsListener | None = None

    async def start(self) -> None:
        s = self.settings
        s.data_dir.mkdir(parents=True, exist_ok=True)
        s.data_dir.chmod(0o700)  # whatever the umask, also when it existed: state.db holds every Secret
        pki = s.data_dir / "pki"
        now = time.time()
        ca = load_or_create_ca(pki, "ca", "ambit-apiserver-ca", now)
        sa_key = _load_or_create_secret(pki / "sa.key", _new_ec_key_pem)
        self.admin_token = (
            _load_or_create_secret(s.data_dir / "admin.token", lambda: secrets.token_urlsafe(32).encode())
            .decode()
            .strip()
        )
        sans_dns = [
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ]
        sans_ip = ["127.0.0.1"]
        for extra in (s.host, *s.extra_sans):
            try:
                ipaddress.ip_address(extra)
                if extra not in sans_ip and extra not in ("0.0.0.0", "::"):
                    sans_ip.append(extra)
            except ValueError:
                sans_dns.append(extra)
        serving = issue_server_cert(
            ca, common_name="ambit-apiserver", dns_names=sans_dns, ip_addresses=sans_ip, now=now
        )
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        with tempfile.TemporaryDirectory() as tmp:
            cert_file, key_file = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
            cert_file.write_bytes(serving.cert_pem + ca.cert_pem)
            key_file.write_bytes(serving.key_pem)
            context.load_cert_chain(cert_file, key_file)
        store = Store(s.data_dir / "state.db", log_capacity=s.log_capacity, log_bytes=s.log_bytes)
        registry = Registry(enabled_builtins(s.runtime_config))
        hub = WatchHub(capacity_bytes=s.limits.watch_queue_bytes)
        self.manager = ResourceManager(
            store,
            registry,
            hub,
            tokens=TokenIssuer(
                sa_key, default_audiences=s.api_audiences or None, max_expiration_seconds=s.max_token_expiration
            ),
            admission=AdmissionController(service_resolver=StoreServiceResolver(store)),
            service_cidr=s.service_cidr,
            root_ca_pem=ca.cert_pem.decode(),
            pod_security=s.pod_security,
        )
        await self.manager.bootstrap(_load_crds(s.crd_dir), _load_rbac(s.rbac_dir))
        self._http = ApiHttp(
            self.manager,
            HttpSettings(
                admin_token=self.admin_token,
                server_address=f"{s.host}:{s.port}",
                static_tokens=load_token_file(s.token_auth_file) if s.token_auth_file is not None else {},
                bookmark_interval=s.bookmark_interval,
                limits=s.limits,
                kubelet_socket_dir=s.kubelet_socket_dir,
            ),
        )
        unparsed_requests.install()  # a malformed request's bytes (a bearer token) never reach the log
        self._runner = web.AppRunner(self._http.app(), handle_signals=False, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        assert self._runner.server is not None  # set by setup()
        sock = socket.socket(socket.AF_INET6 if ":" in s.host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((s.host, s.port))
        except BaseException:
            sock.close()
            raise
        self._listener = TlsListener(sock, self._runner.server, context, name="apiserver")
        self._listener.start()
        port = self._listener.address[1]
        advertised = advertised_address(s.advertise_address, s.host)
        if advertised:
            await self.manager.ensure(kubernetes_service(s.service_cidr, port), SERVICE_FIELDS)
            await self.manager.ensure(kubernetes_endpoint_slice(advertised, port), SLICE_FIELDS)
        host = "127.0.0.1" if s.host in ("0.0.0.0", "::", "") else s.host
        self.url = f"https://{host}:{port}"
        self.kubeconfig = s.kubeconfig or s.data_dir / "kubeconfig"
        write_kubeconfig(self.kubeconfig, self.url, ca.cert_pem, self.admin_token)

    async def aclose(self) -> None:
        if self.manager is not None:
            self.manager.hub.close_all()
        if self._listener is not None:
            await self._listener.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._listener is not None:  # every accepted connection closed, or aborted after a second
            await self._listener.aclose(grace=1.0)
            self._listener = None
        if self.manager is not None:
            await self.manager.admission.aclose()
            self.manager.store.close()
            self.manager = None

    async def __aenter__(self) -> ApiServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def write_kubeconfig(path: Path, url: str, ca_pem: bytes, token: str, *, name: str = "ambit") -> None:
    config: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": name, "cluster": {"server": url, "certificate-authority-data": base64.b64encode(ca_pem).decode()}}
        ],
        "users": [{"name": f"{name}-admin", "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": f"{name}-admin", "namespace": "default"}}],
        "current-context": name,
        "preferences": {},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    os.replace(tmp, path)


def _load_crds(directory: Path | None) -> list[dict[str, Any]]:
    if directory is None or not directory.is_dir():
        return []
    crds: list[dict[str, Any]] = []
    for path in sorted(directory.glob("*.yaml")):
        for doc in untrusted_yaml.load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                crds.append(doc)
    return crds


def _load_rbac(directory: Path | None) -> list[dict[str, Any]]:
    if directory is None or not directory.is_dir():
        return []
    objs: list[dict[str, Any]] = []
    for path in sorted(directory.glob("*.yaml")):
        for doc in yaml.load_all(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
            if isinstance(doc, dict) and str(doc.get("apiVersion", "")).startswith("rbac.authorization.k8s.io/"):
                objs.append(doc)
    return objs


def _load_or_create_secret(path: Path, make: Any) -> bytes:
    if path.exists():
        return path.read_bytes()
    data: bytes = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return data


def _new_ec_key_pem() -> bytes:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


async def serve_forever(settings: ApiServerSettings) -> None:
    """Run until SIGTERM or SIGINT; print one line when ready."""
    import signal

    server = ApiServer(settings)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"ambit apiserver ready at {server.url} (kubeconfig {server.kubeconfig})", flush=True)
    try:
        await stop.wait()
    finally:
        await server.aclose()

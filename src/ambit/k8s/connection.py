"""Where the API server is and how to authenticate to it: kubeconfig, in-cluster, or the environment.

A :class:`Connection` is the outcome of reading configuration once at start-up: the server URL, an SSL context
that trusts the server's CA (and holds our client certificate, if any), an httpx auth flow that adds our
credentials, and the default namespace. Kubeconfig files are parsed by lightkube (``lightkube.KubeConfig``, which
also turns ``exec`` plugins and client certificates into httpx pieces); in-cluster configuration is read here.

Service-account tokens mounted into pods are bound tokens that the kubelet rotates (about hourly). Like
client-go's ``cachedFileTokenSource``, :class:`TokenFileAuth` re-reads the token file once it is older than a
minute, and at once when the server answers 401, retrying that request once with the fresh token.

lightkube is imported only when a kubeconfig is read (importing it costs about 0.1 s more than httpx alone).

Lookup order of :func:`load_from_env`: ``$KUBECONFIG`` (the first existing file of the colon-separated list), then
``~/.kube/config``, then the in-cluster service account. kubectl merges every file in ``$KUBECONFIG``; we do not.
"""

from __future__ import annotations

import logging
import os
import ssl
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx2 as httpx

from ambit.k8s.errors import KubeConfigError

log = logging.getLogger("ambit.k8s")

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_KUBECONFIG = Path("~/.kube/config")
TOKEN_RELOAD_INTERVAL = 60.0


@dataclass(frozen=True, slots=True)
class Connection:
    """How to reach one API server, as configuration described it."""

    server: str
    """Base URL, e.g. ``https://127.0.0.1:6443`` (a path prefix is kept)."""
    verify: ssl.SSLContext
    """Trusts the server's CA and carries our client certificate, if any."""
    auth: httpx.Auth | None
    """Adds our credentials to each request."""
    namespace: str = "default"
    """The namespace of the kubeconfig context (or of the pod): used when a call names none."""
    source: str = ""
    """Where this came from, for log lines: a kubeconfig path and context, or ``in-cluster``."""


class TokenFileAuth(httpx.Auth):
    """Bearer token read from a file that may be rotated underneath us."""

    def __init__(
        self,
        path: Path,
        *,
        reload_interval: float = TOKEN_RELOAD_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._path = path
        self._reload_interval = reload_interval
        self._clock = clock
        self._token = ""
        self._read_at = 0.0

    def token(self, *, force: bool = False) -> str:
        """The current token, re-read when stale (or ``force``); a failed re-read keeps the last good token."""
        now = self._clock()
        if force or not self._token or now - self._read_at >= self._reload_interval:
            try:
                token = self._path.read_text().strip()
            except OSError as exc:
                if not self._token:
                    raise KubeConfigError(f"cannot read the token file {self._path}: {exc}") from exc
                log.warning("cannot re-read the token file %s (keeping the last token): %s", self._path, exc)
            else:
                if token:
                    self._token = token
            self._read_at = now
        if not self._token:
            raise KubeConfigError(f"the token file {self._path} is empty")
        return self._token

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        used = self.token()
        request.headers["Authorization"] = f"Bearer {used}"
        response = yield request
        if response.status_code == 401:
            fresh = self.token(force=True)
            if fresh != used:
                request.headers["Authorization"] = f"Bearer {fresh}"
                yield request


def load_kubeconfig(
    path: str | os.PathLike[str],
    context: str | None = None,
    *,
    trust_env: bool = True,
    clock: Callable[[], float] = time.monotonic,
) -> Connection:
    """The connection of ``context`` (default: the current context) of the kubeconfig file at ``path``."""
    from lightkube import KubeConfig
    from lightkube.config import client_adapter
    from lightkube.config.models import User
    from lightkube.core.exceptions import ConfigError

    shown = Path(path).expanduser()
    try:
        single = KubeConfig.from_file(shown).get(context)
        if single is None or single.cluster is None:
            raise ConfigError("no current context")
        user = single.user or User()
        cluster = single.cluster
        verify = client_adapter.verify_cluster(cluster, user, single.abs_file, trust_env=trust_env)
        if user.token_file:
            auth: httpx.Auth | None = TokenFileAuth(Path(single.abs_file(user.token_file)), clock=clock)
        else:
            auth = client_adapter.user_auth(user)
    except (ConfigError, OSError, ssl.SSLError, KeyError, TypeError, ValueError) as exc:
        raise KubeConfigError(f"{shown}: {exc}") from exc
    except Exception as exc:  # yaml and msgspec errors: a malformed file, not our bug
        raise KubeConfigError(f"{shown}: not a valid kubeconfig: {exc}") from exc
    return Connection(
        server=cluster.server,
        verify=verify,
        auth=auth,
        namespace=single.namespace,
        source=f"kubeconfig {shown} (context {single.context_name})",
    )


def load_in_cluster(
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
    *,
    environ: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Connection:
    """The pod's own service account: ``KUBERNETES_SERVICE_HOST``/``PORT``, its token, CA and namespace files."""
    env = os.environ if environ is None else environ
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise KubeConfigError("not in a cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")
    token_file, ca_file = service_account_dir / "token", service_account_dir / "ca.crt"
    if not token_file.is_file():
        raise KubeConfigError(f"not in a cluster: no service-account token at {token_file}")
    try:
        verify = ssl.create_default_context(cafile=str(ca_file))
    except (OSError, ssl.SSLError) as exc:
        raise KubeConfigError(f"in-cluster CA {ca_file}: {exc}") from exc
    try:
        namespace = (service_account_dir / "namespace").read_text().strip() or "default"
    except OSError:
        namespace = "default"
    if ":" in host:
        host = f"[{host}]"
    return Connection(
        server=f"https://{host}:{port}",
        verify=verify,
        auth=TokenFileAuth(token_file, clock=clock),
        namespace=namespace,
        source="in-cluster",
    )


def load_from_env(
    *,
    environ: Mapping[str, str] | None = None,
    default_kubeconfig: Path = DEFAULT_KUBECONFIG,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
    trust_env: bool = True,
) -> Connection:
    """``$KUBECONFIG``, else ``~/.kube/config``, else in-cluster: the first that exists wins."""
    env = os.environ if environ is None else environ
    tried: list[str] = []
    for entry in env.get("KUBECONFIG", "").split(os.pathsep):
        if entry:
            candidate = Path(entry).expanduser()
            if candidate.is_file():
                return load_kubeconfig(candidate, trust_env=trust_env)
            tried.append(str(candidate))
    home = default_kubeconfig.expanduser()
    if home.is_file():
        return load_kubeconfig(home, trust_env=trust_env)
    tried.append(str(home))
    try:
        return load_in_cluster(service_account_dir, environ=env)
    except KubeConfigError as exc:
        raise KubeConfigError(f"no Kubernetes configuration: no kubeconfig at {', '.join(tried)}; {exc}") from None

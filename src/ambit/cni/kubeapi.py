"""The plugin's minimal Kubernetes client: read a kubeconfig and GET one object over HTTPS with a bearer token.

The plugin runs once per pod sandbox and must start fast, so it does not use :mod:`ambit.k8s` (which pulls in
an async HTTP stack). It needs three facts from a kubeconfig: the server URL, the CA certificate and a bearer
token. The installer writes the kubeconfig as JSON (which is also valid YAML, so kubectl reads it); for
convenience a flat YAML kubeconfig like the embedded API server's is read with a line scan of the first
``server:``, ``certificate-authority-data:`` and ``token:`` keys. Client certificates and exec plugins are not
supported.

A lookup is retried a few times with short pauses on connection errors, 429 and 5xx: the API server may be
restarting while pods start. 404 and 401/403 are not retried. ``ssl`` and ``http.client`` are imported only
when a lookup happens, not at plugin start-up.
"""

from __future__ import annotations

import base64
import json
import time

from ambit.cni.errors import InvalidConfigError, KubeLookupError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

RETRY_DELAYS = (0.1, 0.3, 0.6)
"""Pauses between attempts; len + 1 attempts in all."""

REQUEST_TIMEOUT = 3.0


class KubeCredentials:
    """Server URL, CA bundle (PEM text) and bearer token from a kubeconfig."""

    __slots__ = ("ca_pem", "server", "token")

    def __init__(self, server: str, ca_pem: str, token: str) -> None:
        self.server = server
        self.ca_pem = ca_pem
        self.token = token


def load_kubeconfig(path: str) -> KubeCredentials:
    """Read the current context's cluster and user from a JSON (or flat YAML) kubeconfig."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise InvalidConfigError(f"kubeconfig {path}: cannot read: {e.strerror}") from e
    try:
        doc = json.loads(text)
    except ValueError:
        fields = _scan_yaml(text)
    else:
        fields = _from_json(doc) if isinstance(doc, dict) else {}
    missing = [k for k in ("server", "certificate-authority-data", "token") if not fields.get(k)]
    if missing:
        raise InvalidConfigError(f"kubeconfig {path}: missing {', '.join(missing)}")
    try:
        ca_pem = base64.b64decode(fields["certificate-authority-data"], validate=True).decode("ascii")
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidConfigError(f"kubeconfig {path}: certificate-authority-data is not base64 PEM") from e
    return KubeCredentials(fields["server"], ca_pem, fields["token"])


def _from_json(doc: dict[str, Any]) -> dict[str, str]:
    def named(section: str, name: object) -> dict[str, Any]:
        entries = doc.get(section)
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, dict) and (name is None or entry.get("name") == name):
                inner = entry.get(section[:-1])
                return inner if isinstance(inner, dict) else {}
        return {}

    current = doc.get("current-context")
    context = named("contexts", current) if current else named("contexts", None)
    cluster = named("clusters", context.get("cluster"))
    user = named("users", context.get("user"))
    out = {k: cluster.get(k) for k in ("server", "certificate-authority-data")}
    out["token"] = user.get("token")
    return {k: v for k, v in out.items() if isinstance(v, str)}


def _scan_yaml(text: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.strip().removeprefix("- ").partition(":")
        value = value.strip().strip("'\"")
        if sep and value and key in ("server", "certificate-authority-data", "token"):
            found.setdefault(key, value)
    return found


def fetch_object(creds: KubeCredentials, path: str, *, sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """GET ``path`` (e.g. ``/api/v1/namespaces/default/pods/web``) and return the decoded object."""
    import http.client
    import ssl
    from urllib.parse import urlsplit

    url = urlsplit(creds.server)
    if url.scheme != "https" or not url.hostname:
        raise InvalidConfigError(f"kubeconfig server {creds.server!r} is not an https URL")
    try:
        context = ssl.create_default_context(cadata=creds.ca_pem)
    except (ssl.SSLError, ValueError) as e:
        raise InvalidConfigError(f"kubeconfig CA data is not usable: {e}") from e
    headers = {"Authorization": f"Bearer {creds.token}", "Accept": "application/json"}
    last = ""
    for attempt, delay in enumerate((*RETRY_DELAYS, None)):
        conn = http.client.HTTPSConnection(url.hostname, url.port or 443, timeout=REQUEST_TIMEOUT, context=context)
        try:
            conn.request("GET", url.path.rstrip("/") + path, headers=headers)
            response = conn.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException) as e:
            last = f"attempt {attempt + 1}: {e}"
        else:
            if response.status == 200:
                try:
                    obj = json.loads(body)
                except ValueError as e:
                    raise KubeLookupError(f"GET {path}: the API server sent invalid JSON") from e
                if not isinstance(obj, dict):
                    raise KubeLookupError(f"GET {path}: the API server sent a {type(obj).__name__}, not an object")
                return obj
            last = f"HTTP {response.status}: {_status_message(body)}"
            if response.status == 401:
                # The plugin's kubeconfig holds the node agent's token, which the node agent keeps fresh and which
                # dies with its pod (a bound token): a 401 almost always means the node agent is not running.
                last += (
                    "; the plugin's credentials come from the node agent (istio-cni-node), which keeps them "
                    "current: is the node agent running on this node?"
                )
            if response.status != 429 and response.status < 500:
                break
        finally:
            conn.close()
        if delay is not None:
            sleep(delay)
    raise KubeLookupError(f"GET {path} failed", last)


def _status_message(body: bytes) -> str:
    try:
        status = json.loads(body)
    except ValueError:
        return body[:200].decode("utf-8", "replace")
    message = status.get("message") if isinstance(status, dict) else None
    return message if isinstance(message, str) else ""

"""The ``ambit-cni`` CNI plugin: chained after the node's primary plugins, it tells the node agent about ambient pods.

Theory of operation (spec §1.2, "CNI plugin cmdAdd workflow"). The runtime execs us with the CNI 1.0.0 protocol:
the command and container facts in ``CNI_*`` environment variables, the network configuration (with the previous
plugin's result in ``prevResult``) as JSON on stdin, a result or error as JSON on stdout.

- ``ADD``: echo ``prevResult`` unless the pod is ambient; for an ambient pod, first POST ``/cmdadd`` to the node
  agent over its UNIX socket and fail the ADD if the agent does not answer 200 (the runtime then retries the
  sandbox). The plugin never programs networking itself. Pods without ``K8S_POD_NAME``/``K8S_POD_NAMESPACE``,
  pods in ``exclude_namespaces`` and configurations with ``ambient_enabled: false`` are passed through without
  any API call; otherwise the Pod and its Namespace are read from the API server and judged by
  :func:`ambit.cni.selection.is_ambient`.
- ``DEL``: nothing to do (the agent sees pod deletion through the API) and, per the CNI spec, no output.
- ``CHECK``: nothing to verify; no output. ``VERSION``: the supported versions.

Invariants: every failure, including an unexpected exception, becomes a CNI error result on stdout and exit
status 1, never a traceback. Start-up is paid on every pod sandbox, so module level imports only ``json``,
``os``, ``sys`` and stdlib-only Ambit modules; the HTTP and TLS modules load only on the ADD path that needs them.
"""

from __future__ import annotations

import json
import os
import sys

from ambit.cni.errors import (
    CniError,
    DecodingError,
    IncompatibleVersionError,
    InvalidConfigError,
    InvalidEnvironmentError,
)
from ambit.cni.selection import DEFAULT_EXCLUDED_NAMESPACES, is_ambient

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    KubeGet = Callable[[str, str], dict[str, Any]]
    """``(kubeconfig path, API path) -> object``; raises :class:`ambit.cni.errors.CniError`."""
    PostEvent = Callable[[str, dict[str, Any]], None]
    """``(agent socket path, event)``; raises :class:`ambit.cni.errors.CniError` unless the agent said 200."""

CNI_VERSION = "1.0.0"
SUPPORTED_VERSIONS = ("0.3.0", "0.3.1", "0.4.0", "1.0.0")
PLUGIN_TYPE = "ambit-cni"
DEFAULT_AGENT_SOCKET = "/var/run/ambit-cni/pluginevent.sock"
DEFAULT_KUBECONFIG = "/var/run/istio-cni/istio-cni-kubeconfig"

# Which CNI_* variables each command needs (as libcni's skel checks them).
REQUIRED_ENV: dict[str, tuple[str, ...]] = {
    "ADD": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"),
    "CHECK": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"),
    "DEL": ("CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"),
    "VERSION": (),
}
KNOWN_CNI_ARGS = frozenset({"K8S_POD_NAME", "K8S_POD_NAMESPACE", "K8S_POD_UID", "K8S_POD_INFRA_CONTAINER_ID"})


class PluginConfig:
    """The network configuration from stdin, validated once."""

    __slots__ = (
        "agent_socket",
        "ambient_enabled",
        "cni_version",
        "exclude_namespaces",
        "kubeconfig",
        "name",
        "prev_result",
    )

    def __init__(
        self,
        *,
        name: str,
        cni_version: str,
        prev_result: dict[str, Any] | None,
        agent_socket: str = DEFAULT_AGENT_SOCKET,
        kubeconfig: str = DEFAULT_KUBECONFIG,
        exclude_namespaces: frozenset[str] = DEFAULT_EXCLUDED_NAMESPACES,
        ambient_enabled: bool = True,
    ) -> None:
        self.name = name
        self.cni_version = cni_version
        self.prev_result = prev_result
        self.agent_socket = agent_socket
        """The node agent's plugin-event socket."""
        self.kubeconfig = kubeconfig
        """Kubeconfig (server, CA data, token) the installer wrote for the plugin."""
        self.exclude_namespaces = exclude_namespaces
        """Namespaces whose pods are passed through without an API call."""
        self.ambient_enabled = ambient_enabled
        """False turns the plugin into a pass-through."""


def parse_config(raw: bytes) -> PluginConfig:
    """Decode and validate stdin; raises DecodingError (6), IncompatibleVersionError (1), InvalidConfigError (7)."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise DecodingError("network configuration on stdin is not valid JSON", str(e)) from e
    if not isinstance(doc, dict):
        raise DecodingError("network configuration on stdin is not a JSON object")
    version = doc.get("cniVersion")
    if not isinstance(version, str):
        raise InvalidConfigError("network configuration: cniVersion must be a string")
    if version not in SUPPORTED_VERSIONS:
        raise IncompatibleVersionError(
            f"network configuration: cniVersion {version} is not supported",
            f"supported: {', '.join(SUPPORTED_VERSIONS)}",
        )
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidConfigError("network configuration: name must be a non-empty string")
    prev = doc.get("prevResult")
    if prev is not None and not isinstance(prev, dict):
        raise InvalidConfigError("network configuration: prevResult must be an object")
    excluded = doc.get("exclude_namespaces", sorted(DEFAULT_EXCLUDED_NAMESPACES))
    if not isinstance(excluded, list) or not all(isinstance(n, str) for n in excluded):
        raise InvalidConfigError("network configuration: exclude_namespaces must be a list of strings")
    return PluginConfig(
        name=name,
        cni_version=version,
        prev_result=prev,
        agent_socket=_string(doc, "agent_socket", DEFAULT_AGENT_SOCKET),
        kubeconfig=_string(doc, "kubeconfig", DEFAULT_KUBECONFIG),
        exclude_namespaces=frozenset(excluded),
        ambient_enabled=_bool(doc, "ambient_enabled", True),
    )


def _string(doc: dict[str, Any], key: str, default: str) -> str:
    value = doc.get(key, default)
    if not isinstance(value, str) or not value:
        raise InvalidConfigError(f"network configuration: {key} must be a non-empty string")
    return value


def _bool(doc: dict[str, Any], key: str, default: bool) -> bool:
    value = doc.get(key, default)
    if not isinstance(value, bool):
        raise InvalidConfigError(f"network configuration: {key} must be true or false")
    return value


def parse_cni_args(text: str) -> dict[str, str]:
    """Parse ``CNI_ARGS`` (``K=V;K=V``); unknown keys are an error unless ``IgnoreUnknown`` is true."""
    pairs: dict[str, str] = {}
    for item in text.split(";"):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidEnvironmentError(f"CNI_ARGS: {item!r} is not KEY=VALUE")
        pairs[key] = value
    ignore_unknown = pairs.pop("IgnoreUnknown", "").lower() in ("1", "true")
    unknown = sorted(set(pairs) - KNOWN_CNI_ARGS)
    if unknown and not ignore_unknown:
        raise InvalidEnvironmentError(f"CNI_ARGS: unknown argument {unknown[0]} (and IgnoreUnknown is not set)")
    return pairs


def add_event(
    env: Mapping[str, str], args: Mapping[str, str], pod: dict[str, Any], prev: dict[str, Any]
) -> dict[str, Any]:
    """The ``/cmdadd`` body: netns path, pod identity, and the IPs the primary plugins assigned."""
    meta = pod.get("metadata")
    uid = args.get("K8S_POD_UID") or (meta.get("uid") if isinstance(meta, dict) else None) or ""
    ips = prev.get("ips")
    return {
        "netns": env["CNI_NETNS"],
        "podName": args["K8S_POD_NAME"],
        "podNamespace": args["K8S_POD_NAMESPACE"],
        "podUid": uid,
        "ips": [
            {"interface": ip.get("interface"), "address": ip.get("address"), "gateway": ip.get("gateway")}
            for ip in (ips if isinstance(ips, list) else [])
            if isinstance(ip, dict)
        ],
    }


def cmd_add(env: Mapping[str, str], conf: PluginConfig, kube_get: KubeGet, post_event: PostEvent) -> dict[str, Any]:
    prev = conf.prev_result
    if prev is None:
        raise InvalidConfigError("ambit-cni must be called as a chained plugin (no prevResult)")
    result = {**prev, "cniVersion": conf.cni_version}
    args = parse_cni_args(env.get("CNI_ARGS", ""))
    name, namespace = args.get("K8S_POD_NAME"), args.get("K8S_POD_NAMESPACE")
    if not name or not namespace or namespace in conf.exclude_namespaces or not conf.ambient_enabled:
        return result
    from urllib.parse import quote

    ns_path = f"/api/v1/namespaces/{quote(namespace, safe='')}"
    pod = kube_get(conf.kubeconfig, f"{ns_path}/pods/{quote(name, safe='')}")
    ns_obj = kube_get(conf.kubeconfig, ns_path)
    if is_ambient(pod, ns_obj, excluded_namespaces=conf.exclude_namespaces).enrolled:
        post_event(conf.agent_socket, add_event(env, args, pod, prev))
    return result


def run(
    env: Mapping[str, str],
    stdin: bytes,
    *,
    kube_get: KubeGet | None = None,
    post_event: PostEvent | None = None,
) -> tuple[str, int]:
    """Execute one plugin invocation; returns (stdout text, exit status). Never raises for bad input."""
    version = CNI_VERSION
    try:
        command = env.get("CNI_COMMAND", "")
        if command not in REQUIRED_ENV:
            raise InvalidEnvironmentError(
                f"CNI_COMMAND {command!r} is not one of ADD, DEL, CHECK, VERSION"
                if command
                else "required environment variable CNI_COMMAND is missing"
            )
        if command == "VERSION":
            return _dump({"cniVersion": CNI_VERSION, "supportedVersions": list(SUPPORTED_VERSIONS)}), 0
        missing = [var for var in REQUIRED_ENV[command] if not env.get(var)]
        if missing:
            raise InvalidEnvironmentError(f"required environment variable {missing[0]} is missing")
        conf = parse_config(stdin)
        version = conf.cni_version
        if command == "ADD":
            result = cmd_add(env, conf, kube_get or _fetch_from_api, post_event or _post_to_agent)
            return _dump(result), 0
        if command == "CHECK" and version in ("0.3.0", "0.3.1"):
            raise IncompatibleVersionError(f"cniVersion {version} does not support CHECK")
        return "", 0
    except CniError as e:
        return _dump(_error(version, e.code, e.msg, e.details)), 1
    except Exception as e:
        return _dump(_error(version, 999, "ambit-cni: internal error", f"{type(e).__name__}: {e}")), 1


def _error(version: str, code: int, msg: str, details: str) -> dict[str, Any]:
    error: dict[str, Any] = {"cniVersion": version, "code": code, "msg": msg}
    if details:
        error["details"] = details
    return error


def _dump(obj: dict[str, Any]) -> str:
    return json.dumps(obj) + "\n"


def _fetch_from_api(kubeconfig: str, path: str) -> dict[str, Any]:
    from ambit.cni.kubeapi import fetch_object, load_kubeconfig

    return fetch_object(load_kubeconfig(kubeconfig), path)


def _post_to_agent(socket_path: str, event: dict[str, Any]) -> None:
    from ambit.cni.agent_client import post_add_event

    post_add_event(socket_path, event)


def main() -> None:
    """Console-script entry point: read env and stdin, write the result, exit with its status."""
    try:
        command = os.environ.get("CNI_COMMAND", "")
        stdin = b"" if command == "VERSION" else sys.stdin.buffer.read()
        out, status = run(os.environ, stdin)
    except BaseException as e:  # even KeyboardInterrupt: a runtime must get a result, not a traceback
        out, status = _dump(_error(CNI_VERSION, 999, "ambit-cni: internal error", type(e).__name__)), 1
    sys.stdout.write(out)
    sys.stdout.flush()
    sys.exit(status)


if __name__ == "__main__":
    main()

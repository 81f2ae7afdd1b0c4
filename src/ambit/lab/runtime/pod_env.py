"""A container's environment, as the kubelet builds it: ``$(VAR)`` expansion, ``envFrom`` and ``env`` with their
``fieldRef``, ``configMapKeyRef`` and ``secretKeyRef`` references.

Theory of operation. :func:`config_refs` names the ConfigMaps and Secrets a container reads; :func:`fetch_configs`
reads them from the API (a missing one is None, Secrets are decoded); :func:`container_env` then builds the
environment without I/O: the runtime's variables first, then ``envFrom``, then ``env``, each ``value`` expanded
against what is defined before it. A reference that cannot be resolved raises
:class:`~ambit.lab.runtime.containers_apply.ContainerConfigError`: with ``retry`` when the object or key may appear
later (a missing ConfigMap, Secret or key that is not optional), without it when the spec itself is unsupported.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from ambit.k8s import KubeClient, kinds
from ambit.k8s.errors import KubeClientError, KubeNotFoundError
from ambit.lab.runtime.containers_apply import ContainerConfigError


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined names are replaced, others kept; ``$$`` is a literal ``$``."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            if text[i + 1] == "$":
                out.append("$")
                i += 2
                continue
            if text[i + 1] == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2 : end]
                    out.append(env[name] if name in env else text[i : end + 1])
                    i = end + 1
                    continue
        out.append(text[i])
        i += 1
    return "".join(out)


ConfigKey = tuple[str, str]  # ("configmap" | "secret", name)


def config_refs(container: Mapping[str, Any]) -> set[ConfigKey]:
    """The ConfigMaps and Secrets a container's environment reads."""
    refs: set[ConfigKey] = set()
    for source in container.get("envFrom") or ():
        for key, kind in (("configMapRef", "configmap"), ("secretRef", "secret")):
            if isinstance(source, dict) and isinstance(source.get(key), dict):
                refs.add((kind, str(source[key].get("name", ""))))
    for entry in container.get("env") or ():
        value_from = entry.get("valueFrom") if isinstance(entry, dict) else None
        for key, kind in (("configMapKeyRef", "configmap"), ("secretKeyRef", "secret")):
            if isinstance(value_from, dict) and isinstance(value_from.get(key), dict):
                refs.add((kind, str(value_from[key].get("name", ""))))
    return refs


def field_value(pod: Mapping[str, Any], path: str, pod_ips: Sequence[str], host_ip: str) -> str:
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    for prefix, source in (("metadata.labels", "labels"), ("metadata.annotations", "annotations")):
        if path.startswith(prefix + "['") and path.endswith("']"):
            return str((meta.get(source) or {}).get(path[len(prefix) + 2 : -2], ""))
    values = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.hostIP": host_ip,
        "status.hostIPs": host_ip,
        "status.podIP": pod_ips[0] if pod_ips else "",
        "status.podIPs": ",".join(pod_ips),
    }
    if path not in values:
        raise ContainerConfigError(f"unsupported fieldRef {path!r}", retry=False)
    return str(values[path] or "")


def container_env(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    base: Mapping[str, str],
    configs: Mapping[ConfigKey, Mapping[str, str] | None],
    pod_ips: Sequence[str],
    host_ip: str,
) -> dict[str, str]:
    """``base`` (the runtime's variables), then ``envFrom``, then ``env``, as the kubelet orders them."""
    namespace = str((pod.get("metadata") or {}).get("namespace") or "")
    env = dict(base)
    for source in container.get("envFrom") or ():
        for key, kind in (("configMapRef", "configmap"), ("secretRef", "secret")):
            ref = source.get(key) if isinstance(source, dict) else None
            if isinstance(ref, dict):
                data = configs.get((kind, str(ref.get("name", ""))))
                if data is None:
                    if ref.get("optional"):
                        continue
                    raise ContainerConfigError(f'{kind} "{ref.get("name")}" not found', retry=True)
                prefix = str(source.get("prefix") or "")
                env.update({prefix + k: v for k, v in data.items()})
    for entry in container.get("env") or ():
        if not isinstance(entry, dict) or not entry.get("name"):
            continue
        name = str(entry["name"])
        value_from = entry.get("valueFrom")
        if not isinstance(value_from, dict):
            env[name] = expand(str(entry.get("value") or ""), env)
            continue
        if isinstance(value_from.get("fieldRef"), dict):
            env[name] = field_value(pod, str(value_from["fieldRef"].get("fieldPath", "")), pod_ips, host_ip)
            continue
        for key, kind, title in (("configMapKeyRef", "configmap", "ConfigMap"), ("secretKeyRef", "secret", "Secret")):
            ref = value_from.get(key)
            if isinstance(ref, dict):
                ref_name, ref_key = str(ref.get("name", "")), str(ref.get("key", ""))
                data = configs.get((kind, ref_name))
                if data is not None and ref_key in data:
                    env[name] = data[ref_key]
                elif not ref.get("optional"):
                    problem = (
                        f'{kind} "{ref_name}" not found'
                        if data is None
                        else f"couldn't find key {ref_key} in {title} {namespace}/{ref_name}"
                    )
                    raise ContainerConfigError(problem, retry=True)
                break
        else:
            raise ContainerConfigError(f"env {name}: unsupported valueFrom {sorted(value_from)}", retry=False)
    return env


async def fetch_configs(
    client: KubeClient, namespace: str, refs: set[ConfigKey]
) -> dict[ConfigKey, Mapping[str, str] | None]:
    """The data of each referenced ConfigMap and Secret (Secrets decoded); None for one that does not exist."""
    found: dict[ConfigKey, Mapping[str, str] | None] = {}
    for kind, name in sorted(refs):
        resource = kinds.CONFIG_MAPS if kind == "configmap" else kinds.SECRETS
        try:
            obj = await client.get(resource, name, namespace)
        except KubeNotFoundError:
            found[(kind, name)] = None
            continue
        except KubeClientError as exc:
            raise ContainerConfigError(f'reading {kind} "{name}": {exc}', retry=True) from None
        data = obj.get("data") or {}
        if kind == "secret":
            decoded = {}
            for key, value in data.items():
                with contextlib.suppress(binascii.Error, ValueError):
                    decoded[str(key)] = base64.b64decode(str(value)).decode("utf-8", "replace")
            found[(kind, name)] = decoded
        else:
            found[(kind, name)] = {str(k): str(v) for k, v in data.items()}
    return found

"""Discovery documents (legacy form): what kubectl reads to map kinds and short names to URLs."""

from __future__ import annotations

import hashlib
from typing import Any

from ambit.apiserver.registry import Registry, ResourceType

JsonObject = dict[str, Any]

_SUBRESOURCE_VERBS = {
    "status": ["get", "patch", "update"],
    "token": ["create"],
    "eviction": ["create"],
    "finalize": ["update"],
    "scale": ["get", "patch", "update"],
    "log": ["get"],
    "exec": ["create", "get"],
    "portforward": ["create", "get"],
    "attach": ["create", "get"],
}
_SUBRESOURCE_KINDS = {
    "token": ("authentication.k8s.io", "v1", "TokenRequest"),
    "scale": ("autoscaling", "v1", "Scale"),
    "eviction": ("policy", "v1", "Eviction"),
}


def version_info(git_version: str) -> JsonObject:
    return {
        "major": "1",
        "minor": "32",
        "gitVersion": git_version,
        "gitCommit": "ambit",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "python",
        "compiler": "cpython",
        "platform": "linux/amd64",
    }


def api_versions(server_address: str) -> JsonObject:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def _group_entry(group: str, versions: list[str]) -> JsonObject:
    entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": entries, "preferredVersion": entries[0]}


def api_group_list(registry: Registry) -> JsonObject:
    groups = registry.groups()
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [_group_entry(g, v) for g, v in groups.items()],
    }


def api_group(registry: Registry, group: str) -> JsonObject | None:
    versions = registry.groups().get(group)
    if not versions:
        return None
    out = _group_entry(group, versions)
    out.update({"kind": "APIGroup", "apiVersion": "v1"})
    return out


def _storage_hash(rtype: ResourceType) -> str:
    digest = hashlib.sha256(f"{rtype.group}/{rtype.storage_version}/{rtype.kind}".encode()).digest()
    import base64

    return base64.b64encode(digest[:8]).decode()


def api_resource_list(registry: Registry, group: str, version: str) -> JsonObject | None:
    resources: list[JsonObject] = []
    for rtype in registry:
        if rtype.group != group or version not in rtype.versions:
            continue
        entry: JsonObject = {
            "name": rtype.plural,
            "singularName": rtype.singular,
            "namespaced": rtype.namespaced,
            "kind": rtype.kind,
            "verbs": list(rtype.verbs),
            "storageVersionHash": _storage_hash(rtype),
        }
        if rtype.short_names:
            entry["shortNames"] = list(rtype.short_names)
        if rtype.categories:
            entry["categories"] = list(rtype.categories)
        resources.append(entry)
        for sub in sorted(rtype.subresources):
            sub_entry: JsonObject = {
                "name": f"{rtype.plural}/{sub}",
                "singularName": "",
                "namespaced": rtype.namespaced,
                "kind": rtype.kind,
                "verbs": _SUBRESOURCE_VERBS.get(sub, ["get"]),
            }
            if sub in _SUBRESOURCE_KINDS:
                sub_entry["group"], sub_entry["version"], sub_entry["kind"] = _SUBRESOURCE_KINDS[sub]
            resources.append(sub_entry)
    if not resources:
        return None
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": resources,
    }

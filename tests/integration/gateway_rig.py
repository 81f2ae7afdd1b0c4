"""Helpers shared by the gateway controller's integration modules: a waypoint Gateway, a get that tolerates 404,
and one condition of an object's status."""

from __future__ import annotations

from typing import Any

from ambit.k8s import KubeClient, KubeNotFoundError, kinds

Obj = dict[str, Any]


def waypoint(name: str, namespace: str, **labels: str) -> Obj:
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "gatewayClassName": "istio-waypoint",
            "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}],
        },
    }


async def get(kube: KubeClient, kind: kinds.ResourceKind, name: str, namespace: str | None) -> Obj | None:
    try:
        return await kube.get(kind, name, namespace)
    except KubeNotFoundError:
        return None


def condition(obj: Obj | None, type_: str) -> Obj:
    for c in ((obj or {}).get("status") or {}).get("conditions") or ():
        if c.get("type") == type_:
            return dict(c)
    return {}

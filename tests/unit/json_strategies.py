"""Hypothesis strategies for JSON-shaped Kubernetes objects, shared by the printer and validation fuzz tests.

Keys are drawn mostly from the field names the printers and validators read, so generated objects reach deep
into their code instead of stopping at the first unknown key.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from hypothesis import strategies as st

FIELD_NAMES = (
    "metadata",
    "name",
    "namespace",
    "labels",
    "annotations",
    "finalizers",
    "ownerReferences",
    "creationTimestamp",
    "deletionTimestamp",
    "generateName",
    "spec",
    "status",
    "data",
    "binaryData",
    "stringData",
    "type",
    "containers",
    "initContainers",
    "image",
    "ports",
    "port",
    "protocol",
    "nodePort",
    "targetPort",
    "containerPort",
    "env",
    "value",
    "selector",
    "matchLabels",
    "matchExpressions",
    "key",
    "operator",
    "values",
    "template",
    "replicas",
    "phase",
    "reason",
    "conditions",
    "containerStatuses",
    "initContainerStatuses",
    "state",
    "waiting",
    "running",
    "terminated",
    "exitCode",
    "signal",
    "ready",
    "restartCount",
    "lastState",
    "finishedAt",
    "restartPolicy",
    "readinessGates",
    "conditionType",
    "podIPs",
    "ip",
    "clusterIP",
    "externalIPs",
    "externalName",
    "loadBalancer",
    "ingress",
    "hostname",
    "addresses",
    "address",
    "endpoints",
    "subsets",
    "addressType",
    "regarding",
    "involvedObject",
    "note",
    "series",
    "count",
    "lastTimestamp",
    "firstTimestamp",
    "eventTime",
    "source",
    "group",
    "names",
    "plural",
    "singular",
    "kind",
    "listKind",
    "shortNames",
    "scope",
    "versions",
    "served",
    "storage",
    "schema",
    "openAPIV3Schema",
    "additionalPrinterColumns",
    "jsonPath",
    "priority",
    "holderIdentity",
    "nodeInfo",
    "unschedulable",
    "volumes",
    "nodeSelector",
    "apiVersion",
    "uid",
    "controller",
    "secrets",
    "immutable",
)

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False)
    | st.sampled_from(["", "True", "Running", "TCP", "Always", "2024-01-02T03:04:05Z", "a", "-", "."])
    | st.text(max_size=12)
)
KEYS = st.sampled_from(FIELD_NAMES) | st.text(max_size=6)


def json_values(max_leaves: int = 40) -> st.SearchStrategy[Any]:
    return st.recursive(
        SCALARS,
        lambda children: st.lists(children, max_size=4) | st.dictionaries(KEYS, children, max_size=6),
        max_leaves=max_leaves,
    )


def json_objects() -> st.SearchStrategy[dict[str, Any]]:
    """Dicts shaped loosely like an object: a few of its usual top-level keys, anything beneath them."""
    return st.dictionaries(KEYS, json_values(), max_size=6)


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*path, index))


def perturbed(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A valid object with up to two of its values (the whole object included) replaced by arbitrary JSON."""

    @st.composite
    def build(draw: st.DrawFn) -> Any:
        box = [copy.deepcopy(draw(valid))]
        for _ in range(draw(st.integers(0, 2))):
            path = draw(st.sampled_from(list(_paths(box[0], (0,)))))
            parent: Any = box
            for step in path[:-1]:
                parent = parent[step]
            parent[path[-1]] = draw(json_values(max_leaves=4))
        return box[0]

    return build()


def cors_filter_specs() -> st.SearchStrategy[dict[str, Any]]:
    """Valid HTTPRoute ``cors`` filter objects (distinct entries, ``*`` alone or absent is not enforced: the
    webhook's rule about it is part of what is tested)."""
    return st.fixed_dictionaries(
        {},
        optional={
            "allowOrigins": st.lists(st.sampled_from(["*", "https://a.com", "https://*.b.org:8443", "http://*"])),
            "allowMethods": st.lists(st.sampled_from(["GET", "PUT", "*"]), unique=True),
            "allowHeaders": st.lists(st.sampled_from(["x-a", "X-B", "*"]), unique=True),
            "exposeHeaders": st.lists(st.sampled_from(["x-a", "X-B"]), unique=True),
            "allowCredentials": st.booleans(),
            "maxAge": st.integers(1, 2**31 - 1),
        },
    )

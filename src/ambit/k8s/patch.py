"""The three PATCH flavours of the Kubernetes API: JSON merge patch, JSON patch and strategic merge patch (pure).

Theory of operation: every function takes plain JSON values (dict, list, str, int, float, bool, None) and returns
a brand-new value that shares no container with either input, so callers may mutate the result freely and the
original is never touched. A patch that cannot be applied raises :class:`PatchError`, whose ``code`` is what an API
server answers: a malformed patch is the client's mistake (400), a JSON patch of too many operations 413, and a
well-formed patch that cannot apply to this object (a failed ``test``, a path that is not there) 422. The
embedded API server (:mod:`ambit.apiserver.patch`) serves kubectl's PATCH requests with these; the gateway
deployment controller applies its overlays with :func:`strategic_merge_patch`.

Strategic merge patch rules (the subset of Kubernetes' semantics kubectl relies on):

1. Maps merge recursively; a ``null`` value deletes the key. ``$patch: replace`` in a map replaces the whole map,
   ``$patch: delete`` removes it from its parent.
2. A list is atomic (replaced) unless its path is in the ``MergeKeys`` table. Paths are field names from the
   object root; list items are transparent (``spec.containers[].env`` is ``("spec", "containers", "env")``).
3. Lists with a merge key merge item by item on that key: a matching item is merged as a map, a new item is
   appended, ``{"<key>": v, "$patch": "delete"}`` removes the item, and a bare ``{"$patch": "replace"}`` item
   makes the rest of the patch list replace the whole list.
4. Lists merged by value (``MERGE_BY_VALUE``, e.g. ``metadata.finalizers``) take the union, in order; values
   named by ``$deleteFromPrimitiveList/<field>`` are removed first.
5. ``$retainKeys`` drops every original key it does not name before the merge; ``$setElementOrder/<field>``
   puts the named items first in that order, everything else keeping its relative order after them.
6. No directive survives into the result, and an unknown ``$`` key is rejected rather than stored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

import msgspec

from ambit.errors import AmbitError

__all__ = [
    "MERGE_BY_VALUE",
    "MergeKeys",
    "PatchError",
    "clone",
    "json_equal",
    "json_merge_patch",
    "json_patch",
    "merge_keys_for",
    "strategic_merge_patch",
]


class PatchError(AmbitError):
    """A patch that cannot be applied; ``code`` is the HTTP status an API server answers it with (400, 413, 422)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def bad_request(message: str) -> PatchError:
    return PatchError(400, message)


def entity_too_large(message: str) -> PatchError:
    return PatchError(413, message)


def unprocessable(message: str) -> PatchError:
    return PatchError(422, message)


MergeKeys = Mapping[tuple[str, ...], str]
"""Field path (list items transparent) → merge key of the list at that path, or :data:`MERGE_BY_VALUE`."""

MERGE_BY_VALUE: Final = "$value"
"""Marks a list of primitives that merges as a set union (``patchStrategy: merge`` with no merge key)."""


def clone(value: Any) -> Any:
    """A deep copy of a JSON value (faster than ``copy.deepcopy`` for plain data)."""
    if isinstance(value, dict):
        return {k: clone(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clone(v) for v in value]
    return value


def json_equal(a: Any, b: Any) -> bool:
    """Equality as JSON sees it: unlike Python, ``true`` is not ``1``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(v, b[k]) for k, v in a.items())
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict | list) or isinstance(b, dict | list):
        return False
    numbers = isinstance(a, int | float) and isinstance(b, int | float)
    return (numbers or type(a) is type(b)) and a == b


# ---------------------------------------------------------------------------------------------- RFC 7386


def json_merge_patch(target: Any, patch: Any) -> Any:
    """Apply an RFC 7386 merge patch: objects merge recursively, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return clone(patch)
    base = target if isinstance(target, dict) else {}
    result: dict[str, Any] = {}
    for key, value in base.items():
        if key not in patch:
            result[key] = clone(value)
        elif patch[key] is not None:
            result[key] = json_merge_patch(value, patch[key])
    for key, value in patch.items():
        if key not in base and value is not None:
            result[key] = json_merge_patch(None, value)
    return result


# ---------------------------------------------------------------------------------------------- RFC 6902

MAX_JSON_PATCH_OPERATIONS: Final = 10_000
"""kube-apiserver's ``maxJSONPatchOperations``."""
MAX_JSON_PATCH_COPY_BYTES: Final = 3 * 1024 * 1024
"""kube-apiserver's ``JSONPatchMaxCopyBytes``: what ``copy`` operations may add to a document, in all."""
_encode = msgspec.json.Encoder().encode
_OPS_WITH_VALUE = frozenset({"add", "replace", "test"})
_OPS_WITH_FROM = frozenset({"move", "copy"})
_ALL_OPS = _OPS_WITH_VALUE | _OPS_WITH_FROM | {"remove"}
_BAD_ESCAPE_RE = re.compile(r"~(?![01])")
_INDEX_RE = re.compile(r"0|[1-9][0-9]{0,17}")


def json_patch(target: Any, operations: Any) -> Any:
    """Apply an RFC 6902 patch. Every operation is checked for shape before any is applied.

    As kube-apiserver: at most :data:`MAX_JSON_PATCH_OPERATIONS` operations (413), and ``copy`` operations may add
    at most :data:`MAX_JSON_PATCH_COPY_BYTES` in all (422), so that a small patch cannot double a document over
    and over.
    """
    if not isinstance(operations, list):
        raise bad_request("a JSON patch must be an array of operations")
    if len(operations) > MAX_JSON_PATCH_OPERATIONS:
        raise entity_too_large(
            f"The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPERATIONS}, got {len(operations)}"
        )
    checked = [_check_operation(i, op) for i, op in enumerate(operations)]
    copied = 0
    doc = clone(target)
    for i, (name, path, source, op) in enumerate(checked):
        where = f"json patch operation {i} ({name} {_pointer_text(path)})"
        if name == "add":
            doc = _add(doc, path, clone(op["value"]), where)
        elif name == "remove":
            _remove(doc, path, where)
        elif name == "replace":
            doc = _replace(doc, path, clone(op["value"]), where)
        elif name == "move":
            if path[: len(source)] == source and len(path) > len(source):
                raise unprocessable(f"{where}: cannot move a value into one of its own children")
            if path != source:
                doc = _add(doc, path, _remove(doc, source, where), where)
            else:
                _get(doc, source, where)
        elif name == "copy":
            value = _get(doc, source, where)
            copied += len(_encode(value))
            if copied > MAX_JSON_PATCH_COPY_BYTES:
                raise unprocessable(
                    f"{where}: Unable to complete the copy, the accumulated size increase of copy is {copied}, "
                    f"exceeding the limit {MAX_JSON_PATCH_COPY_BYTES}"
                )
            doc = _add(doc, path, clone(value), where)
        elif not json_equal(actual := _get(doc, path, where), op["value"]):
            raise unprocessable(f"{where}: test failed, the value is {actual!r}, not {op['value']!r}")
    return doc


def _check_operation(index: int, op: Any) -> tuple[str, tuple[str, ...], tuple[str, ...], dict[str, Any]]:
    where = f"json patch operation {index}"
    if not isinstance(op, dict):
        raise bad_request(f"{where} must be an object")
    name = op.get("op")
    if not isinstance(name, str) or name not in _ALL_OPS:
        raise bad_request(f"{where}: unknown op {name!r}, expected one of {', '.join(sorted(_ALL_OPS))}")
    if name in _OPS_WITH_VALUE and "value" not in op:
        raise bad_request(f"{where} ({name}) has no 'value'")
    source: tuple[str, ...] = ()
    if name in _OPS_WITH_FROM:
        source = _pointer(op.get("from"), f"{where} 'from'")
    return name, _pointer(op.get("path"), f"{where} 'path'"), source, op


def _pointer(text: Any, where: str) -> tuple[str, ...]:
    """Split an RFC 6901 JSON pointer into unescaped tokens; ``""`` is the whole document."""
    if not isinstance(text, str):
        raise bad_request(f"{where} must be a string JSON pointer")
    if text == "":
        return ()
    if not text.startswith("/") or _BAD_ESCAPE_RE.search(text):
        raise bad_request(f"{where}: {text!r} is not a valid JSON pointer")
    return tuple(t.replace("~1", "/").replace("~0", "~") for t in text[1:].split("/"))


def _pointer_text(path: tuple[str, ...]) -> str:
    return "".join("/" + t.replace("~", "~0").replace("/", "~1") for t in path)


def _index(token: str, size: int, where: str, *, inserting: bool = False) -> int:
    if inserting and token == "-":
        return size
    if not _INDEX_RE.fullmatch(token) or int(token) > size - (0 if inserting else 1):
        raise unprocessable(f"{where}: {token!r} is not a valid index into an array of {size} items")
    return int(token)


def _get(doc: Any, path: tuple[str, ...], where: str) -> Any:
    for depth, token in enumerate(path):
        if isinstance(doc, dict) and token in doc:
            doc = doc[token]
        elif isinstance(doc, list):
            doc = doc[_index(token, len(doc), where)]
        else:
            raise unprocessable(f"{where}: the path {_pointer_text(path[: depth + 1])!r} does not exist")
    return doc


def _parent(doc: Any, path: tuple[str, ...], where: str) -> dict[str, Any] | list[Any]:
    parent = _get(doc, path[:-1], where)
    if not isinstance(parent, dict | list):
        shown = _pointer_text(path[:-1]) or "the document"
        raise unprocessable(f"{where}: {shown} is not an object or an array")
    return parent


def _add(doc: Any, path: tuple[str, ...], value: Any, where: str) -> Any:
    if not path:
        return value
    parent = _parent(doc, path, where)
    if isinstance(parent, dict):
        parent[path[-1]] = value
    else:
        parent.insert(_index(path[-1], len(parent), where, inserting=True), value)
    return doc


def _replace(doc: Any, path: tuple[str, ...], value: Any, where: str) -> Any:
    if not path:
        return value
    parent = _parent(doc, path, where)
    _get(parent, path[-1:], where)
    if isinstance(parent, dict):
        parent[path[-1]] = value
    else:
        parent[_index(path[-1], len(parent), where)] = value
    return doc


def _remove(doc: Any, path: tuple[str, ...], where: str) -> Any:
    """Remove the value at ``path`` from ``doc`` in place and return it."""
    if not path:
        raise unprocessable(f"{where}: cannot remove the whole document")
    parent = _parent(doc, path, where)
    if isinstance(parent, dict):
        if path[-1] not in parent:
            raise unprocessable(f"{where}: the path {_pointer_text(path)!r} does not exist")
        return parent.pop(path[-1])
    return parent.pop(_index(path[-1], len(parent), where))


# ---------------------------------------------------------------------------------------------- strategic


_PATCH = "$patch"
_RETAIN_KEYS = "$retainKeys"
_ORDER_PREFIX = "$setElementOrder/"
_DELETE_PREFIX = "$deleteFromPrimitiveList/"


def strategic_merge_patch(target: dict[str, Any], patch: dict[str, Any], merge_keys: MergeKeys) -> dict[str, Any]:
    """Apply a Kubernetes strategic merge patch to an object of a kind described by ``merge_keys``."""
    if not isinstance(patch, dict):
        raise bad_request("a strategic merge patch must be a JSON object")
    return _StrategicMerge(merge_keys).merge_map(clone(target), patch, ())


class _StrategicMerge:
    """Merges a patch into an original the caller already owns: original values are reused, never copied."""

    def __init__(self, merge_keys: MergeKeys) -> None:
        self._merge_keys = merge_keys

    def merge_map(self, original: Any, patch: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
        base: dict[str, Any] = original if isinstance(original, dict) else {}
        directive = patch.get(_PATCH, "merge")
        # A field whose patch says "delete" is dropped by the caller; only the root and list items get here.
        if directive == "delete":
            return {}
        if directive == "replace":
            base = {}
        elif directive != "merge":
            raise bad_request(f"{_show(path)}: unknown {_PATCH} directive {directive!r}")
        fields = {k: v for k, v in patch.items() if not k.startswith("$")}
        orders: dict[str, Any] = {}
        for key, value in patch.items():
            if key.startswith(_ORDER_PREFIX):
                orders[key.removeprefix(_ORDER_PREFIX)] = _list_of(value, key, path)
            elif key.startswith(_DELETE_PREFIX):
                name, doomed = key.removeprefix(_DELETE_PREFIX), _list_of(value, key, path)
                if isinstance(base.get(name), list):
                    base[name] = [x for x in base[name] if not _contains(doomed, x)]
            elif key.startswith("$") and key not in (_PATCH, _RETAIN_KEYS):
                raise bad_request(f"{_show(path)}: unknown patch directive {key!r}")
        if _RETAIN_KEYS in patch:
            keep = _list_of(patch[_RETAIN_KEYS], _RETAIN_KEYS, path)
            if not all(isinstance(k, str) for k in keep):
                raise bad_request(f"{_show(path)}: {_RETAIN_KEYS} must be a list of field names")
            if stray := sorted(k for k, v in fields.items() if v is not None and k not in keep):
                raise unprocessable(f"{_show(path)}: patch sets {stray} which {_RETAIN_KEYS} does not name")
            base = {k: v for k, v in base.items() if k in keep}
        result: dict[str, Any] = {}
        for key in [*base, *(k for k in fields if k not in base)]:
            if key not in fields:
                result[key] = base[key]
            elif fields[key] is not None and not _says_delete(fields[key]):
                result[key] = self._merge_value(base.get(key), fields[key], (*path, key))
        for name, order in orders.items():
            if isinstance(result.get(name), list):
                key_field = self._merge_keys.get((*path, name))
                result[name] = _reorder(result[name], order, key_field)
        return result

    def _merge_value(self, original: Any, patch: Any, path: tuple[str, ...]) -> Any:
        if isinstance(patch, dict):
            return self.merge_map(original, patch, path)
        if isinstance(patch, list):
            return self._merge_list(original if isinstance(original, list) else [], patch, path)
        return patch

    def _merge_list(self, original: list[Any], patch: list[Any], path: tuple[str, ...]) -> list[Any]:
        key_field = self._merge_keys.get(path)
        items: list[Any] = []
        deleted: list[Any] = []
        replace = key_field is None
        for item in patch:
            directive = item.get(_PATCH) if isinstance(item, dict) else None
            if directive == "replace" and item.keys() == {_PATCH}:
                replace = True
            elif directive == "delete":
                if key_field in (None, MERGE_BY_VALUE) or key_field not in item:
                    raise bad_request(f"{_show(path)}: only items with a merge key can be deleted")
                deleted.append(item[key_field])
            else:
                items.append(item)
        if replace:
            return [self._merge_value(None, item, path) for item in items]
        assert key_field is not None
        if key_field == MERGE_BY_VALUE:
            result = list(original)
            for item in items:
                if isinstance(item, dict | list):
                    raise bad_request(f"{_show(path)}: a list merged by value holds only primitive values")
                if not _contains(result, item):
                    result.append(item)
            return result
        result = [x for x in original if not (isinstance(x, dict) and _contains(deleted, x.get(key_field)))]
        for item in items:
            if not isinstance(item, dict) or key_field not in item:
                raise bad_request(f"{_show(path)}: list item {item!r} has no merge key {key_field!r}")
            at = next((i for i, x in enumerate(result) if _same_item(x, item, key_field)), None)
            merged = self.merge_map(None if at is None else result[at], item, path)
            if at is None:
                result.append(merged)
            else:
                result[at] = merged
        return result


def _reorder(items: list[Any], order: list[Any], key_field: str | None) -> list[Any]:
    """Put the items ``order`` names first, in that order; the rest follow in their current order."""
    keyed = key_field not in (None, MERGE_BY_VALUE)
    remaining = list(items)
    ranked: list[Any] = []
    for wanted in order:
        ident = wanted.get(key_field) if keyed and isinstance(wanted, dict) else wanted
        for i, item in enumerate(remaining):
            have = item.get(key_field) if keyed and isinstance(item, dict) else item
            if json_equal(have, ident):
                ranked.append(remaining.pop(i))
                break
    return ranked + remaining


def _says_delete(value: Any) -> bool:
    return isinstance(value, dict) and value.get(_PATCH) == "delete"


def _same_item(item: Any, patch_item: dict[str, Any], key_field: str) -> bool:
    return isinstance(item, dict) and key_field in item and json_equal(item[key_field], patch_item[key_field])


def _contains(values: list[Any], value: Any) -> bool:
    return any(json_equal(v, value) for v in values)


def _list_of(value: Any, directive: str, path: tuple[str, ...]) -> list[Any]:
    if not isinstance(value, list):
        raise bad_request(f"{_show(path)}: the value of {directive} must be a list")
    return value


def _show(path: tuple[str, ...]) -> str:
    return "strategic merge patch at " + (".".join(path) or "the object root")


# ---------------------------------------------------------------------------------------------- merge keys


def _kind_table() -> Mapping[tuple[str, str], MergeKeys]:
    Table = dict[tuple[str, ...], str]
    meta: Table = {("metadata", "finalizers"): MERGE_BY_VALUE, ("metadata", "ownerReferences"): "uid"}
    conditions: Table = {("status", "conditions"): "type"}

    def pod_spec(*at: str) -> Table:
        table: Table = {
            (*at, "volumes"): "name",
            (*at, "imagePullSecrets"): "name",
            (*at, "hostAliases"): "ip",
            (*at, "schedulingGates"): "name",
            (*at, "topologySpreadConstraints"): "topologyKey",
        }
        for containers in ("containers", "initContainers", "ephemeralContainers"):
            table[(*at, containers)] = "name"
            table[(*at, containers, "ports")] = "containerPort"
            table[(*at, containers, "env")] = "name"
            table[(*at, containers, "volumeMounts")] = "mountPath"
            table[(*at, containers, "volumeDevices")] = "devicePath"
        return table

    template_meta: Table = {
        ("spec", "template", "metadata", "finalizers"): MERGE_BY_VALUE,
        ("spec", "template", "metadata", "ownerReferences"): "uid",
    }
    workload = meta | template_meta | conditions | pod_spec("spec", "template", "spec")
    pod_status: Table = {("status", "podIPs"): "ip", ("status", "hostIPs"): "ip"}
    tables: dict[tuple[str, str], Table] = {
        ("", "Pod"): meta | conditions | pod_status | pod_spec("spec"),
        ("apps", "Deployment"): workload,
        ("apps", "ReplicaSet"): workload,
        ("apps", "DaemonSet"): workload,
        ("apps", "StatefulSet"): workload,
        ("batch", "Job"): workload,
        ("", "Service"): meta | conditions | {("spec", "ports"): "port"},
        ("", "Node"): meta | conditions | {("status", "addresses"): "type"},
        ("", "Namespace"): meta | conditions,
        ("", "ServiceAccount"): meta | {("secrets",): "name"},
        ("policy", "PodDisruptionBudget"): meta | conditions,
        ("autoscaling", "HorizontalPodAutoscaler"): meta | conditions,
    }
    for group, kind in [
        ("", "ConfigMap"),
        ("", "Secret"),
        ("", "Endpoints"),
        ("", "Event"),
        ("events.k8s.io", "Event"),
        ("discovery.k8s.io", "EndpointSlice"),
        ("coordination.k8s.io", "Lease"),
        ("apps", "ControllerRevision"),
        ("scheduling.k8s.io", "PriorityClass"),
        ("networking.k8s.io", "NetworkPolicy"),
    ]:
        tables[(group, kind)] = meta
    return MappingProxyType({k: MappingProxyType(v) for k, v in tables.items()})


_KINDS: Final = _kind_table()
_NO_MERGE_KEYS: Final[MergeKeys] = MappingProxyType({})


def merge_keys_for(group: str, kind: str) -> MergeKeys:
    """The strategic-merge table of a built-in kind; empty (never None) for kinds we do not know."""
    return _KINDS.get((group, kind), _NO_MERGE_KEYS)

"""Checks of a CustomResourceDefinition before it is stored and its resource starts being served.

Theory of operation: a CRD that is accepted becomes an API the server serves and prints, so the checks are the
ones that keep that safe: the object's name is ``<plural>.<group>``, so two CRDs cannot claim one resource;
names are DNS-safe, because they become URL path segments; exactly one version is stored; and every printer
column has a known type and a ``jsonPath`` that ``ambit.apiserver.jsonpath`` can evaluate, so ``kubectl get``
never meets a column the server cannot fill. Schemas are only required to be objects: custom resources keep
unknown fields, the server does not prune or validate against them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ambit.apiserver.jsonpath import JsonPathError, parse
from ambit.apiserver.names import (
    Cause,
    at,
    dns1123_label,
    dns1123_subdomain,
    duplicate,
    invalid,
    required,
    unsupported,
)

SCOPES = ("Cluster", "Namespaced")
COLUMN_TYPES = ("boolean", "date", "integer", "number", "string")
_KIND = re.compile(r"[A-Za-z]([-A-Za-z0-9]*[A-Za-z0-9])?")


def validate_crd(obj: Mapping[str, Any]) -> list[Cause]:
    causes: list[Cause] = []
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return [required("spec") if spec is None else invalid("spec", spec, "must be an object")]
    group = spec.get("group")
    if not isinstance(group, str) or not group:
        causes.append(required("spec.group"))
    else:
        causes.extend(invalid("spec.group", group, msg) for msg in dns1123_subdomain(group))
        if "." not in group:
            causes.append(invalid("spec.group", group, "should be a domain with at least one dot"))
    names = spec.get("names")
    plural = ""
    if not isinstance(names, Mapping):
        causes.append(required("spec.names") if names is None else invalid("spec.names", names, "must be an object"))
    else:
        raw_plural = names.get("plural")
        plural = raw_plural if isinstance(raw_plural, str) else ""
        causes.extend(_names(names))
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if plural and isinstance(group, str) and group and name != f"{plural}.{group}":
        causes.append(invalid("metadata.name", name, 'must be spec.names.plural+"."+spec.group'))
    scope = spec.get("scope")
    if scope not in SCOPES:
        causes.append(unsupported("spec.scope", scope, SCOPES) if scope is not None else required("spec.scope"))
    causes.extend(_versions(spec.get("versions")))
    return causes


def _names(names: Mapping[str, Any]) -> list[Cause]:
    causes: list[Cause] = []
    for key in ("plural", "singular"):
        value = names.get(key)
        path = at("spec.names", key)
        if value in (None, ""):
            if key == "plural":
                causes.append(required(path))
        elif not isinstance(value, str):
            causes.append(invalid(path, value, "must be a string"))
        else:
            causes.extend(invalid(path, value, msg) for msg in dns1123_label(value))
    for key in ("kind", "listKind"):
        value = names.get(key)
        path = at("spec.names", key)
        if value in (None, ""):
            if key == "kind":
                causes.append(required(path))
        elif not isinstance(value, str) or not _KIND.fullmatch(value) or len(value) > 63:
            causes.append(
                invalid(path, value, "may have mixed case, but should otherwise match: [a-z]([-a-z0-9]*[a-z0-9])?")
            )
    for key in ("shortNames", "categories"):
        value = names.get(key)
        if value is None:
            continue
        if not isinstance(value, list):
            causes.append(invalid(at("spec.names", key), value, "must be a list of strings"))
            continue
        for i, item in enumerate(value):
            path = at(at("spec.names", key), i)
            if not isinstance(item, str):
                causes.append(invalid(path, item, "must be a string"))
            else:
                causes.extend(invalid(path, item, msg) for msg in dns1123_label(item))
    return causes


def _versions(versions: Any) -> list[Cause]:
    if not isinstance(versions, list) or not versions:
        return [required("spec.versions") if not versions else invalid("spec.versions", versions, "must be a list")]
    causes: list[Cause] = []
    seen: set[str] = set()
    storage = 0
    for i, version in enumerate(versions):
        path = at("spec.versions", i)
        if not isinstance(version, Mapping):
            causes.append(invalid(path, version, "must be an object"))
            continue
        name = version.get("name")
        if not isinstance(name, str) or not name:
            causes.append(required(at(path, "name")))
        else:
            causes.extend(invalid(at(path, "name"), name, msg) for msg in dns1123_label(name))
            if name in seen:
                causes.append(duplicate(at(path, "name"), name))
            seen.add(name)
        for flag in ("served", "storage"):
            if not isinstance(version.get(flag), bool):
                causes.append(required(at(path, flag), "must be true or false"))
        storage += version.get("storage") is True
        schema = version.get("schema")
        openapi = schema.get("openAPIV3Schema") if isinstance(schema, Mapping) else None
        if not isinstance(openapi, Mapping):
            causes.append(required(at(at(path, "schema"), "openAPIV3Schema"), "schemas are required"))
        causes.extend(_printer_columns(version.get("additionalPrinterColumns"), at(path, "additionalPrinterColumns")))
    if storage != 1:
        causes.append(invalid("spec.versions", storage, "must have exactly one version marked as storage version"))
    return causes


def _printer_columns(columns: Any, path: str) -> list[Cause]:
    if columns is None:
        return []
    if not isinstance(columns, list):
        return [invalid(path, columns, "must be a list")]
    causes: list[Cause] = []
    for i, column in enumerate(columns):
        col_path = at(path, i)
        if not isinstance(column, Mapping):
            causes.append(invalid(col_path, column, "must be an object"))
            continue
        if not isinstance(column.get("name"), str) or not column.get("name"):
            causes.append(required(at(col_path, "name")))
        kind = column.get("type")
        if kind not in COLUMN_TYPES:
            causes.append(unsupported(at(col_path, "type"), kind, COLUMN_TYPES))
        json_path = column.get("jsonPath")
        if not isinstance(json_path, str) or not json_path:
            causes.append(required(at(col_path, "jsonPath")))
        else:
            try:
                parse(json_path)
            except JsonPathError as exc:
                causes.append(invalid(at(col_path, "jsonPath"), json_path, str(exc)))
        priority = column.get("priority")
        if priority is not None and (not isinstance(priority, int) or isinstance(priority, bool) or priority < 0):
            causes.append(invalid(at(col_path, "priority"), priority, "must be a non-negative integer"))
    return causes

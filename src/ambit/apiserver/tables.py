"""Server-side printing: the ``meta.k8s.io/v1`` ``Table`` that ``kubectl get`` asks for and prints verbatim.

kubectl sends ``Accept: application/json;as=Table;v=v1;g=meta.k8s.io,application/json`` and prints the
columns it gets back, upper-cased, hiding priority > 0 columns unless ``-o wide``. So what each kind shows is
decided here, in three ways:

1. Built-in kinds with a printer in :data:`ambit.apiserver.printers.PRINTERS` (Pod, Service, Deployment...) or
   :data:`ambit.apiserver.storage_printers.STORAGE_PRINTERS` (claims, volumes, storage classes).
2. Custom resources: the caller passes ``printer_columns``, the served version's
   ``additionalPrinterColumns`` (an empty sequence when the CRD has none). The table is Name, then those
   columns, each cell the first value its ``jsonPath`` selects; with no columns, Name and Age.
3. Anything else: Name and Created At, kube-apiserver's default.

Rules for custom resource cells, as the CRD table convertor applies them: a ``string`` column prints a string
as it is and anything else as compact JSON (a list of hosts shows as ``["a","b"]``); ``integer``, ``number``
and ``boolean`` columns keep JSON values of that type; ``date`` columns show the age of an RFC 3339
timestamp; a missing value, or one of the wrong type, is an empty cell.

Invariant: :func:`to_table` never raises for any JSON-shaped objects; only a bad ``include_object`` is
refused (400, as kube-apiserver does for an unknown ``includeObject``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ambit.apiserver import errors
from ambit.apiserver.cells import Cell, as_map, as_str, name_of, parse_timestamp, since
from ambit.apiserver.jsonpath import JsonPath, JsonPathError, parse
from ambit.apiserver.printers import AGE, DEFAULT, NAME, PRINTERS, Column, Printer
from ambit.apiserver.storage_printers import STORAGE_PRINTERS

INCLUDE_OBJECT_POLICIES = ("None", "Metadata", "Object")


def to_table(
    kind: str,
    group: str,
    objects: Sequence[Mapping[str, Any]],
    *,
    now: float,
    list_metadata: Mapping[str, Any],
    include_object: str = "Metadata",
    printer_columns: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """A ``Table`` of ``objects`` (one row each; a GET of one object passes a one-element sequence).

    ``printer_columns`` is None for built-in kinds and the CRD version's ``additionalPrinterColumns`` (possibly
    empty) for custom resources. ``list_metadata`` becomes the table's ``metadata`` (``resourceVersion``,
    ``continue``). ``include_object`` is the request's ``includeObject``: ``Metadata`` (default; a
    ``PartialObjectMetadata`` per row), ``Object`` (the whole object) or ``None``.
    """
    policy = include_object or "Metadata"
    if policy not in INCLUDE_OBJECT_POLICIES:
        raise errors.bad_request(
            f"includeObject={include_object!r} is not supported; use one of {', '.join(INCLUDE_OBJECT_POLICIES)}"
        )
    if printer_columns is not None:
        printer = custom_resource_printer(printer_columns)
    else:
        printer = PRINTERS.get((group, kind)) or STORAGE_PRINTERS.get((group, kind), DEFAULT)
    rows = []
    for obj in objects:
        row: dict[str, Any] = {"cells": printer.cells(obj, now)}
        if printer.conditions is not None and (conditions := printer.conditions(obj)):
            row["conditions"] = conditions
        if policy == "Object":
            row["object"] = obj
        elif policy == "Metadata":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": dict(as_map(obj.get("metadata"))),
            }
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": dict(list_metadata),
        "columnDefinitions": [column.to_json() for column in printer.columns],
        "rows": rows,
    }


_DEFAULT_CUSTOM_COLUMNS: tuple[Mapping[str, Any], ...] = (
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp", "description": AGE.description},
)


def custom_resource_printer(printer_columns: Sequence[Mapping[str, Any]]) -> Printer:
    """The printer for a custom resource version with these ``additionalPrinterColumns``."""
    specs = [as_map(c) for c in printer_columns] or list(_DEFAULT_CUSTOM_COLUMNS)
    columns = [NAME]
    paths: list[tuple[JsonPath | None, str]] = []
    for spec in specs:
        raw_path = as_str(spec.get("jsonPath"))
        path: JsonPath | None
        try:
            path = parse(raw_path)
        except JsonPathError:
            path = None  # CRD validation refuses such paths; one that slipped through prints empty cells
        kind = as_str(spec.get("type"), "string")
        priority = spec.get("priority")
        columns.append(
            Column(
                as_str(spec.get("name")),
                as_str(spec.get("description"))
                or f"Custom resource definition column (in JSONPath format): {raw_path}",
                type=kind,
                format=as_str(spec.get("format")),
                priority=priority if isinstance(priority, int) and not isinstance(priority, bool) else 0,
            )
        )
        paths.append((path, kind))

    def cells(obj: Mapping[str, Any], now: float) -> list[Cell]:
        row: list[Cell] = [name_of(obj)]
        for path, kind in paths:
            found = path.find(obj) if path is not None else []
            row.append(_custom_cell(kind, found[0], now) if found else None)
        return row

    return Printer(tuple(columns), cells)


def _custom_cell(kind: str, value: Any, now: float) -> Cell:
    if value is None:
        return None
    if kind == "string":
        if isinstance(value, str):
            return value
        if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
            return str(int(value))  # Go prints a whole float64 without ".0"
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    if kind == "integer":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        return int(value) if isinstance(value, float) and math.isfinite(value) else None
    if kind == "number":
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
    if kind == "boolean":
        return value if isinstance(value, bool) else None
    if kind == "date" and isinstance(value, str):
        return since(value, now) if parse_timestamp(value) is not None else "<invalid>"
    return None

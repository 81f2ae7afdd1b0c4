"""The proxy-status table: control planes' sync documents (``istio.io/debug/syncz``) in, rows out. Pure.

Theory of operation: each control plane answers with one JSON document (:meth:`ambit.xds.sync.SyncRegistry.document`)
listing its connected streams and, per type URL, the status it computed at ``generatedAt``. :func:`parse_document`
checks the shape and turns it into :class:`ProxySync` values; :func:`status_table` lays those out with istioctl
proxy-status's columns (NAME, CLUSTER, ISTIOD, VERSION), one column per type URL any proxy opened, and LAST PUSH.

Rules:

1. A document that is not the expected shape raises :class:`SyncDocumentError` naming the field; nothing is
   guessed.
2. Ages are measured on the control plane's own clock (``generatedAt`` minus the time sent), so the reader's
   clock skew does not matter.
3. NAME is the pod part of an Istio-style node id (``type~ip~pod.namespace~domain``), else the node id, else the
   caller's identity.
4. Type columns come in a fixed order for the types Ambit serves (addresses, authorization, waypoint, gateway),
   then any other type by URL; a proxy that did not open a type shows NOT SENT there.
5. Rows are sorted by NAME, then control plane, then stream.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ambit.errors import AmbitError

__all__ = ["ProxySync", "SyncDocumentError", "TypeStatus", "format_age", "parse_document", "status_table"]

TYPE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("type.googleapis.com/istio.workload.Address", "ADDRESSES"),
    ("type.googleapis.com/istio.security.Authorization", "AUTHORIZATION"),
    ("type.googleapis.com/ambit.waypoint.v1.WaypointConfig", "WAYPOINT"),
    ("type.googleapis.com/ambit.gateway.v1.GatewayConfig", "GATEWAY"),
)
NOT_SENT = "NOT SENT"


class SyncDocumentError(AmbitError):
    """A control plane's sync document is not the expected shape; the message names the field."""


@dataclass(frozen=True, slots=True)
class TypeStatus:
    status: str
    age: float | None
    """Seconds since the last response of this type was sent (rule 2); None when nothing was sent."""
    nonce: str = ""
    answered: str = ""
    error: str = ""


@dataclass(frozen=True, slots=True)
class ProxySync:
    """One connected proxy as one control plane sees it."""

    control_plane: str
    stream: int
    node: str
    identity: str
    cluster: str
    version: str
    last_push_age: float | None
    types: Mapping[str, TypeStatus]

    @property
    def name(self) -> str:
        """Rule 3."""
        parts = self.node.split("~")
        if len(parts) >= 3 and parts[2]:
            return parts[2]
        return self.node or self.identity


def parse_document(document: object) -> list[ProxySync]:
    """Rule 1: the proxies of one control plane's document."""
    doc = _mapping(document, "document")
    now = _number(doc.get("generatedAt"), "generatedAt")
    control_plane = _text(doc.get("controlPlane", ""), "controlPlane")
    clients = doc.get("clients")
    if not isinstance(clients, list):
        raise SyncDocumentError("clients: expected a list")
    proxies = []
    for index, raw in enumerate(clients):
        where = f"clients[{index}]"
        client = _mapping(raw, where)
        types_raw = _mapping(client.get("types", {}), f"{where}.types")
        types = {}
        for type_url, entry_raw in types_raw.items():
            entry = _mapping(entry_raw, f"{where}.types[{type_url!r}]")
            field = f"{where}.types[{type_url!r}]"
            sent_at = entry.get("sentAt")
            types[str(type_url)] = TypeStatus(
                status=_text(entry.get("status"), f"{field}.status"),
                age=None if sent_at is None else max(0.0, now - _number(sent_at, f"{field}.sentAt")),
                nonce=_text(entry.get("sentNonce", ""), f"{field}.sentNonce"),
                answered=_text(entry.get("answeredNonce", ""), f"{field}.answeredNonce"),
                error=_text(entry.get("error", ""), f"{field}.error"),
            )
        last = client.get("lastPushAt")
        stream = client.get("stream")
        if not isinstance(stream, int) or isinstance(stream, bool):
            raise SyncDocumentError(f"{where}.stream: expected an integer")
        proxies.append(
            ProxySync(
                control_plane=control_plane,
                stream=stream,
                node=_text(client.get("node", ""), f"{where}.node"),
                identity=_text(client.get("identity", ""), f"{where}.identity"),
                cluster=_text(client.get("cluster", ""), f"{where}.cluster"),
                version=_text(client.get("version", ""), f"{where}.version"),
                last_push_age=None if last is None else max(0.0, now - _number(last, f"{where}.lastPushAt")),
                types=types,
            )
        )
    return proxies


def format_age(seconds: float) -> str:
    """kubectl's style: ``4s``, ``2m3s``, ``1h2m``, ``3d4h``."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60}m"
    return f"{whole // 86400}d{whole % 86400 // 3600}h"


def type_columns(proxies: Sequence[ProxySync]) -> list[tuple[str, str]]:
    """Rule 4: (type URL, header) for every type any proxy opened."""
    seen = {t for p in proxies for t in p.types}
    known = [(url, header) for url, header in TYPE_COLUMNS if url in seen]
    named = {url for url, _ in TYPE_COLUMNS}
    others = sorted(seen - named)
    return known + [(url, url.rsplit("/", 1)[-1].rsplit(".", 1)[-1].upper()) for url in others]


def status_table(proxies: Sequence[ProxySync]) -> tuple[list[str], list[list[str]]]:
    """Headers and rows (rules 3-5)."""
    columns = type_columns(proxies)
    headers = ["NAME", "CLUSTER", "ISTIOD", "VERSION", *(h for _, h in columns), "LAST PUSH"]
    rows = []
    for proxy in sorted(proxies, key=lambda p: (p.name, p.control_plane, p.stream)):
        cells = [proxy.name, proxy.cluster or "-", proxy.control_plane or "-", proxy.version or "-"]
        for url, _ in columns:
            entry = proxy.types.get(url)
            if entry is None or entry.age is None or entry.status == NOT_SENT:
                cells.append(NOT_SENT)
            else:
                cells.append(f"{entry.status} ({format_age(entry.age)})")
        cells.append("-" if proxy.last_push_age is None else format_age(proxy.last_push_age))
        rows.append(cells)
    return headers, rows


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SyncDocumentError(f"{where}: expected an object")
    return value


def _text(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise SyncDocumentError(f"{where}: expected a string")
    return value


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SyncDocumentError(f"{where}: expected a number")
    return float(value)

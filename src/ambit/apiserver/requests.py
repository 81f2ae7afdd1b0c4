"""What a request brings to the verbs besides its object: who asks, how to delete, where a list continues.

Theory of operation: the HTTP shell turns a request into these values once; the verbs only read them.
``request_warnings`` is the one piece of per-request state that flows the other way: admission webhooks add
warnings deep inside a write, and the shell sends them back as ``Warning: 299`` headers. A continue token is the
list's resource version and the last (namespace, name) it returned, so the next page reads the same snapshot
until that version leaves the store's horizon (then ``410 Gone``).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ambit.apiserver import errors
from ambit.apiserver.store import StoredObject, decode, encode

JsonObject = dict[str, Any]


@dataclass(frozen=True, slots=True)
class User:
    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, list[str]] = field(default_factory=dict)

    def info(self) -> JsonObject:
        out: JsonObject = {"username": self.username, "groups": list(self.groups)}
        if self.uid:
            out["uid"] = self.uid
        if self.extra:
            out["extra"] = {k: list(v) for k, v in self.extra.items()}
        return out


@dataclass(frozen=True, slots=True)
class DeleteOptions:
    grace_period: int | None = None
    propagation: str = "Background"
    precondition_uid: str | None = None
    precondition_rv: str | None = None
    dry_run: bool = False

    @classmethod
    def from_body(cls, body: Any, query: Mapping[str, str]) -> DeleteOptions:
        options = body if isinstance(body, dict) else {}
        grace = options.get("gracePeriodSeconds", query.get("gracePeriodSeconds"))
        propagation = options.get("propagationPolicy") or query.get("propagationPolicy") or "Background"
        if options.get("orphanDependents") is True or query.get("orphanDependents") == "true":
            propagation = "Orphan"
        if propagation not in ("Background", "Foreground", "Orphan"):
            raise errors.bad_request(f"unknown propagationPolicy {propagation!r}")
        pre = options.get("preconditions") or {}
        if not isinstance(pre, dict):
            raise errors.bad_request("preconditions must be an object")
        dry = options.get("dryRun") or query.get("dryRun")
        try:
            grace_value = None if grace is None else int(grace)
        except (TypeError, ValueError):
            raise errors.bad_request(f"gracePeriodSeconds must be an integer, not {grace!r}") from None
        if grace_value is not None and grace_value < 0:
            grace_value = 0
        return cls(grace_value, propagation, pre.get("uid"), pre.get("resourceVersion"), bool(dry))


@dataclass(frozen=True, slots=True)
class ListResult:
    items: list[StoredObject]
    resource_version: int
    continue_token: str
    remaining: int | None


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


request_warnings: ContextVar[list[str] | None] = ContextVar("request_warnings", default=None)
"""Warnings for the client of the request being served (admission webhooks add them); the HTTP shell sends them
as ``Warning: 299`` headers."""


def warn(warnings: list[str]) -> None:
    sink = request_warnings.get()
    if sink is not None:
        sink.extend(warnings)


def encode_continue(start: tuple[str, str], rv: int) -> str:
    raw = encode({"v": 1, "rv": rv, "start": list(start)})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_continue(token: str) -> tuple[tuple[str, str], int]:
    try:
        data = decode(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        start = data["start"]
        return (str(start[0]), str(start[1])), int(data["rv"])
    except Exception:
        raise errors.bad_request("continue key is not valid") from None

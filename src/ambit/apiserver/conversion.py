"""Kinds served under two API groups from one storage: events.k8s.io/v1 Event is stored as core/v1 Event.

kube-apiserver keeps one copy of each Event and shows it through both APIs, so an Event written by a controller
through events.k8s.io appears in ``kubectl get events`` and ``kubectl describe``. The field names differ; the
mapping below is the whole difference (everything else, metadata included, is shared).
"""

from __future__ import annotations

from typing import Any

JsonObject = dict[str, Any]

# events.k8s.io/v1 field → core/v1 field
_EVENT_FIELDS = {
    "regarding": "involvedObject",
    "note": "message",
    "reportingController": "reportingComponent",
    "deprecatedSource": "source",
    "deprecatedFirstTimestamp": "firstTimestamp",
    "deprecatedLastTimestamp": "lastTimestamp",
    "deprecatedCount": "count",
}
_EVENT_FIELDS_BACK = {core: new for new, core in _EVENT_FIELDS.items()}


def event_to_core(obj: JsonObject) -> JsonObject:
    """An events.k8s.io/v1 Event in its stored (core/v1) form."""
    out = {_EVENT_FIELDS.get(k, k): v for k, v in obj.items()}
    out["apiVersion"] = "v1"
    out["kind"] = "Event"
    return out


def event_from_core(obj: JsonObject) -> JsonObject:
    """A stored (core/v1) Event as events.k8s.io/v1 shows it."""
    out = {_EVENT_FIELDS_BACK.get(k, k): v for k, v in obj.items()}
    out["apiVersion"] = "events.k8s.io/v1"
    out["kind"] = "Event"
    return out


def event_field_path(path: str) -> str:
    """A field-selector path of events.k8s.io/v1, in stored terms (``regarding.name`` → ``involvedObject.name``)."""
    head, dot, rest = path.partition(".")
    return _EVENT_FIELDS.get(head, head) + dot + rest

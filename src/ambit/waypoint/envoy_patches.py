"""Header edits from EnvoyFilters (:mod:`ambit.model.envoyfilter`), applied to a request or a response.

Rules (Envoy's header map and ``HeaderValueOption.append_action``):

1. ``APPEND`` adds one more value at the end; ``ADD_IF_ABSENT`` adds only when the name is absent;
   ``OVERWRITE`` replaces every value of the name with one, at the first one's position (added at the end when
   absent); ``OVERWRITE_IF_EXISTS`` does the same only when present; ``REMOVE`` drops every value.
2. Edits run one after the other, each seeing the previous one's result. Names are lower-case on both sides.
3. The edits were judged when the configuration arrived (:mod:`ambit.xds.envoy_patches`: tokens, no CR/LF/NUL,
   never ``host`` or a framing header), so nothing here can split a message or change its framing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from ambit.model.envoyfilter import HeaderAction, HeaderOp
from ambit.waypoint.decisions import RequestHead

__all__ = ["apply_header_ops", "edit_request"]


def _overwrite(headers: list[tuple[str, str]], name: str, value: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    placed = False
    for n, v in headers:
        if n != name:
            out.append((n, v))
        elif not placed:
            out.append((name, value))
            placed = True
    if not placed:
        out.append((name, value))
    return out


def apply_header_ops(headers: Iterable[tuple[str, str]], ops: Sequence[HeaderOp]) -> list[tuple[str, str]]:
    """``headers`` after ``ops`` (rules 1 and 2)."""
    out = list(headers)
    for op in ops:
        present = any(n == op.name for n, _ in out)
        if op.action is HeaderAction.APPEND or (op.action is HeaderAction.ADD_IF_ABSENT and not present):
            out.append((op.name, op.value))
        elif op.action is HeaderAction.OVERWRITE or (op.action is HeaderAction.OVERWRITE_IF_EXISTS and present):
            out = _overwrite(out, op.name, op.value)
        elif op.action is HeaderAction.REMOVE and present:
            out = [(n, v) for n, v in out if n != op.name]
    return out


def edit_request(request: RequestHead, ops: Sequence[HeaderOp]) -> RequestHead:
    """``request`` with ``ops`` applied to its headers (never its authority: rule 3)."""
    if not ops:
        return request
    return dataclasses.replace(request, headers=tuple(apply_header_ops(request.headers, ops)))

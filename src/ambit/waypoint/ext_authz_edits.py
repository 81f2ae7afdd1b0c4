"""What the headers of a gRPC authorizer's answer do (:mod:`ambit.waypoint.ext_authz` rule 11): the
``HeaderValueOption`` ``append`` and ``append_action`` of Envoy's ``ext_authz_grpc_impl.cc`` and ``ext_authz.cc``.

Theory of operation: pure. :func:`request_edit` turns one option of ``ok_response.headers`` into a
:class:`RequestEdit`, :func:`edit_request_headers` applies such edits to a request's headers;
:func:`response_op` turns one option of ``ok_response.response_headers_to_add`` or ``denied_response.headers``
into a response :class:`~ambit.model.envoyfilter.HeaderOp` (applied with the EnvoyFilter edits' own
:func:`~ambit.waypoint.envoy_patches.apply_header_ops`).

Rules:

1. On the request: ``append`` true joins the value to the header's first value with ``,`` (added when absent);
   ``append`` false overwrites (every value of the name replaced by this one, added when absent). With ``append``
   unset, ``append_action`` decides: ``ADD_IF_ABSENT`` adds only when absent, ``OVERWRITE_IF_EXISTS`` overwrites
   only when present, ``OVERWRITE_IF_EXISTS_OR_ADD`` overwrites; ``APPEND_IF_EXISTS_OR_ADD`` is the proto default
   and cannot be told from an option that sets nothing, which the API documents as ``append`` false for this
   message: it overwrites, so a client's own header of that name never survives beside the authorizer's.
2. On the response and on a denial's answer: ``append`` true adds one more value, false overwrites; unset, the
   action decides, ``APPEND_IF_EXISTS_OR_ADD`` (and so an option that sets nothing) adding one more value.
3. An unknown action overwrites (Envoy's fallback for an action it does not know).
4. Edits are applied one after the other, each seeing the previous one's result; names are lower-case.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ambit.model.envoyfilter import HeaderAction, HeaderOp
from ambit.waypoint.envoy_patches import apply_header_ops
from ambit.waypoint.ext_authz_wire import (
    ADD_IF_ABSENT,
    APPEND_IF_EXISTS_OR_ADD,
    OVERWRITE_IF_EXISTS,
    OVERWRITE_IF_EXISTS_OR_ADD,
    HeaderOption,
)

__all__ = ["RequestEdit", "Write", "edit_request_headers", "request_edit", "response_op"]

Headers = tuple[tuple[str, str], ...]


class Write(enum.Enum):
    """How one authorizer header is written on the request (rule 1)."""

    OVERWRITE = "overwrite"
    OVERWRITE_IF_EXISTS = "overwrite if exists"
    ADD_IF_ABSENT = "add if absent"
    JOIN = "join"
    """Joined to the first value with ``,`` (added when absent): the deprecated ``append`` true."""


@dataclass(frozen=True, slots=True)
class RequestEdit:
    """One header the authorizer writes on the forwarded request; ``name`` is lower-case."""

    name: str
    value: str
    write: Write = Write.OVERWRITE


_ACTIONS = {
    APPEND_IF_EXISTS_OR_ADD: HeaderAction.APPEND,
    ADD_IF_ABSENT: HeaderAction.ADD_IF_ABSENT,
    OVERWRITE_IF_EXISTS_OR_ADD: HeaderAction.OVERWRITE,
    OVERWRITE_IF_EXISTS: HeaderAction.OVERWRITE_IF_EXISTS,
}
_WRITES = {ADD_IF_ABSENT: Write.ADD_IF_ABSENT, OVERWRITE_IF_EXISTS: Write.OVERWRITE_IF_EXISTS}


def request_edit(option: HeaderOption) -> RequestEdit:
    """Rule 1."""
    if option.append is not None:
        write = Write.JOIN if option.append else Write.OVERWRITE
    else:
        write = _WRITES.get(option.action, Write.OVERWRITE)
    return RequestEdit(option.name.lower(), option.value, write)


def response_op(option: HeaderOption) -> HeaderOp:
    """Rule 2 (an allowed request's response, or a denial's answer) and rule 3."""
    if option.append is not None:
        action = HeaderAction.APPEND if option.append else HeaderAction.OVERWRITE
    else:
        action = _ACTIONS.get(option.action, HeaderAction.OVERWRITE)
    return HeaderOp(action, option.name.lower(), option.value)


def edit_request_headers(headers: Headers, edits: tuple[RequestEdit, ...]) -> Headers:
    """``headers`` after ``edits`` (rules 1 and 4)."""
    out = list(headers)
    for edit in edits:
        present = any(n == edit.name for n, _ in out)
        if edit.write is Write.JOIN and present:
            at = next(i for i, (n, _) in enumerate(out) if n == edit.name)
            out[at] = (edit.name, f"{out[at][1]},{edit.value}")
        elif edit.write is Write.JOIN or (edit.write is Write.ADD_IF_ABSENT and not present):
            out.append((edit.name, edit.value))
        elif edit.write is Write.OVERWRITE or (edit.write is Write.OVERWRITE_IF_EXISTS and present):
            out = apply_header_ops(out, (HeaderOp(HeaderAction.OVERWRITE, edit.name, edit.value),))
    return tuple(out)

"""Model EnvoyFilter patches ↔ ``ambit.waypoint.v1.EnvoyPatches`` (``proto/waypoint.proto``, WaypointConfig
field 11).

Rules of decoding (the waypoint judges what it was sent; the first problem raises
:class:`~ambit.xds.errors.XdsConversionError` naming the field):

1. A header name is a lower-case HTTP token and not ``host`` or a framing header; a value holds no CR, LF or NUL
   (values are written into requests and responses as they are); a removal carries no value.
2. An action this build does not know is refused (it would change what an edit does).
3. A scope's port is 0..65535 and its hostname printable; a route patch's level is 0 or 1; filters have no scope.
4. At most :data:`MAX_OPS` edits in all.
5. ``xff_trusted_hops``, when present, is at most :data:`~ambit.model.envoyfilter.MAX_TRUSTED_HOPS`.
"""

from __future__ import annotations

from collections.abc import Iterable

from ambit.api import waypoint_pb2 as pb
from ambit.model.envoyfilter import (
    EVERYWHERE,
    MAX_TRUSTED_HOPS,
    HeaderAction,
    HeaderOp,
    HeaderPatch,
    PatchScope,
    ProxyPatches,
)
from ambit.model.field_names import is_token
from ambit.model.header_rules import has_line_break, is_framing
from ambit.xds.convert import FieldReader

__all__ = ["MAX_OPS", "EnvoyPatchesReader", "envoy_patches_to_proto"]

MAX_OPS = 4096
_TO_PROTO = {
    HeaderAction.APPEND: pb.HEADER_APPEND,
    HeaderAction.ADD_IF_ABSENT: pb.HEADER_ADD_IF_ABSENT,
    HeaderAction.OVERWRITE: pb.HEADER_OVERWRITE,
    HeaderAction.OVERWRITE_IF_EXISTS: pb.HEADER_OVERWRITE_IF_EXISTS,
    HeaderAction.REMOVE: pb.HEADER_REMOVE,
}
_FROM_PROTO = {v: k for k, v in _TO_PROTO.items()}


def _scope(scope: PatchScope) -> pb.PatchScope:
    return pb.PatchScope(hostname=scope.hostname, port=scope.port)


def _ops(ops: Iterable[HeaderOp]) -> list[pb.HeaderOp]:
    return [pb.HeaderOp(action=_TO_PROTO[op.action], name=op.name, value=op.value) for op in ops]


def _patch(patch: HeaderPatch) -> pb.HeaderPatch:
    return pb.HeaderPatch(
        source=patch.source,
        request=_ops(patch.request),
        response=_ops(patch.response),
        scope=_scope(patch.scope),
        level=patch.level,
    )


def envoy_patches_to_proto(patches: ProxyPatches) -> pb.EnvoyPatches:
    out = pb.EnvoyPatches(
        filters=[_patch(p) for p in patches.filters],
        routes=[_patch(p) for p in patches.routes],
        upstream_h2=[_scope(s) for s in patches.upstream_h2],
    )
    if patches.xff_trusted_hops is not None:
        out.xff_trusted_hops = patches.xff_trusted_hops
    return out


class EnvoyPatchesReader(FieldReader):
    """Rules 1-4 for one resource."""

    def __init__(self, resource: str) -> None:
        super().__init__(resource)
        self.count = 0

    def op(self, field: str, message: pb.HeaderOp) -> HeaderOp:
        self.count += 1
        if self.count > MAX_OPS:
            raise self.fail(field, f"more than {MAX_OPS} header edits")
        action = _FROM_PROTO.get(message.action)
        if action is None:
            raise self.fail(f"{field}.action", f"unknown action {message.action}")
        if not _editable(message.name):
            raise self.fail(f"{field}.name", f"not a header name that may be edited: {message.name!r}")
        if has_line_break(message.value):
            raise self.fail(f"{field}.value", "a header value may not hold CR, LF or NUL")
        if action is HeaderAction.REMOVE and message.value:
            raise self.fail(f"{field}.value", "a removal has no value")
        return HeaderOp(action, message.name, message.value)

    def scope(self, field: str, message: pb.PatchScope) -> PatchScope:
        if message.port > 65535:
            raise self.fail(f"{field}.port", f"out of range 0..65535: {message.port}")
        return PatchScope(self.text(f"{field}.hostname", message.hostname), message.port)

    def patch(self, field: str, message: pb.HeaderPatch, *, route: bool) -> HeaderPatch:
        if message.level > 1 or (message.level and not route):
            raise self.fail(f"{field}.level", f"unknown level {message.level}")
        scope = self.scope(f"{field}.scope", message.scope)
        if not route and scope != EVERYWHERE:
            raise self.fail(f"{field}.scope", "a filter applies everywhere")
        return HeaderPatch(
            self.text(f"{field}.source", message.source),
            tuple(self.op(f"{field}.request[{i}]", m) for i, m in enumerate(message.request)),
            tuple(self.op(f"{field}.response[{i}]", m) for i, m in enumerate(message.response)),
            scope,
            message.level,
        )

    def patches(self, field: str, message: pb.EnvoyPatches) -> ProxyPatches:
        return ProxyPatches(
            tuple(self.patch(f"{field}.filters[{i}]", m, route=False) for i, m in enumerate(message.filters)),
            tuple(self.patch(f"{field}.routes[{i}]", m, route=True) for i, m in enumerate(message.routes)),
            tuple(self.scope(f"{field}.upstream_h2[{i}]", m) for i, m in enumerate(message.upstream_h2)),
            self.hops(f"{field}.xff_trusted_hops", message.xff_trusted_hops)
            if message.HasField("xff_trusted_hops")
            else None,
        )

    def hops(self, field: str, value: int) -> int:
        if value > MAX_TRUSTED_HOPS:
            raise self.fail(field, f"more than {MAX_TRUSTED_HOPS} trusted hops: {value}")
        return value


def _editable(name: str) -> bool:
    """A name the control plane sends: a lower-case token, neither the authority nor a framing header."""
    return is_token(name) and name == name.lower() and name != "host" and not is_framing(name)

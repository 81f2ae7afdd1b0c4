"""Reading the values of EnvoyFilter patches Ambit honours, from their plain API form (Envoy's JSON field names,
snake or camel case) into :mod:`ambit.model.envoyfilter` terms: the header lists of a route-configuration or
virtual-host merge, a Lua filter's header edits, a cluster merge's HTTP/2 options and an HTTP connection manager
merge. Which patches are read, where and with what match, is
:mod:`ambit.controlplane.translate.envoyfilter_patches`'s business. A value Ambit cannot honour raises
:class:`PatchRefused` with the field and why; the patch is then noted, not applied.

Rules:

1. A header Ambit writes or removes is named by a token, never a pseudo-header, ``host`` or a framing header; a
   value holds no CR, LF or NUL. Values in route and virtual-host merges are read by Envoy's formatter: ``%%`` is
   one ``%``, and any other ``%`` (a substitution) is refused; Lua values are taken as written.
2. A header list entry (``HeaderValueOption``) has ``header.key``, ``header.value``, and ``append`` or
   ``append_action`` (not both; neither: append) and ``keep_empty_value``; an empty value without
   ``keep_empty_value`` adds nothing, as in Envoy. Only the four header lists may be merged.
3. HTTP filters: ``envoy.lua`` / ``envoy.filters.http.lua`` of type :data:`LUA_TYPE` whose ``inlineCode`` is in
   :mod:`ambit.model.lua_headers`'s subset, and nothing else in its config.
4. A cluster merge sets ``http2_protocol_options``, or ``typed_extension_protocol_options`` holding only
   :data:`HTTP_OPTIONS_KEY` with an explicit HTTP/2 config, and nothing else.
5. An HTTP connection manager merge is a ``typed_config`` of :data:`HCM_TYPE` setting ``xff_num_trusted_hops``
   (0 to :data:`~ambit.model.envoyfilter.MAX_TRUSTED_HOPS`) and ``normalize_path: true`` (what the gateway does
   anyway), nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ambit.controlplane.translate import shapes
from ambit.controlplane.translate.envoyfilter_routes import HEADER_LISTS
from ambit.model.envoyfilter import MAX_TRUSTED_HOPS, HeaderAction, HeaderOp, HeaderPatch
from ambit.model.errors import LuaSubsetError
from ambit.model.field_names import is_token
from ambit.model.header_rules import has_line_break, is_framing
from ambit.model.lua_headers import parse_header_script

__all__ = [
    "HCM_TYPE",
    "HTTP_OPTIONS_KEY",
    "LUA_NAMES",
    "LUA_TYPE",
    "PatchRefused",
    "check_h2_options",
    "read_hcm_merge",
    "read_header_merge",
    "read_lua",
]

HCM_TYPE = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
LUA_NAMES = frozenset({"envoy.lua", "envoy.filters.http.lua"})
LUA_TYPE = "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua"
HTTP_OPTIONS_KEY = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"

_APPEND_ACTIONS = {a.value: a for a in HeaderAction if a is not HeaderAction.REMOVE}


class PatchRefused(Exception):
    """A patch Ambit does not honour: the reason names the field."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _header_name(name: object, at: str) -> str:
    if not isinstance(name, str) or not is_token(name):
        raise PatchRefused(f"{at}: {name!r} is not a header name Ambit edits (a token; no pseudo-headers)")
    if name.lower() == "host" or is_framing(name):
        raise PatchRefused(f"{at}: {name!r} is the request's authority or a framing header")
    return name.lower()


def _header_value(value: object, at: str, *, formatted: bool = True) -> str:
    """A value to write; ``formatted``: Envoy's formatter reads it (``%%`` is one ``%``), as in a route's headers
    but not in Lua."""
    if not isinstance(value, str):
        raise PatchRefused(f"{at}: expected a string")
    if has_line_break(value):
        raise PatchRefused(f"{at}: a header value may not hold CR, LF or NUL")
    if not formatted:
        return value
    if "%" in value.replace("%%", ""):
        raise PatchRefused(f"{at}: %-substitutions (Envoy's formatter) are not supported")
    return value.replace("%%", "%")


def _ops(script_ops: Iterable[HeaderOp], at: str) -> tuple[HeaderOp, ...]:
    return tuple(
        HeaderOp(op.action, _header_name(op.name, at), _header_value(op.value, at, formatted=False))
        for op in script_ops
    )


def _header_option(raw: object, at: str) -> HeaderOp | None:
    """One ``HeaderValueOption``; None: an empty value Envoy would not add."""
    option = shapes.mapping(raw, at)
    unknown = set(option) - {"header", "append", "append_action", "appendAction", "keep_empty_value", "keepEmptyValue"}
    if unknown:
        raise PatchRefused(f"{at}: {', '.join(sorted(unknown))} not supported")
    header = shapes.mapping(option.get("header"), f"{at}.header", required=True)
    if set(header) - {"key", "value"}:
        raise PatchRefused(f"{at}.header: only key and value are supported")
    name = _header_name(header.get("key"), f"{at}.header.key")
    value = _header_value(header.get("value", ""), f"{at}.header.value")
    append, action_text = option.get("append"), option.get("append_action", option.get("appendAction"))
    if append is not None and action_text is not None:
        raise PatchRefused(f"{at}: append and append_action may not both be set (Envoy refuses it)")
    if action_text is not None:
        action = _APPEND_ACTIONS.get(str(action_text))
        if action is None:
            raise PatchRefused(f"{at}.append_action: unknown action {action_text!r}")
    elif append is not None:
        if not isinstance(append, bool):
            raise PatchRefused(f"{at}.append: expected a boolean")
        action = HeaderAction.APPEND if append else HeaderAction.OVERWRITE
    else:
        action = HeaderAction.APPEND
    keep = option.get("keep_empty_value", option.get("keepEmptyValue", False))
    if not value and keep is not True:
        return None
    return HeaderOp(action, name, value)


def read_header_merge(value: Mapping[str, Any], at: str) -> tuple[tuple[HeaderOp, ...], tuple[HeaderOp, ...]]:
    if not value:
        raise PatchRefused(f"{at}: an empty merge changes nothing")
    unknown = set(value) - set(HEADER_LISTS)
    if unknown:
        raise PatchRefused(f"{at}: merging {', '.join(sorted(unknown))} is not supported (only the header lists)")
    sides: dict[str, list[HeaderOp]] = {"request": [], "response": []}
    for key, raw in value.items():
        side, remove = HEADER_LISTS[key]
        for i, item in enumerate(shapes.list_of(raw, f"{at}.{key}")):
            if remove:
                sides[side].append(HeaderOp(HeaderAction.REMOVE, _header_name(item, f"{at}.{key}[{i}]")))
            elif (op := _header_option(item, f"{at}.{key}[{i}]")) is not None:
                sides[side].append(op)
    return tuple(sides["request"]), tuple(sides["response"])


def check_h2_options(value: Mapping[str, Any], at: str) -> None:
    """Rule 4: a cluster merge's ``http2_protocol_options``, or the typed HTTP options with an explicit HTTP/2
    config; anything else is refused."""
    keys = set(value)
    if keys and keys <= {"http2_protocol_options", "http2ProtocolOptions"}:
        return
    if keys and keys <= {"typed_extension_protocol_options", "typedExtensionProtocolOptions"}:
        typed = shapes.mapping(next(iter(value.values())), f"{at}.typed_extension_protocol_options")
        options = shapes.mapping(typed.get(HTTP_OPTIONS_KEY), f"{at}.typed_extension_protocol_options")
        explicit = shapes.mapping(
            options.get("explicit_http_config", options.get("explicitHttpConfig")), f"{at}.explicit_http_config"
        )
        only_explicit = set(options) - {"@type"} <= {"explicit_http_config", "explicitHttpConfig"}
        h2 = set(explicit) & {"http2_protocol_options", "http2ProtocolOptions"}
        if set(typed) == {HTTP_OPTIONS_KEY} and only_explicit and h2:
            return
    raise PatchRefused(f"{at}: only http2_protocol_options is honoured in a cluster merge")


def read_lua(value: Mapping[str, Any], at: str) -> HeaderPatch:
    name = shapes.text(value.get("name"), f"{at}.name")
    typed = shapes.mapping(value.get("typed_config", value.get("typedConfig")), f"{at}.typed_config")
    kind = shapes.text(typed.get("@type"), f"{at}.typed_config.@type")
    if name not in LUA_NAMES and kind != LUA_TYPE:
        raise PatchRefused(f"{at}: HTTP filter {name or kind!r} is not run by Ambit (only envoy.lua header edits)")
    if kind != LUA_TYPE:
        raise PatchRefused(f"{at}.typed_config: expected {LUA_TYPE}")
    if set(typed) - {"@type", "inlineCode", "inline_code"}:
        raise PatchRefused(f"{at}.typed_config: only inlineCode is supported")
    code = typed.get("inlineCode", typed.get("inline_code", ""))
    if not isinstance(code, str):
        raise PatchRefused(f"{at}.typed_config.inlineCode: expected a string")
    try:
        script = parse_header_script(code)
    except LuaSubsetError as exc:
        raise PatchRefused(f"{at}.typed_config.inlineCode: not run, outside the header-edit subset: {exc}") from None
    return HeaderPatch("", _ops(script.request, f"{at}.inlineCode"), _ops(script.response, f"{at}.inlineCode"))


def read_hcm_merge(value: Mapping[str, Any], at: str) -> int | None:
    """The HTTP connection manager fields Ambit honours in a merge (rule 5): ``xff_num_trusted_hops``, and
    ``normalize_path: true`` (what the gateway always does); anything else is refused."""
    typed = shapes.mapping(value.get("typed_config", value.get("typedConfig")), f"{at}.typed_config")
    if set(value) - {"typed_config", "typedConfig"} or shapes.text(typed.get("@type"), f"{at}.@type") != HCM_TYPE:
        raise PatchRefused(f"{at}: only a typed_config of {HCM_TYPE} is honoured")
    fields = {k: v for k, v in typed.items() if k != "@type"}
    hops: int | None = None
    for key, raw in fields.items():
        if key in ("xff_num_trusted_hops", "xffNumTrustedHops"):
            if not isinstance(raw, int) or isinstance(raw, bool) or not 0 <= raw <= MAX_TRUSTED_HOPS:
                raise PatchRefused(f"{at}.typed_config.{key}: expected an integer from 0 to {MAX_TRUSTED_HOPS}")
            hops = raw
        elif key in ("normalize_path", "normalizePath") and raw is True:
            continue
        else:
            raise PatchRefused(
                f"{at}.typed_config.{key}: not honoured (only xff_num_trusted_hops, normalize_path: true)"
            )
    return hops

"""The functions a template may call: Go's built-ins, the sprig functions Istio's templates use, and Istio's own
(``pkg/kube/inject``: ``annotation``, ``valueOrDefault``, ``toJsonMap``, ``strdict``, ``omit``, ``omitNil``,
``protoToJSON``, a first-line-keeping ``indent``, a flipped ``contains``...). Pure.

Rules:

1. :data:`FUNCS` maps a name to its arity and its code; a call with the wrong number of arguments, or an argument
   of the wrong kind, raises :class:`FuncError`, which the executor reports with the command's position.
2. ``and`` and ``or`` are not here: they evaluate their arguments lazily, in :mod:`.execute`.
3. Nothing here allocates past :data:`MAX_RESULT` characters: ``indent`` counts are capped at :data:`MAX_INDENT`,
   the size of what ``indent``, ``nindent``, ``replace`` and ``printf`` would build is computed before it is built,
   and every string result is measured before it is returned.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import yaml

try:
    from yaml import CSafeDumper as SafeDumper
except ImportError:  # PyYAML built without libyaml
    from yaml import SafeDumper  # type: ignore[assignment]

from ambit.controlplane.gateway.gotemplate.values import Message, go_json, go_print, plain, truth

__all__ = ["FUNCS", "MAX_INDENT", "MAX_RESULT", "Func", "FuncError"]

MAX_INDENT: Final = 1024
MAX_RESULT: Final = 1 << 20


class FuncError(Exception):
    """A function refused its arguments; the executor turns it into a TemplateError."""


@dataclass(frozen=True, slots=True)
class Func:
    least: int
    most: int | None
    code: Callable[..., Any]


def _string(value: Any, what: str = "argument") -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool | int | float):
        return go_print(value)
    raise FuncError(f"{what}: expected a string, got {_kind(value)}")


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise FuncError(f"expected an integer, got {_kind(value)}")
    try:
        return int(value)
    except ValueError:
        raise FuncError(f"expected an integer, got {str(value)[:40]!r}") from None


def _kind(value: Any) -> str:
    if value is None:
        return "nil"
    if isinstance(value, Message | Mapping):
        return "map"
    if isinstance(value, list | tuple):
        return "list"
    return {bool: "bool", int: "int", float: "float64", str: "string"}.get(type(value), type(value).__name__)


def _str_map(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping | Message):
        raise FuncError(f"expected a map of strings, got {_kind(value)}")
    fields = value.fields if isinstance(value, Message) else value
    return {str(key): _string(item, f"map value {key!r}") for key, item in fields.items()}


def _checked(text: str) -> str:
    if len(text) > MAX_RESULT:
        raise FuncError(f"result of {len(text)} characters, more than {MAX_RESULT}")
    return text


def _go_quote(text: str) -> str:
    """``strconv.Quote``: printable characters kept, the rest escaped."""
    out = ['"']
    for char in text:
        code = ord(char)
        if char in '"\\':
            out.append("\\" + char)
        elif char in "\a\b\f\n\r\t\v":
            out.append("\\" + "abfnrtv"["\a\b\f\n\r\t\v".index(char)])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif not char.isprintable() and char != " ":
            out.append(f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def _empty(value: Any) -> bool:
    return not truth(value) if not isinstance(value, Message) else not value.fields


def _default(default: Any, *given: Any) -> Any:
    return default if not given or _empty(given[0]) else given[0]


def _quote(*values: Any) -> str:
    return _checked(" ".join(_go_quote(go_print(value)) for value in values if value is not None))


def _squote(*values: Any) -> str:
    return _checked(" ".join(f"'{go_print(value)}'" for value in values if value is not None))


def _fits(size: int) -> None:
    if size > MAX_RESULT:
        raise FuncError(f"result of {size} characters, more than {MAX_RESULT}")


def _indent(spaces: Any, source: Any) -> str:
    """Istio's ``indent``: every line but the first."""
    count, text = _count(spaces), _string(source)
    _fits(len(text) + count * text.count("\n"))
    return text.replace("\n", "\n" + " " * count)


def _nindent(spaces: Any, source: Any) -> str:
    """Sprig's ``nindent``: a newline, then every line indented."""
    count, text = _count(spaces), _string(source)
    _fits(1 + len(text) + count * (text.count("\n") + 1))
    pad = " " * count
    return "\n" + pad + text.replace("\n", "\n" + pad)


def _count(spaces: Any) -> int:
    count = _int(spaces)
    if not 0 <= count <= MAX_INDENT:
        raise FuncError(f"indent of {count} spaces, expected 0 to {MAX_INDENT}")
    return count


def _to_yaml(value: Any) -> str:
    if value is None:
        return "null\n"
    dumped = yaml.dump(
        plain(value), Dumper=SafeDumper, default_flow_style=False, sort_keys=True, allow_unicode=True, width=1 << 30
    )
    return _checked(dumped.removesuffix("...\n") if not isinstance(value, Mapping | list) else dumped)


def _omit_nil(value: Any) -> Any:
    value = plain(value)
    if isinstance(value, dict):
        out = {key: kept for key, item in value.items() if (kept := _omit_nil(item)) is not None}
        return out or None
    if isinstance(value, list):
        items = [kept for item in value if (kept := _omit_nil(item)) is not None]
        return items or None
    return value


def _strdict(*pairs: Any) -> dict[str, str]:
    strings = [_string(item) for item in pairs]
    out = {strings[index]: strings[index + 1] for index in range(0, len(strings) - 1, 2)}
    if len(strings) % 2:
        out[strings[-1]] = ""
    return out


def _dict(*pairs: Any) -> dict[str, Any]:
    out = {_string(pairs[index]): pairs[index + 1] for index in range(0, len(pairs) - 1, 2)}
    if len(pairs) % 2:
        out[_string(pairs[-1])] = ""
    return out


def _omit(mapping: Any, *keys: Any) -> dict[str, str]:
    dropped = {_string(key) for key in keys}
    return {key: item for key, item in _str_map(mapping).items() if key not in dropped}


def _merge(*maps: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for mapping in maps:
        out.update(_str_map(mapping))
    return out


def _annotation(meta: Any, name: Any, default: Any) -> str:
    annotations = _lookup(meta, "Annotations")
    key = _string(name)
    if isinstance(annotations, Mapping) and key in annotations:
        return _string(annotations[key])
    return go_print(default, "<nil>")


def _lookup(value: Any, name: str) -> Any:
    if isinstance(value, Message):
        return value.get(name)
    return value.get(name) if isinstance(value, Mapping) else None


def _index(item: Any, *keys: Any) -> Any:
    for key in keys:
        if item is None:
            raise FuncError("index of untyped nil")
        if isinstance(item, Mapping | Message):
            item = _lookup(item, _string(key))
        elif isinstance(item, list | tuple | str):
            position = key if isinstance(key, int) and not isinstance(key, bool) else None
            if position is None:
                raise FuncError(f"cannot index a {_kind(item)} with {_kind(key)}")
            if not 0 <= position < len(item):
                raise FuncError(f"index out of range: {position}")
            item = item[position] if not isinstance(item, str) else ord(item[position])
        else:
            raise FuncError(f"can't index item of type {_kind(item)}")
    return item


def _len(item: Any) -> int:
    if isinstance(item, Message):
        return len(item.fields)
    if isinstance(item, str | list | tuple | Mapping):
        return len(item)
    raise FuncError(f"len of {_kind(item)}")


def _comparable(a: Any, b: Any) -> tuple[Any, Any]:
    numbers = (int, float)
    if isinstance(a, bool) != isinstance(b, bool) or (
        isinstance(a, numbers) != isinstance(b, numbers) or isinstance(a, str) != isinstance(b, str)
    ):
        raise FuncError(f"incompatible types for comparison: {_kind(a)} and {_kind(b)}")
    if isinstance(a, list | tuple | Mapping | Message):
        raise FuncError(f"non-comparable type {_kind(a)}")
    return a, b


def _eq(first: Any, *others: Any) -> bool:
    if not others:
        raise FuncError("missing argument for comparison")
    for other in others:
        if first is None or other is None:
            if first is other:
                return True
            continue
        a, b = _comparable(first, other)
        if a == b:
            return True
    return False


def _ordered(name: str, check: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    def compare(a: Any, b: Any) -> bool:
        a, b = _comparable(a, b)
        if isinstance(a, bool) or a is None:
            raise FuncError(f"invalid type for {name}: {_kind(a)}")
        return check(a, b)

    return compare


def _printf(form: Any, *args: Any) -> str:
    """``fmt.Sprintf`` for the verbs ``%s %d %v %q %%`` (enough for labels and names)."""
    values = list(args)
    size = 0

    def one(match: re.Match[str]) -> str:
        nonlocal size
        verb = match.group(1)
        if verb == "%":
            piece = "%"
        elif not values:
            piece = f"%!{verb}(MISSING)"
        else:
            value = values.pop(0)
            piece = _go_quote(go_print(value)) if verb == "q" else go_print(value, "<nil>")
        size += len(piece)
        _fits(size)
        return piece

    return _checked(re.sub(r"%([sdvq%])", one, _string(form)))


def _to_string(value: Any) -> str:
    return go_print(value, "<nil>")


def _b64enc(value: Any) -> str:
    return _checked(base64.b64encode(_string(value).encode()).decode())


def _from_json(text: Any) -> Any:
    import json

    try:
        return json.loads(_string(text))
    except ValueError:
        return "{}"


def _list(*items: Any) -> list[Any]:
    return list(items)


def _has_key(mapping: Any, key: Any) -> bool:
    fields = mapping.fields if isinstance(mapping, Message) else mapping
    return isinstance(fields, Mapping) and _string(key) in fields


def _join(sep: Any, items: Any) -> str:
    if not isinstance(items, list | tuple):
        return _string(items)
    return _checked(_string(sep).join(go_print(item, "") for item in items))


def _split_list(sep: Any, text: Any) -> list[str]:
    separator = _string(sep)
    if not separator:
        raise FuncError("splitList: empty separator")
    return _string(text).split(separator)


def _ternary(yes: Any, no: Any, condition: Any) -> Any:
    return yes if truth(condition) else no


def _coalesce(*values: Any) -> Any:
    return next((value for value in values if not _empty(value)), None)


def _value_or_default(value: Any, default: Any) -> Any:
    return default if value is None or value == "" else value


def _replace(old: Any, new: Any, text: Any) -> str:
    before, after, source = _string(old), _string(new), _string(text)
    _fits(len(source) + source.count(before) * max(len(after) - len(before), 0))
    return source.replace(before, after)


def _string_func(code: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        return code(*(_string(arg) for arg in args))

    return call


FUNCS: Final[Mapping[str, Func]] = {
    # Go's built-ins (``and``/``or`` are the executor's, rule 2).
    "not": Func(1, 1, lambda value: not truth(value)),
    "len": Func(1, 1, _len),
    "index": Func(1, None, _index),
    "eq": Func(1, None, _eq),
    "ne": Func(2, 2, lambda a, b: not _eq(a, b)),
    "lt": Func(2, 2, _ordered("lt", lambda a, b: a < b)),
    "le": Func(2, 2, _ordered("le", lambda a, b: a <= b)),
    "gt": Func(2, 2, _ordered("gt", lambda a, b: a > b)),
    "ge": Func(2, 2, _ordered("ge", lambda a, b: a >= b)),
    "print": Func(0, None, lambda *values: _checked("".join(go_print(value, "<nil>") for value in values))),
    "println": Func(0, None, lambda *values: _checked(" ".join(go_print(v, "<nil>") for v in values) + "\n")),
    "printf": Func(1, None, _printf),
    # sprig
    "quote": Func(0, None, _quote),
    "squote": Func(0, None, _squote),
    "default": Func(1, 2, _default),
    "empty": Func(1, 1, _empty),
    "coalesce": Func(0, None, _coalesce),
    "ternary": Func(3, 3, _ternary),
    "nindent": Func(2, 2, _nindent),
    "toYaml": Func(1, 1, _to_yaml),
    "toJson": Func(1, 1, lambda value: _checked(go_json(value))),
    "toString": Func(1, 1, _to_string),
    "int": Func(1, 1, _int),
    "hasPrefix": Func(2, 2, _string_func(lambda prefix, text: text.startswith(prefix))),
    "hasSuffix": Func(2, 2, _string_func(lambda suffix, text: text.endswith(suffix))),
    "trimPrefix": Func(2, 2, _string_func(lambda prefix, text: text.removeprefix(prefix))),
    "trimSuffix": Func(2, 2, _string_func(lambda suffix, text: text.removesuffix(suffix))),
    "trim": Func(1, 1, _string_func(str.strip)),
    "lower": Func(1, 1, _string_func(str.lower)),
    "upper": Func(1, 1, _string_func(str.upper)),
    "toUpper": Func(1, 1, _string_func(str.upper)),
    "replace": Func(3, 3, _replace),
    "join": Func(2, 2, _join),
    "splitList": Func(2, 2, _split_list),
    "list": Func(0, None, _list),
    "dict": Func(0, None, _dict),
    "hasKey": Func(2, 2, _has_key),
    "b64enc": Func(1, 1, _b64enc),
    # Istio's (pkg/kube/inject), which win over sprig's of the same name
    "annotation": Func(3, 3, _annotation),
    "valueOrDefault": Func(2, 2, _value_or_default),
    "toJSON": Func(1, 1, lambda value: go_json(_str_map(value))),
    "fromJSON": Func(1, 1, _from_json),
    "structToJSON": Func(1, 1, lambda value: _checked(go_json(value if value is not None else {}))),
    "protoToJSON": Func(1, 1, lambda value: _checked(go_json(value if value is not None else {}))),
    "indent": Func(2, 2, _indent),
    "contains": Func(2, 2, _string_func(lambda needle, haystack: needle in haystack)),
    "toLower": Func(1, 1, _string_func(str.lower)),
    "omit": Func(1, None, _omit),
    "strdict": Func(0, None, _strdict),
    "toJsonMap": Func(0, None, lambda *maps: _checked(go_json(_merge(*maps)))),
    "mergeMaps": Func(0, None, _merge),
    "omitNil": Func(1, 1, _omit_nil),
    "isset": Func(2, 2, _has_key),
}
"""Rule 1."""

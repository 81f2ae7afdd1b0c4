"""The small JSONPath dialect that CRD ``additionalPrinterColumns`` use, parsed once and evaluated many times.

Theory of operation: a path is a chain of steps applied to a list of current nodes, starting from ``[root]``.
Each step maps every node to zero or more successors; a node a step cannot apply to (a missing key, an index out
of range, a field of a list) simply yields nothing, because kube-apiserver evaluates printer columns with
"allow missing keys" and shows an empty cell instead of failing the request.

Supported forms (a CRD's ``jsonPath`` is written without the ``{...}`` braces, which are accepted anyway)::

    .a.b                     fields
    .a['x.y/z'] .a["k"]      quoted keys, for annotation and label keys containing dots
    .a[0] .a[-1]             list indices (negative counts from the end)
    .a[*] .a.*               every element of a list, every value of a map (in key order)
    .a[?(@.type=="Ready")]   elements whose sub-path equals (or ``!=``) a string or number literal
    .a[?(@.ready)]           elements where the sub-path exists

Invariant: :meth:`JsonPath.find` never raises on any JSON-shaped input; only :func:`parse` raises, with
:class:`JsonPathError`, for text outside the dialect.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ambit.errors import AmbitError


class JsonPathError(AmbitError, ValueError):
    """The text is not a path in the supported dialect (a local mistake: a bad CRD column, not a peer's)."""


@dataclass(frozen=True, slots=True)
class Field:
    name: str


@dataclass(frozen=True, slots=True)
class Index:
    index: int


@dataclass(frozen=True, slots=True)
class Wildcard:
    pass


@dataclass(frozen=True, slots=True)
class Filter:
    path: JsonPath
    op: str  # "==", "!=", or "exists"
    literal: str | int | float | bool | None


Step = Field | Index | Wildcard | Filter


@dataclass(frozen=True, slots=True)
class JsonPath:
    text: str
    steps: tuple[Step, ...]

    def find(self, root: Any) -> list[Any]:
        """Every value the path selects from ``root``, in document order; empty when nothing matches."""
        nodes = [root]
        for step in self.steps:
            nodes = [found for node in nodes for found in _apply(step, node)]
            if not nodes:
                break
        return nodes

    def first(self, root: Any, default: Any = None) -> Any:
        found = self.find(root)
        return found[0] if found else default


def _apply(step: Step, node: Any) -> list[Any]:
    if isinstance(step, Field):
        if isinstance(node, Mapping) and step.name in node:
            return [node[step.name]]
        return []
    if isinstance(step, Index):
        if _is_list(node) and -len(node) <= step.index < len(node):
            return [node[step.index]]
        return []
    if isinstance(step, Wildcard):
        if _is_list(node):
            return list(node)
        if isinstance(node, Mapping):
            return [node[key] for key in sorted(node, key=str)]
        return []
    if not _is_list(node):
        return []
    return [item for item in node if _matches(step, item)]


def _matches(step: Filter, item: Any) -> bool:
    found = step.path.find(item)
    if step.op == "exists":
        return bool(found)
    equal = bool(found) and _same(found[0], step.literal)
    return equal if step.op == "==" else not equal


def _same(value: Any, literal: Any) -> bool:
    # Booleans are not numbers here, although Python thinks True == 1.
    if isinstance(literal, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(literal, bool) and value is literal
    if isinstance(literal, int | float):
        return isinstance(value, int | float) and value == literal
    return bool(value == literal)


def _is_list(node: Any) -> bool:
    return isinstance(node, Sequence) and not isinstance(node, str | bytes)


_NAME = re.compile(r"[^.\[\]\s]+")
_INDEX = re.compile(r"\[\s*(-?\d+)\s*\]")
_QUOTED_KEY = re.compile(r"""\[\s*(?:'([^']*)'|"([^"]*)")\s*\]""")
_STAR = re.compile(r"\[\s*\*\s*\]")
_FILTER = re.compile(
    r"""\[\s*\?\(\s*@((?:\.[-\w/]+|\[[^\]]*\])*)\s*"""
    r"""(?:(==|!=)\s*('[^']*'|"[^"]*"|-?\d+(?:\.\d+)?|true|false|null)\s*)?\)\s*\]"""
)


def parse(text: str) -> JsonPath:
    """Parse ``text`` (``.spec.hosts``, ``{.status.conditions[?(@.type=="Ready")].status}``...)."""
    body = text.strip()
    if body.startswith("{") and body.endswith("}"):
        body = body[1:-1].strip()
    if body in ("", "."):
        return JsonPath(text, ())
    if not body.startswith((".", "[")):
        raise JsonPathError(f"jsonpath {text!r} must start with '.' or '['")
    steps: list[Step] = []
    pos = 0
    while pos < len(body):
        pos = _parse_step(text, body, pos, steps)
    return JsonPath(text, tuple(steps))


def _parse_step(text: str, body: str, pos: int, steps: list[Step]) -> int:
    if body.startswith("..", pos):
        raise JsonPathError(f"jsonpath {text!r}: recursive descent '..' is not supported")
    if body[pos] == ".":
        if body.startswith(".*", pos):
            steps.append(Wildcard())
            return pos + 2
        name = _NAME.match(body, pos + 1)
        if name is None:
            raise JsonPathError(f"jsonpath {text!r}: expected a field name at offset {pos + 1}")
        steps.append(Field(name.group()))
        return name.end()
    if body[pos] != "[":
        raise JsonPathError(f"jsonpath {text!r}: unexpected {body[pos]!r} at offset {pos}")
    if m := _INDEX.match(body, pos):
        steps.append(Index(int(m.group(1))))
    elif m := _QUOTED_KEY.match(body, pos):
        steps.append(Field(m.group(1) if m.group(1) is not None else m.group(2)))
    elif m := _STAR.match(body, pos):
        steps.append(Wildcard())
    elif m := _FILTER.match(body, pos):
        sub = parse(m.group(1)) if m.group(1) else JsonPath("@", ())
        op = m.group(2) or "exists"
        steps.append(Filter(sub, op, _literal(m.group(3)) if m.group(2) else None))
    else:
        raise JsonPathError(f"jsonpath {text!r}: unsupported bracket expression at offset {pos}")
    return m.end()


def _literal(token: str) -> str | int | float | bool | None:
    if token[0] in "'\"":
        return token[1:-1]
    if token in ("true", "false"):
        return token == "true"
    if token == "null":
        return None
    return float(token) if "." in token else int(token)

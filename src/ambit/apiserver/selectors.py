"""Label and field selectors: parsing and validating the forms kubectl sends, and matching objects by field.

Theory of operation:

- A label selector is :class:`ambit.model.labels.LabelSelector`, which alone decides what matches; this module
  builds one, validated, from the query-string form or from a ``metav1.LabelSelector`` object. The text form
  is a comma-separated list of ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``, ``k>3``,
  ``k<3``, ``k`` (exists) and ``!k`` (does not exist). It is tokenised first (identifiers are runs of anything
  but whitespace and the symbols ``! = , ( ) < >``) and then parsed by a small recursive-descent parser; ``in``
  and ``notin`` are keywords only where an operator is expected, so ``k=in`` is an ordinary value.
- Every key is validated as a Kubernetes qualified name and every value as a label value, so a selector that
  parses can always be rendered back (``str()``) and parsed again to an equal selector.
- A field selector is a conjunction of ``path=value`` / ``path!=value`` terms; values use backslash escapes for
  ``\\ , = !``. Paths are dotted into the object's JSON and a missing field reads as the empty string.

Every malformed input raises :func:`ambit.apiserver.errors.bad_request`; nothing else escapes this module.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, NoReturn

from ambit.apiserver.errors import ApiError, bad_request
from ambit.model.labels import (
    INTEGER,
    SPEC_OPERATORS,
    LabelSelector,
    Operator,
    Requirement,
    label_key_problem,
    label_value_problem,
)

_SET_OPS = frozenset({Operator.IN, Operator.NOT_IN})
_ONE_VALUE_OPS = frozenset({Operator.EQUALS, Operator.NOT_EQUALS, Operator.GREATER_THAN, Operator.LESS_THAN})


def label_requirement(key: str, op: Operator, values: Iterable[str] = ()) -> Requirement:
    """Validate and build a requirement (values sorted, without duplicates); raises ``bad_request`` naming the
    offending key or value."""
    vals = tuple(sorted(set(values)))
    if (problem := label_key_problem(key)) is not None:
        raise bad_request(f"invalid label key {key!r}: {problem}")
    if op in _SET_OPS and not vals:
        raise bad_request(f"label requirement on {key!r}: operator {op} needs at least one value")
    if op in _ONE_VALUE_OPS and len(vals) != 1:
        raise bad_request(f"label requirement on {key!r}: operator {op} needs exactly one value")
    if op in (Operator.EXISTS, Operator.DOES_NOT_EXIST) and vals:
        raise bad_request(f"label requirement on {key!r}: an existence test takes no values")
    for value in vals:
        if (problem := label_value_problem(value)) is not None:
            raise bad_request(f"invalid label value {value!r} for key {key!r}: {problem}")
    if op in (Operator.GREATER_THAN, Operator.LESS_THAN) and not INTEGER.fullmatch(vals[0]):
        raise bad_request(f"label requirement on {key!r}: operator {op} needs an integer, not {vals[0]!r}")
    return Requirement(key, op, vals)


def parse_label_selector(text: str) -> LabelSelector:
    """Parse the query-string form (``?labelSelector=``); raises ``bad_request`` on any mistake."""
    return LabelSelector(_LabelParser(text).parse())


def label_selector_from_spec(spec: Mapping[str, Any] | None) -> LabelSelector:
    """Build from a ``metav1.LabelSelector`` object, validated; None and ``{}`` both select everything."""
    if spec is None:
        return LabelSelector()
    if not isinstance(spec, Mapping):
        raise bad_request("invalid label selector: expected an object with matchLabels/matchExpressions")
    reqs: list[Requirement] = []
    match_labels = spec.get("matchLabels") or {}
    if not isinstance(match_labels, Mapping):
        raise bad_request("invalid label selector: matchLabels must be an object")
    for key, value in match_labels.items():
        if not isinstance(value, str):
            raise bad_request(f"invalid label selector: matchLabels[{key!r}] must be a string")
        reqs.append(label_requirement(key, Operator.EQUALS, (value,)))
    expressions = spec.get("matchExpressions") or []
    if not isinstance(expressions, list):
        raise bad_request("invalid label selector: matchExpressions must be a list")
    for i, expr in enumerate(expressions):
        reqs.append(_expression(i, expr))
    return LabelSelector(tuple(reqs))


def _expression(index: int, expr: Any) -> Requirement:
    where = f"invalid label selector: matchExpressions[{index}]"
    if not isinstance(expr, Mapping):
        raise bad_request(f"{where} must be an object")
    key, operator, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
    if not isinstance(key, str):
        raise bad_request(f"{where}.key must be a string")
    if not isinstance(operator, str) or operator not in SPEC_OPERATORS:
        raise bad_request(f"{where}.operator: {operator!r} is not one of In, NotIn, Exists, DoesNotExist")
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise bad_request(f"{where}.values must be a list of strings")
    return label_requirement(key, SPEC_OPERATORS[operator], values)


class _Tok(enum.Enum):
    IDENT = "identifier"
    BANG = "'!'"
    EQ = "'='"
    EQEQ = "'=='"
    NEQ = "'!='"
    LPAREN = "'('"
    RPAREN = "')'"
    COMMA = "','"
    GT = "'>'"
    LT = "'<'"
    END = "end of string"


_SYMBOLS = {"!=": _Tok.NEQ, "==": _Tok.EQEQ, "!": _Tok.BANG, "=": _Tok.EQ, "(": _Tok.LPAREN}
_SYMBOLS |= {")": _Tok.RPAREN, ",": _Tok.COMMA, ">": _Tok.GT, "<": _Tok.LT}
_WHITESPACE = " \t\r\n"
_OPERATORS = {_Tok.EQ: Operator.EQUALS, _Tok.EQEQ: Operator.EQUALS, _Tok.NEQ: Operator.NOT_EQUALS}
_OPERATORS |= {_Tok.GT: Operator.GREATER_THAN, _Tok.LT: Operator.LESS_THAN}


def _tokenize(text: str) -> list[tuple[_Tok, str]]:
    tokens: list[tuple[_Tok, str]] = []
    i = 0
    while i < len(text):
        if text[i] in _WHITESPACE:
            i += 1
        elif text[i : i + 2] in _SYMBOLS:
            tokens.append((_SYMBOLS[text[i : i + 2]], text[i : i + 2]))
            i += 2
        elif text[i] in _SYMBOLS:
            tokens.append((_SYMBOLS[text[i]], text[i]))
            i += 1
        else:
            start = i
            while i < len(text) and text[i] not in _WHITESPACE and text[i] not in _SYMBOLS:
                i += 1
            tokens.append((_Tok.IDENT, text[start:i]))
    tokens.append((_Tok.END, ""))
    return tokens


class _LabelParser:
    """Grammar: selector = [requirement {"," requirement}]; requirement = "!" key | key [op value | setop set]."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._tokens = _tokenize(text)
        self._pos = 0

    def parse(self) -> tuple[Requirement, ...]:
        if self._peek()[0] is _Tok.END:
            return ()
        reqs = [self._requirement()]
        while True:
            kind, _ = self._next()
            if kind is _Tok.END:
                return tuple(reqs)
            if kind is not _Tok.COMMA:
                self._fail("',' or end of string", back=1)
            reqs.append(self._requirement())

    def _requirement(self) -> Requirement:
        kind, _ = self._peek()
        if kind is _Tok.BANG:
            self._next()
            return self._create(self._key(), Operator.DOES_NOT_EXIST, ())
        key = self._key()
        kind, lit = self._next()
        if kind in (_Tok.END, _Tok.COMMA):
            self._pos -= 1
            return self._create(key, Operator.EXISTS, ())
        if kind is _Tok.IDENT and lit in ("in", "notin"):
            return self._create(key, Operator(lit), self._value_set())
        if kind in _OPERATORS:
            return self._create(key, _OPERATORS[kind], (self._value(),))
        self._fail("'=', '==', '!=', 'in', 'notin', '<', '>', ',' or end of string", back=1)

    def _key(self) -> str:
        kind, lit = self._next()
        if kind is not _Tok.IDENT:
            self._fail("a label key", back=1)
        return lit

    def _value(self) -> str:
        kind, lit = self._peek()
        if kind in (_Tok.END, _Tok.COMMA):
            return ""
        if kind is not _Tok.IDENT:
            self._fail("a label value")
        self._next()
        return lit

    def _value_set(self) -> list[str]:
        if self._next()[0] is not _Tok.LPAREN:
            self._fail("'('", back=1)
        # Empty slots count as the empty value, so "()" and "(a,)" both include "".
        values: list[str] = []
        expect_value = True
        while True:
            kind, lit = self._next()
            if kind is _Tok.IDENT and expect_value:
                values.append(lit)
                expect_value = False
            elif kind is _Tok.COMMA:
                if expect_value:
                    values.append("")
                expect_value = True
            elif kind is _Tok.RPAREN:
                if expect_value:
                    values.append("")
                return values
            else:
                self._fail("',' or ')'" if not expect_value else "a value, ',' or ')'", back=1)

    def _create(self, key: str, op: Operator, values: Iterable[str]) -> Requirement:
        try:
            return label_requirement(key, op, values)
        except ApiError as exc:
            raise bad_request(f"invalid label selector {self._text!r}: {exc}") from None

    def _peek(self) -> tuple[_Tok, str]:
        return self._tokens[min(self._pos, len(self._tokens) - 1)]

    def _next(self) -> tuple[_Tok, str]:
        token = self._peek()
        self._pos += 1
        return token

    def _fail(self, expected: str, back: int = 0) -> NoReturn:
        kind, lit = self._tokens[min(self._pos - back, len(self._tokens) - 1)]
        found = "end of string" if kind is _Tok.END else repr(lit)
        raise bad_request(f"invalid label selector {self._text!r}: found {found}, expected {expected}")


class FieldOp(enum.StrEnum):
    EQUALS = "="
    NOT_EQUALS = "!="


class FieldRequirement(NamedTuple):
    """``path op value``; unpacks as a ``(path, op, value)`` triple."""

    path: str
    op: FieldOp
    value: str


_FIELD_OPERATORS = (("!=", FieldOp.NOT_EQUALS), ("==", FieldOp.EQUALS), ("=", FieldOp.EQUALS))
_ESCAPABLE = "\\,=!"


@dataclass(frozen=True, slots=True)
class FieldSelector:
    """A conjunction of field requirements; no requirements selects everything."""

    requirements: tuple[FieldRequirement, ...] = ()

    @classmethod
    def parse(cls, text: str, allowed: frozenset[str]) -> FieldSelector:
        """Parse ``?fieldSelector=``; a path outside ``allowed`` is ``field label not supported: <path>``."""
        reqs: list[FieldRequirement] = []
        for term in _split_unescaped(text, ","):
            if not term.strip():
                continue
            path, op, raw = _split_term(text, term)
            if path not in allowed:
                raise bad_request(f"field label not supported: {path}")
            reqs.append(FieldRequirement(path, op, _unescape(text, raw)))
        return cls(tuple(reqs))

    @property
    def selects_everything(self) -> bool:
        return not self.requirements

    def exact_value(self, path: str) -> str | None:
        """The value ``path`` must equal for an object to match, if the selector pins it."""
        for req in self.requirements:
            if req.path == path and req.op is FieldOp.EQUALS:
                return req.value
        return None

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all((field_value(obj, p) == v) == (op is FieldOp.EQUALS) for p, op, v in self.requirements)

    def __str__(self) -> str:
        return ",".join(f"{path}{op}{_escape(value)}" for path, op, value in self.requirements)


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The string form of the field at dotted ``path``: booleans as ``true``/``false``, missing as ``""``."""
    current: Any = obj
    for part in path.split("."):
        if not isinstance(current, Mapping) or part not in current:
            return ""
        current = current[part]
    if isinstance(current, bool):
        return "true" if current else "false"
    if isinstance(current, str | int | float):
        return str(current)
    return ""


def _split_unescaped(text: str, separator: str) -> list[str]:
    parts, start, i = [], 0, 0
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == separator:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    return parts


def _split_term(text: str, term: str) -> tuple[str, FieldOp, str]:
    i = 0
    while i < len(term):
        if term[i] == "\\":
            i += 2
            continue
        for symbol, op in _FIELD_OPERATORS:
            if term.startswith(symbol, i):
                return term[:i].strip(), op, term[i + len(symbol) :]
        i += 1
    raise bad_request(
        f"invalid field selector {text!r}: cannot understand {term!r}, expected path=value or path!=value"
    )


def _unescape(text: str, raw: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(raw):
        char = raw[i]
        if char == "\\":
            if i + 1 >= len(raw) or raw[i + 1] not in _ESCAPABLE:
                seq = raw[i : i + 2]
                raise bad_request(f"invalid field selector {text!r}: invalid escape sequence {seq!r}")
            out.append(raw[i + 1])
            i += 2
            continue
        if char in ",=":
            raise bad_request(f"invalid field selector {text!r}: unescaped {char!r} in value {raw!r}")
        out.append(char)
        i += 1
    return "".join(out)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")

"""Go ``text/template`` source to a tree: the subset Istio's injection templates are written in. Pure.

Theory of operation: :func:`parse` scans the text for actions (``{{ ... }}``), applies the trim markers to the text
around them, lexes each action into :class:`Token` values and parses those into the nodes below, with ``if``,
``range`` and ``with`` blocks nested by their ``end``. The result is a :class:`Template` (a tuple of nodes) that
:mod:`.execute` evaluates; anything outside the subset, or malformed, is a :class:`TemplateError` naming the line
and column.

Rules:

1. Text outside actions is copied. ``{{- `` (a dash then a space, tab or newline) removes the white space before
   the action, `` -}}`` the white space after it; ``{{/* ... */}}`` is a comment (trim markers allowed around it).
2. An action holds a pipeline: an optional declaration (``$x :=``, ``$x =``, or ``$k, $v :=`` at the head of a
   ``range``), then commands joined by ``|``. A command is operands separated by spaces; its first operand is a
   function name, or a value when the command is alone. Operands: ``.`` and field chains (``.A.B``), variables
   (``$``, ``$x``, ``$x.A``), string (``"..."`` with Go's escapes, and raw ```...```), number, ``true``,
   ``false``, ``nil``, and a parenthesised pipeline, which may be followed by a field chain (``(.A).b``).
3. Blocks: ``if`` / ``else if`` / ``else`` / ``end``, ``range`` and ``with`` (each with an optional ``else``).
   ``define``, ``template``, ``block``, ``break`` and ``continue`` are refused: Istio's templates do not use them.
4. Bounded: at most :data:`MAX_SOURCE` characters, :data:`MAX_NESTING` levels of blocks and parentheses together;
   past those the template is refused, so that an admin-written template cannot make the parser recurse without
   bound.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Final

from ambit.errors import AmbitError

__all__ = [
    "MAX_NESTING",
    "MAX_SOURCE",
    "Action",
    "Chain",
    "Command",
    "Dot",
    "Field",
    "Ident",
    "If",
    "Literal",
    "Node",
    "Pipe",
    "Range",
    "Template",
    "TemplateError",
    "Text",
    "Var",
    "With",
    "parse",
]

MAX_SOURCE: Final = 1 << 20
"""Characters: a ConfigMap holds at most 1 MiB."""
MAX_NESTING: Final = 64
"""Blocks and parentheses nested deeper than this are refused (rule 4)."""
KEYWORDS: Final = frozenset({"if", "else", "end", "range", "with", "define", "template", "block", "break", "continue"})


class TemplateError(AmbitError):
    """A template that cannot be parsed or evaluated; the message names the line and column."""


# -- nodes -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Literal:
    value: str | int | float | bool | None


@dataclass(frozen=True, slots=True)
class Dot:
    pass


@dataclass(frozen=True, slots=True)
class Field:
    """``.A.B``: fields of dot."""

    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Var:
    """``$x.A.B`` (``$`` is the data the template was executed with)."""

    name: str
    names: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Ident:
    """A function name."""

    name: str


@dataclass(frozen=True, slots=True)
class Chain:
    """``(pipeline).A.B``."""

    node: Pipe
    names: tuple[str, ...]


Operand = Literal | Dot | Field | Var | Ident | Chain


@dataclass(frozen=True, slots=True)
class Command:
    args: tuple[Operand, ...]
    pos: str
    """``line L col C``, for messages."""


@dataclass(frozen=True, slots=True)
class Pipe:
    decl: tuple[str, ...]
    assign: bool
    """``$x = ...`` (assign to an existing variable) rather than ``$x := ...``."""
    commands: tuple[Command, ...]
    pos: str


@dataclass(frozen=True, slots=True)
class Text:
    text: str


@dataclass(frozen=True, slots=True)
class Action:
    pipe: Pipe


@dataclass(frozen=True, slots=True)
class If:
    pipe: Pipe
    body: tuple[Node, ...]
    orelse: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Range:
    pipe: Pipe
    body: tuple[Node, ...]
    orelse: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class With:
    pipe: Pipe
    body: tuple[Node, ...]
    orelse: tuple[Node, ...]


Node = Text | Action | If | Range | With
Template = tuple[Node, ...]


# -- lexing ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Token:
    kind: str
    """One of: field, var, dot, ident, string, number, pipe, lparen, rparen, declare, assign, comma."""
    text: str
    offset: int
    spaced: bool
    """White space came before it (``.A .B`` is two operands, ``.A.B`` one)."""


_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<field>(?:\.[A-Za-z_][A-Za-z0-9_]*)+)
  | (?P<var>\$[A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)
  | (?P<dot>\.)
  | (?P<number>[-+]?(?:0[xX][0-9a-fA-F_]+|0[oObB][0-7_]+|(?:\d[\d_]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?))
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<raw>`[^`]*`)
  | (?P<char>'(?:[^'\\\n]|\\.)+')
  | (?P<declare>:=)
  | (?P<assign>=)
  | (?P<pipe>\|)
  | (?P<lparen>\()
  | (?P<rparen>\))
  | (?P<comma>,)
    """,
    re.VERBOSE | re.DOTALL,
)
_ESCAPES: Final = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "a": "\a", "b": "\b",
                   "f": "\f", "v": "\v"}  # fmt: skip
_ESCAPE = re.compile(r"\\(?:([ntr\\\"'abfv])|x([0-9a-fA-F]{2})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|([0-7]{3})|(.))")


_SPACES = re.compile(r"[ \t\r\n]*")


class _Source:
    """The template text, for turning offsets into ``line L col C``."""

    def __init__(self, text: str) -> None:
        self.text = text

    def pos(self, offset: int) -> str:
        line = self.text.count("\n", 0, offset) + 1
        col = offset - (self.text.rfind("\n", 0, offset) + 1) + 1
        return f"line {line} col {col}"

    def error(self, offset: int, message: str) -> TemplateError:
        return TemplateError(f"template: {self.pos(offset)}: {message}")


def _unquote(src: _Source, token: Token) -> str:
    body = token.text[1:-1]
    if token.text[0] == "`":
        return body

    def one(match: re.Match[str]) -> str:
        simple, hex2, hex4, hex8, octal, bad = match.groups()
        if simple:
            return _ESCAPES[simple]
        if bad is not None:
            raise src.error(token.offset, f"unknown escape sequence \\{bad} in {token.text[:40]}")
        code = int(hex2 or hex4 or hex8 or octal, 8 if octal else 16)
        if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
            raise src.error(token.offset, f"invalid escape in {token.text[:40]}")
        return chr(code)

    return _ESCAPE.sub(one, body)


def _lex(src: _Source, start: int, end: int) -> list[Token]:
    tokens: list[Token] = []
    offset, spaced = start, True
    while offset < end:
        match = _TOKEN.match(src.text, offset, end)
        if match is None:
            raise src.error(offset, f"unexpected {src.text[offset]!r} in action")
        kind = match.lastgroup or ""
        if kind == "space":
            spaced = True
        else:
            tokens.append(Token(kind, match.group(), offset, spaced))
            spaced = False
        offset = match.end()
    return tokens


# -- scanning text and actions ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Raw:
    """One action's tokens, or text."""

    text: str | None
    tokens: tuple[Token, ...] = ()
    offset: int = 0


def _scan(src: _Source) -> list[_Raw]:
    text = src.text
    out: list[_Raw] = []
    offset, trim_next = 0, False
    while True:
        opening = text.find("{{", offset)
        chunk = text[offset:] if opening < 0 else text[offset:opening]
        if trim_next:
            chunk = chunk.lstrip(" \t\r\n")
        inner = opening + 2
        trim_before = (
            opening >= 0 and text.startswith("-", inner) and text[inner + 1 : inner + 2] in (" ", "\t", "\r", "\n")
        )
        if trim_before:
            chunk = chunk.rstrip(" \t\r\n")
            inner += 2
        if chunk:
            out.append(_Raw(chunk))
        if opening < 0:
            return out
        spaces = _SPACES.match(text, inner)
        if text.startswith("/*", spaces.end() if trim_before and spaces else inner):
            close_comment = text.find("*/", inner)
            if close_comment < 0:
                raise src.error(opening, "unclosed comment")
            after = close_comment + 2
            trim_next = False
            if text.startswith(" -}}", after):
                trim_next, after = True, after + 2
            if not text.startswith("}}", after):
                raise src.error(opening, "comment ends before closing delimiter")
            offset = after + 2
            continue
        closing = _find_close(src, inner)
        trim_next = closing - 2 >= inner and text[closing - 1] == "-" and text[closing - 2] in " \t\r\n"
        end = closing - 2 if trim_next else closing
        out.append(_Raw(None, tuple(_lex(src, inner, end)), opening))
        offset = closing + 2


def _find_close(src: _Source, start: int) -> int:
    """The offset of the ``}}`` closing the action at ``start``, skipping quoted strings."""
    text, offset = src.text, start
    while offset < len(text):
        char = text[offset]
        if text.startswith("}}", offset):
            return offset
        if char in "\"'":
            end = offset + 1
            while end < len(text) and text[end] != char:
                if text[end] == "\n":
                    raise src.error(offset, "unterminated quoted string")
                end += 2 if text[end] == "\\" else 1
            offset = end + 1
        elif char == "`":
            end = text.find("`", offset + 1)
            if end < 0:
                raise src.error(offset, "unterminated raw quoted string")
            offset = end + 1
        else:
            offset += 1
    raise src.error(start - 2, "unclosed action")


# -- parsing ---------------------------------------------------------------------------------------------------
def _names(chain: str) -> tuple[str, ...]:
    return tuple(chain.split(".")[1:])


class _Parser:
    def __init__(self, src: _Source, raws: list[_Raw]) -> None:
        self.src = src
        self.raws = raws
        self.index = 0
        self.depth = 0

    def _deeper(self, offset: int) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise self.src.error(offset, f"nested more than {MAX_NESTING} levels deep")

    def parse_list(self, inside: str | None) -> tuple[tuple[Node, ...], str, _Raw | None]:
        """Nodes up to an ``end`` or ``else`` (returned with the keyword) or the end of the text."""
        nodes: list[Node] = []
        while self.index < len(self.raws):
            raw = self.raws[self.index]
            self.index += 1
            if raw.text is not None:
                nodes.append(Text(raw.text))
                continue
            tokens = raw.tokens
            if not tokens:
                raise self.src.error(raw.offset, "missing value for command")
            head = tokens[0]
            keyword = head.text if head.kind == "ident" and head.text in KEYWORDS else None
            if keyword in ("end", "else"):
                if inside is None:
                    raise self.src.error(raw.offset, f"unexpected {{{{{keyword}}}}}")
                return tuple(nodes), keyword, raw
            if keyword in ("if", "range", "with"):
                nodes.append(self.parse_block(keyword, raw))
            elif keyword is not None:
                raise self.src.error(raw.offset, f"{{{{{keyword}}}}} is not supported in these templates")
            else:
                nodes.append(Action(self.parse_pipe(list(tokens), raw.offset, allow_decl=True)))
        if inside is not None:
            raise self.src.error(len(self.src.text), f"unexpected end of template: {{{{{inside}}}}} has no {{{{end}}}}")
        return tuple(nodes), "", None

    def parse_block(self, keyword: str, raw: _Raw) -> Node:
        self._deeper(raw.offset)
        pipe = self.parse_pipe(list(raw.tokens[1:]), raw.tokens[0].offset, allow_decl=True, pairs=keyword == "range")
        body, ended, at = self.parse_list(keyword)
        orelse: tuple[Node, ...] = ()
        if ended == "else":
            assert at is not None
            rest = at.tokens[1:]
            if rest and rest[0].kind == "ident" and rest[0].text == "if" and keyword == "if":
                orelse = (self.parse_block("if", _Raw(None, rest, rest[0].offset)),)
                self.depth -= 1
                return If(pipe, body, orelse)
            if rest:
                raise self.src.error(at.offset, "unexpected tokens after {{else}}")
            orelse, ended, at = self.parse_list(keyword)
            if ended != "end":
                raise self.src.error(at.offset if at else len(self.src.text), f"expected {{{{end}}}} of {keyword}")
        if at is not None and len(at.tokens) > 1 and ended == "end":
            raise self.src.error(at.offset, "unexpected tokens after {{end}}")
        self.depth -= 1
        if keyword == "range":
            return Range(pipe, body, orelse)
        return With(pipe, body, orelse) if keyword == "with" else If(pipe, body, orelse)

    def parse_pipe(self, tokens: list[Token], offset: int, *, allow_decl: bool, pairs: bool = False) -> Pipe:
        pos = self.src.pos(tokens[0].offset if tokens else offset)
        decl: list[str] = []
        assign = False
        if allow_decl and tokens and tokens[0].kind == "var" and "." not in tokens[0].text:
            if len(tokens) > 1 and tokens[1].kind in ("declare", "assign"):
                decl, assign, tokens = [tokens[0].text], tokens[1].kind == "assign", tokens[2:]
            elif pairs and len(tokens) > 3 and tokens[1].kind == "comma" and tokens[2].kind == "var":
                if tokens[3].kind != "declare":
                    raise self.src.error(tokens[3].offset, "expected := after range variables")
                decl, tokens = [tokens[0].text, tokens[2].text], tokens[4:]
        if not tokens:
            raise self.src.error(offset, "missing value for command")
        commands: list[Command] = []
        while True:
            command, tokens = self.parse_command(tokens)
            commands.append(command)
            if not tokens:
                break
            if tokens[0].kind != "pipe":
                raise self.src.error(tokens[0].offset, f"unexpected {tokens[0].text!r} in command")
            tokens = tokens[1:]
            if not tokens:
                raise self.src.error(offset, "missing command after |")
        return Pipe(tuple(decl), assign, tuple(commands), pos)

    def parse_command(self, tokens: list[Token]) -> tuple[Command, list[Token]]:
        args: list[Operand] = []
        pos = self.src.pos(tokens[0].offset)
        while tokens and tokens[0].kind not in ("pipe", "rparen"):
            if args and not tokens[0].spaced:
                raise self.src.error(tokens[0].offset, f"missing space before {tokens[0].text!r}")
            operand, tokens = self.parse_operand(tokens)
            args.append(operand)
        if not args:
            where = tokens[0].offset if tokens else 0
            raise self.src.error(where, "missing value for command")
        return Command(tuple(args), pos), tokens

    def parse_operand(self, tokens: list[Token]) -> tuple[Operand, list[Token]]:
        token, rest = tokens[0], tokens[1:]
        kind = token.kind
        if kind == "field":
            return Field(_names(token.text)), rest
        if kind == "var":
            name, _, chain = token.text.partition(".")
            return Var(name, tuple(chain.split(".")) if chain else ()), rest
        if kind == "dot":
            return Dot(), rest
        if kind in ("string", "raw"):
            return Literal(_unquote(self.src, token)), rest
        if kind == "char":
            text = _unquote(self.src, token)
            if len(text) != 1:
                raise self.src.error(token.offset, f"malformed character constant {token.text[:20]}")
            return Literal(ord(text)), rest
        if kind == "number":
            return Literal(self._number(token)), rest
        if kind == "ident":
            if token.text in KEYWORDS:
                raise self.src.error(token.offset, f"unexpected keyword {token.text!r} in command")
            constants: dict[str, bool | None] = {"true": True, "false": False, "nil": None}
            if token.text in constants:
                return Literal(constants[token.text]), rest
            return Ident(token.text), rest
        if kind == "lparen":
            self._deeper(token.offset)
            depth, end = 0, None
            for index, inner in enumerate(rest):
                depth += {"lparen": 1, "rparen": -1}.get(inner.kind, 0)
                if depth < 0:
                    end = index
                    break
            if end is None:
                raise self.src.error(token.offset, "unclosed left paren")
            pipe = self.parse_pipe(rest[:end], token.offset, allow_decl=False)
            self.depth -= 1
            rest = rest[end + 1 :]
            if rest and rest[0].kind == "field" and not rest[0].spaced:
                return Chain(pipe, _names(rest[0].text)), rest[1:]
            return Chain(pipe, ()), rest
        raise self.src.error(token.offset, f"unexpected {token.text!r} in operand")

    def _number(self, token: Token) -> int | float:
        text = token.text.replace("_", "")
        try:
            if re.fullmatch(r"[-+]?0[xX][0-9a-fA-F]+", text):
                return int(text, 16)
            if re.fullmatch(r"[-+]?0[oO][0-7]+", text):
                return int(text, 8)
            if re.fullmatch(r"[-+]?0[bB][01]+", text):
                return int(text, 2)
            if re.fullmatch(r"[-+]?\d+", text):
                if len(text) > 20:
                    raise ValueError
                return int(text)
            value = float(text)
        except ValueError:
            raise self.src.error(token.offset, f"bad number syntax: {token.text[:40]!r}") from None
        if not math.isfinite(value):
            raise self.src.error(token.offset, f"bad number syntax: {token.text[:40]!r}")
        return value


def parse(text: str) -> Template:
    """The tree of ``text`` (rules 1-4); raises :class:`TemplateError`."""
    if len(text) > MAX_SOURCE:
        raise TemplateError(f"template: {len(text)} characters, more than {MAX_SOURCE}")
    src = _Source(text)
    parser = _Parser(src, _scan(src))
    nodes, _, _ = parser.parse_list(None)
    return nodes

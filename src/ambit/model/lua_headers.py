"""A bounded reader for the one kind of Envoy Lua filter Ambit runs: header edits with literal strings.

Ambit runs no Lua. An ``envoy.lua`` filter whose code only edits headers with constant strings says the same as
a list of :class:`~ambit.model.envoyfilter.HeaderOp`; :func:`parse_header_script` reads exactly that subset and
refuses everything else with :class:`~ambit.model.errors.LuaSubsetError` (line, column, what was expected), so code
outside it is never half-run. Pure; no other exception escapes.

The subset (Lua 5.1 lexical rules; everything else is refused):

1. A chunk is a sequence of ``function envoy_on_request(h) ... end`` and ``function envoy_on_response(h) ... end``
   definitions, each at most once, with any parameter name.
2. A body is a sequence of statements ``h:headers():add(K, V)``, ``h:headers():replace(K, V)`` and
   ``h:headers():remove(K)``, each optionally followed by ``;``, where ``h`` is the function's parameter and ``K``,
   ``V`` are string literals. ``add`` appends a value, ``replace`` replaces every value (or adds one), ``remove``
   drops every value, as Envoy's Lua header map does.
3. String literals are quoted with ``'`` or ``"``; escapes are Lua's: ``\\a \\b \\f \\n \\r \\t \\v \\\\ \\" \\'``,
   an escaped newline, ``\\ddd`` (decimal, at most 255), ``\\xXX``, ``\\z`` (skips the whitespace after it) and
   ``\\u{XXX}`` (UTF-8; at most 0x7FFFFFFF). A string does not span an unescaped newline.
4. Comments: ``--`` to the end of the line, and long comments ``--[[ ... ]]`` / ``--[==[ ... ]==]``.
5. Bounds: at most :data:`MAX_CODE` characters, :data:`MAX_TOKENS` tokens and :data:`MAX_STATEMENTS` statements;
   the reader is a loop over tokens (no recursion), so its cost is linear in the input.

What the edited names and values may be (tokens, no CR/LF) is judged by the caller, not here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ambit.model.envoyfilter import HeaderAction, HeaderOp
from ambit.model.errors import LuaSubsetError

__all__ = ["MAX_CODE", "MAX_STATEMENTS", "MAX_TOKENS", "HeaderScript", "parse_header_script"]

MAX_CODE = 64 * 1024
MAX_TOKENS = 10_000
MAX_STATEMENTS = 256

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SPACE = re.compile(r"[ \t\r\n\f\v]+")
_LONG_OPEN = re.compile(r"\[(=*)\[")
_SIMPLE_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
_SIMPLE_ESCAPES.update({"\\": "\\", '"': '"', "'": "'", "\n": "\n"})
_PUNCTUATION = frozenset("():,;")
_KEYWORDS = frozenset({"function", "end"})
_HOOKS = {"envoy_on_request": "request", "envoy_on_response": "response"}
_METHODS = {"add": (HeaderAction.APPEND, 2), "replace": (HeaderAction.OVERWRITE, 2), "remove": (HeaderAction.REMOVE, 1)}


@dataclass(frozen=True, slots=True)
class HeaderScript:
    """What a script in the subset does: its request and response edits, in order."""

    request: tuple[HeaderOp, ...] = ()
    response: tuple[HeaderOp, ...] = ()


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str
    """``name``, ``string``, or the punctuation character itself."""
    text: str
    offset: int


def _where(code: str, offset: int) -> str:
    line = code.count("\n", 0, offset) + 1
    column = offset - (code.rfind("\n", 0, offset) + 1) + 1
    return f"line {line}, column {column}"


def _fail(code: str, offset: int, message: str) -> LuaSubsetError:
    return LuaSubsetError(f"{_where(code, offset)}: {message}")


def _long_bracket_end(code: str, start: int) -> int | None:
    """The offset after the long bracket opening at ``start`` closes, or None when none opens there."""
    opened = _LONG_OPEN.match(code, start)
    if opened is None:
        return None
    close = "]" + opened.group(1) + "]"
    end = code.find(close, opened.end())
    if end < 0:
        raise _fail(code, start, "unfinished long comment")
    return end + len(close)


def _escape(code: str, at: int) -> tuple[str, int]:
    """The text of the escape whose backslash is at ``at``, and the offset after it (rule 3)."""
    if at + 1 >= len(code):
        raise _fail(code, at, "unfinished string")
    c = code[at + 1]
    if c in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[c], at + 2
    if c == "\r":  # an escaped CR LF (or lone CR) is one newline
        return "\n", at + 3 if code.startswith("\n", at + 2) else at + 2
    if c.isdigit() and c.isascii():
        digits = re.match(r"[0-9]{1,3}", code[at + 1 : at + 4])
        assert digits is not None
        value = int(digits.group())
        if value > 255:
            raise _fail(code, at, "decimal escape too large")
        return chr(value), at + 1 + len(digits.group())
    if c == "x":
        hexa = code[at + 2 : at + 4]
        if re.fullmatch(r"[0-9A-Fa-f]{2}", hexa) is None:
            raise _fail(code, at, "hexadecimal digit expected")
        return chr(int(hexa, 16)), at + 4
    if c == "z":
        skipped = _SPACE.match(code, at + 2)
        return "", skipped.end() if skipped is not None else at + 2
    if c == "u":
        braced = re.match(r"\{([0-9A-Fa-f]{1,8})\}", code[at + 2 : at + 12])
        if braced is None:
            raise _fail(code, at, "missing '{' or '}' in \\u{xxxx}")
        value = int(braced.group(1), 16)
        if value > 0x7FFFFFFF:
            raise _fail(code, at, "UTF-8 value too large")
        if value > 0x10FFFF or 0xD800 <= value <= 0xDFFF:
            raise _fail(code, at, "code point outside Unicode scalar values")
        return chr(value), at + 2 + len(braced.group())
    raise _fail(code, at, f"invalid escape sequence '\\{c}'")


def _string(code: str, start: int) -> tuple[str, int]:
    quote = code[start]
    parts: list[str] = []
    at = start + 1
    while True:
        if at >= len(code):
            raise _fail(code, start, "unfinished string")
        c = code[at]
        if c == quote:
            return "".join(parts), at + 1
        if c in "\r\n":
            raise _fail(code, start, "unfinished string")
        if c == "\\":
            text, at = _escape(code, at)
            parts.append(text)
            continue
        parts.append(c)
        at += 1


def _tokens(code: str) -> list[_Token]:
    """Rules 3-5: the chunk's tokens."""
    tokens: list[_Token] = []
    at = 0
    while at < len(code):
        if len(tokens) > MAX_TOKENS:
            raise _fail(code, at, f"more than {MAX_TOKENS} tokens")
        space = _SPACE.match(code, at)
        if space is not None:
            at = space.end()
            continue
        if code.startswith("--", at):
            end = _long_bracket_end(code, at + 2)
            if end is None:
                newline = code.find("\n", at)
                end = len(code) if newline < 0 else newline + 1
            at = end
            continue
        c = code[at]
        if c in "'\"":
            text, end = _string(code, at)
            tokens.append(_Token("string", text, at))
            at = end
            continue
        if c in _PUNCTUATION:
            tokens.append(_Token(c, c, at))
            at += 1
            continue
        name = _NAME.match(code, at)
        if name is not None:
            tokens.append(_Token("name", name.group(), at))
            at = name.end()
            continue
        raise _fail(code, at, f"unexpected character {c!r} (only header edits with string literals are run)")
    return tokens


class _Cursor:
    def __init__(self, code: str, tokens: list[_Token]) -> None:
        self.code, self.tokens, self.at = code, tokens, 0

    def peek(self) -> _Token | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self, kind: str, text: str | None = None, what: str = "") -> _Token:
        token = self.peek()
        if token is None or token.kind != kind or (text is not None and token.text != text):
            offset = token.offset if token is not None else len(self.code)
            found = f"{token.text!r}" if token is not None else "the end"
            raise _fail(self.code, offset, f"expected {what or repr(text or kind)}, found {found}")
        self.at += 1
        return token


def parse_header_script(code: str) -> HeaderScript:
    """The header edits ``code`` makes (rules 1-5), or :class:`LuaSubsetError` when it is outside the subset."""
    if not isinstance(code, str):
        raise LuaSubsetError("the code is not a string")
    if len(code) > MAX_CODE:
        raise LuaSubsetError(f"the code is longer than {MAX_CODE} characters")
    cursor = _Cursor(code, _tokens(code))
    hooks: dict[str, list[HeaderOp]] = {}
    statements = 0
    while cursor.peek() is not None:
        cursor.take("name", "function", "'function envoy_on_request(...)' or 'function envoy_on_response(...)'")
        hook = cursor.take("name", what="envoy_on_request or envoy_on_response")
        side = _HOOKS.get(hook.text)
        if side is None:
            raise _fail(code, hook.offset, f"function {hook.text!r} is not envoy_on_request or envoy_on_response")
        if side in hooks:
            raise _fail(code, hook.offset, f"{hook.text} is defined twice")
        cursor.take("(")
        handle = cursor.take("name", what="the handle parameter")
        if handle.text in _KEYWORDS:
            raise _fail(code, handle.offset, "the handle parameter may not be a keyword")
        cursor.take(")")
        ops = hooks[side] = []
        while True:
            token = cursor.peek()
            if token is not None and token.kind == "name" and token.text == "end":
                cursor.at += 1
                break
            statements += 1
            if statements > MAX_STATEMENTS:
                raise _fail(code, token.offset if token else len(code), f"more than {MAX_STATEMENTS} statements")
            ops.append(_statement(cursor, handle.text))
    return HeaderScript(tuple(hooks.get("request", ())), tuple(hooks.get("response", ())))


def _statement(cursor: _Cursor, handle: str) -> HeaderOp:
    """Rule 2: one ``h:headers():method(args)`` statement."""
    cursor.take("name", handle, f"'{handle}:headers():add|replace|remove(...)' or 'end'")
    cursor.take(":")
    cursor.take("name", "headers")
    cursor.take("(")
    cursor.take(")")
    cursor.take(":")
    method = cursor.take("name", what="add, replace or remove")
    known = _METHODS.get(method.text)
    if known is None:
        raise _fail(cursor.code, method.offset, f"headers():{method.text} is not add, replace or remove")
    action, arity = known
    cursor.take("(")
    args = [cursor.take("string", what="a string literal").text]
    for _ in range(arity - 1):
        cursor.take(",")
        args.append(cursor.take("string", what="a string literal").text)
    cursor.take(")")
    following = cursor.peek()
    if following is not None and following.kind == ";":
        cursor.at += 1
    return HeaderOp(action, args[0].lower(), args[1] if arity == 2 else "")

"""Whether a regular expression is one Go's ``regexp.Compile`` (RE2 syntax) accepts, as istiod's webhook asks it
(``validateStringRegexp``), judged without running it.

Theory of operation. Python's :mod:`re` is not RE2: it lacks syntax RE2 has (``\\pL``, ``\\p{Greek}``, ``\\z``,
``(?U)``, POSIX classes ``[[:alpha:]]``, ``\\Q...\\E``, ``\\x{263a}``, octal ``\\12``, group names starting with a
digit) and has syntax RE2 refuses (look-around, back-references, ``(?#...)``, atomic groups, possessive repeats,
``\\Z``). :func:`re2_problem` therefore reads the escapes, group openings and character classes itself, as Go's
``regexp/syntax`` parser reads them, and writes an equivalent-for-syntax Python pattern (each RE2-only atom becomes a
plain literal, each class a one-character class, each group name a generated one, each empty-width assertion an
empty group); Python's parser then judges
what both share: balanced parentheses, a repeat with something to repeat, no repeat of a repeat, ``{n,m}`` in order.
The parse tree is finally checked for what Python accepts and RE2 does not (possessive repeats, atomic groups,
counts over 1000).

Rules:

1. At most :data:`MAX_PATTERN` characters (istiod's 1024), checked first; every step after is linear in the
   pattern, so a hostile pattern costs at most one parse of 1024 characters.
2. Refused as Go refuses them: look-ahead and look-behind, back-references (``\\1`` alone, ``\\8``, ``(?P=n)``),
   unknown escapes (``\\Z``, ``\\C``, ``\\u``, ``\\e``, a non-ASCII character), flags other than ``i``, ``m``, ``s``,
   ``U``, any other ``(?`` form, an unclosed class or ``\\p{``, a reversed range, an unknown POSIX class, a
   one-letter ``\\p`` that is not a Unicode category, a ``\\x{}`` beyond U+10FFFF, a repeat count over 1000, an
   invalid or repeated group name, and what Python's parser refuses of the shared syntax.
3. Lenient where checking would need Go's tables: a braced Unicode class name (``\\p{Greek}``) is accepted when it is
   letters and underscores; nesting deeper than Python's parser can follow is refused (no route could use it:
   the translator compiles with :mod:`re`).
"""

from __future__ import annotations

import re
import warnings
from re import _parser  # type: ignore[attr-defined]
from typing import Any

__all__ = ["MAX_PATTERN", "re2_problem"]

MAX_PATTERN = 1024
"""istiod's bound on a regular expression's length (an approximation of Envoy's RE2 program size)."""
MAX_REPEAT = 1000
"""Go's ``regexp/syntax`` refuses a repeat count above this."""

_POSIX = frozenset(
    [
        "alnum",
        "alpha",
        "ascii",
        "blank",
        "cntrl",
        "digit",
        "graph",
        "lower",
        "print",
        "punct",
        "space",
        "upper",
        "word",
        "xdigit",
    ]
)
_CATEGORIES = frozenset("CLMNPSZ")
_FLAGS = frozenset("imsU")
_CHAR_ESCAPES = {"a": 7, "f": 12, "t": 9, "n": 10, "r": 13, "v": 11}
_CLASS_ESCAPES = frozenset("dDsSwW")
_ASSERTIONS = frozenset("AbBz")
_OCTAL = frozenset("01234567")
_HEX = frozenset("0123456789abcdefABCDEF")
_NAME = re.compile(r"[A-Za-z0-9_]+")
_UNICODE_NAME = re.compile(r"\^?[A-Za-z_]+")
_POSITION = re.compile(r" at position \d+")
_EMPTY_WIDTH = "(?:)"
"""The stand-in of ``^``, ``$``, ``\\A``, ``\\b``, ``\\B``, ``\\z``: Go repeats them (``^*`` compiles), Python
would not."""
_REFUSED = {
    "ASSERT": "a look-ahead or look-behind",
    "ASSERT_NOT": "a negative look-ahead or look-behind",
    "GROUPREF": "a back-reference",
    "GROUPREF_EXISTS": "a conditional group",
    "ATOMIC_GROUP": "an atomic group",
    "POSSESSIVE_REPEAT": "a possessive repeat",
}


class _Refused(Exception):
    """What is wrong, in Go's words where it has them."""


class _Reader:
    """One pass over the pattern, writing the Python stand-in."""

    def __init__(self, pattern: str) -> None:
        self.s = pattern
        self.i = 0
        self.out: list[str] = []
        self.names: set[str] = set()
        self.code = 0
        """The code point of the last character escape read."""

    def run(self) -> str:
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c == "\\":
                self.escape()
            elif c == "[":
                self.char_class()
            elif c == "(":
                self.group()
            elif c in "^$":
                self.out.append(_EMPTY_WIDTH)
                self.i += 1
            else:
                self.out.append(c)
                self.i += 1
        return "".join(self.out)

    # -- escapes ---------------------------------------------------------------------------------------------------

    def escape(self) -> None:
        """An escape outside a class (rule 2)."""
        s, i = self.s, self.i
        if i + 1 >= len(s):
            raise _Refused("trailing backslash at end of expression")
        c = s[i + 1]
        if c == "Q":
            end = s.find("\\E", i + 2)
            literal = s[i + 2 :] if end < 0 else s[i + 2 : end]
            self.out.append(re.escape(literal))
            self.i = len(s) if end < 0 else end + 2
            return
        if c in _ASSERTIONS:
            self.out.append(_EMPTY_WIDTH)
            self.i = i + 2
            return
        if c in _CLASS_ESCAPES:
            self.out.append("\\" + c)
            self.i = i + 2
            return
        if c in "pP":
            self.i = self.unicode_class(i + 2)
            self.out.append("a")
            return
        self.i = self.char_escape(i)
        self.out.append("a")

    def char_escape(self, i: int) -> int:
        """One escape that stands for one character (usable in a range); returns the index after it. Its code point
        is kept in ``self.code``."""
        s = self.s
        c = s[i + 1] if i + 1 < len(s) else ""
        if not c:
            raise _Refused("trailing backslash at end of expression")
        if c in _CHAR_ESCAPES:
            self.code = _CHAR_ESCAPES[c]
            return i + 2
        if c in _OCTAL:
            j = i + 2
            if c != "0" and (j >= len(s) or s[j] not in _OCTAL):
                raise _Refused(f"invalid escape sequence: `\\{c}` (back-references are not supported)")
            while j < len(s) and j < i + 4 and s[j] in _OCTAL:
                j += 1
            self.code = int(s[i + 1 : j], 8)
            return j
        if c == "x":
            return self.hex_escape(i + 2)
        if c.isascii() and not c.isalnum():
            self.code = ord(c)
            return i + 2
        if c in "89":
            raise _Refused(f"invalid escape sequence: `\\{c}` (back-references are not supported)")
        raise _Refused(f"invalid escape sequence: `\\{c}`")

    def hex_escape(self, j: int) -> int:
        s = self.s
        if j < len(s) and s[j] == "{":
            end = s.find("}", j + 1)
            digits = s[j + 1 : end] if end >= 0 else ""
            if end < 0 or not digits or not all(d in _HEX for d in digits) or int(digits, 16) > 0x10FFFF:
                raise _Refused("invalid escape sequence: `\\x{`")
            self.code = int(digits, 16)
            return end + 1
        if j + 2 <= len(s) and s[j] in _HEX and s[j + 1] in _HEX:
            self.code = int(s[j : j + 2], 16)
            return j + 2
        raise _Refused("invalid escape sequence: `\\x`")

    def unicode_class(self, j: int) -> int:
        """``\\pL``, ``\\p{Name}`` (and ``\\P``) starting at the letter or brace; returns the index after it."""
        s = self.s
        if j >= len(s):
            raise _Refused("invalid character class range: `\\p`")
        if s[j] == "{":
            end = s.find("}", j + 1)
            if end < 0 or not _UNICODE_NAME.fullmatch(s[j + 1 : end]):
                raise _Refused(f"invalid character class range: `{s[j - 2 : j + 12]}`")
            return end + 1
        if s[j] not in _CATEGORIES:
            raise _Refused(f"invalid character class range: `\\p{s[j]}`")
        return j + 1

    # -- classes ---------------------------------------------------------------------------------------------------

    def char_class(self) -> None:
        """``[...]`` (Perl mode: ``-`` is a literal where it cannot make a range); written as ``[a]``."""
        s = self.s
        i = self.i + 1
        if i < len(s) and s[i] == "^":
            i += 1
        first = True
        while True:
            if i >= len(s):
                raise _Refused(f"missing closing ]: `{s[self.i : self.i + 16]}`")
            c = s[i]
            if c == "]" and not first:
                i += 1
                break
            first = False
            if c == "[" and s.startswith("[:", i):
                end = s.find(":]", i + 2)
                if end >= 0:
                    name = s[i + 2 : end].removeprefix("^")
                    if name not in _POSIX:
                        raise _Refused(f"invalid character class range: `{s[i : end + 2][:24]}`")
                    i = end + 2
                    continue
            if c == "\\" and i + 1 < len(s) and s[i + 1] in _CLASS_ESCAPES:
                i += 2
                continue
            if c == "\\" and i + 1 < len(s) and s[i + 1] in "pP":
                i = self.unicode_class(i + 2)
                continue
            lo, i = self.class_char(i)
            if i + 1 < len(s) and s[i] == "-" and s[i + 1] != "]":
                hi, i = self.class_char(i + 1)
                if hi < lo:
                    raise _Refused(f"invalid character class range: `{chr(lo)}-{chr(hi)}`")
        self.out.append("[a]")
        self.i = i

    def class_char(self, i: int) -> tuple[int, int]:
        """One character of a class (a literal or a character escape): its code point and the index after it."""
        if self.s[i] != "\\":
            return ord(self.s[i]), i + 1
        end = self.char_escape(i)
        return self.code, end

    # -- groups ----------------------------------------------------------------------------------------------------

    def group(self) -> None:
        s, i = self.s, self.i
        if not s.startswith("(?", i):
            self.out.append("(")
            self.i = i + 1
            return
        rest = s[i + 2 : i + 4]
        if rest.startswith(("=", "!")) or rest in ("<=", "<!"):
            raise _Refused(f"invalid or unsupported Perl syntax: `{s[i : i + 4]}` (look-around)")
        if rest.startswith("P<") or rest.startswith("<"):
            start = i + (4 if rest.startswith("P") else 3)
            end = s.find(">", start)
            name = s[start:end] if end >= 0 else ""
            if end < 0 or not _NAME.fullmatch(name):
                raise _Refused(f"invalid named capture: `{s[i : i + 24]}`")
            if name in self.names:
                raise _Refused(f"duplicate capture group name: `{name[:64]}`")
            self.names.add(name)
            self.out.append(f"(?P<g{len(self.names)}>")
            self.i = end + 1
            return
        self.flags(i + 2)

    def flags(self, j: int) -> None:
        """``(?flags)`` or ``(?flags:``: ``i``, ``m``, ``s``, ``U``, one ``-`` followed by at least one flag."""
        s = self.s
        negated = seen = False
        while j < len(s):
            c = s[j]
            if c in _FLAGS:
                seen = True
            elif c == "-" and not negated:
                negated, seen = True, False
            elif c in ":)" and (seen or not negated):
                # Flags change what matches, never the syntax: a group opening stays, a bare flag group goes.
                self.out.append("(?:" if c == ":" else "")
                self.i = j + 1
                return
            else:
                break
            j += 1
        raise _Refused(f"invalid or unsupported Perl syntax: `{s[self.i : j + 1][:24]}`")


def _tree_problem(items: Any) -> str | None:
    for op_code, av in items:
        op = str(op_code)
        if op in _REFUSED:
            return f"{_REFUSED[op]} is not RE2 syntax"
        children: list[Any] = []
        if op in ("MAX_REPEAT", "MIN_REPEAT"):
            low, high = av[0], av[1]
            if low > MAX_REPEAT or (high != _parser.MAXREPEAT and high > MAX_REPEAT):
                return f"invalid repeat count: more than {MAX_REPEAT}"
            children = [av[2]]
        elif op == "SUBPATTERN":
            children = [av[3]]
        elif op == "BRANCH":
            children = list(av[1])
        for child in children:
            problem = _tree_problem(child)
            if problem is not None:
                return problem
    return None


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def re2_problem(pattern: str) -> str | None:
    """Why Go's ``regexp.Compile`` would refuse ``pattern`` (the module's rules), or None; on one line, a control
    character of the pattern quoted in it written as its escape (``\\n``)."""
    problem = _problem(pattern)
    return None if problem is None else _CONTROL.sub(lambda m: repr(m.group())[1:-1], problem)


def _problem(pattern: str) -> str | None:
    if len(pattern) > MAX_PATTERN:
        return f"regex is too large, max length allowed is {MAX_PATTERN}"
    try:
        stand_in = _Reader(pattern).run()
    except _Refused as refused:
        return f"error parsing regexp: {refused}"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # classes were rewritten: nothing Python warns about is left to judge
            parsed = _parser.parse(stand_in)
    except RecursionError:
        return "error parsing regexp: nested too deeply"
    except (re.error, OverflowError, ValueError, AssertionError, IndexError) as exc:
        # Positions are the stand-in's, not the pattern's: left out.
        return f"error parsing regexp: {_POSITION.sub('', str(exc))}"
    try:
        problem = _tree_problem(parsed)
    except RecursionError:
        return "error parsing regexp: nested too deeply"
    return None if problem is None else f"error parsing regexp: {problem}"

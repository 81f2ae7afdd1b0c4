"""The Lua header-edit subset (ambit.model.lua_headers): upstream's script, the lexical forms it accepts, what it
refuses (with a place), its bounds, and that no input raises anything but LuaSubsetError."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.upstream_objects import LUA_INBOUND

from ambit.model.envoyfilter import HeaderAction, HeaderOp
from ambit.model.errors import LuaSubsetError
from ambit.model.lua_headers import MAX_CODE, MAX_STATEMENTS, HeaderScript, parse_header_script

APPEND, OVERWRITE, REMOVE = HeaderAction.APPEND, HeaderAction.OVERWRITE, HeaderAction.REMOVE


def test_upstreams_script_is_one_appended_request_header() -> None:
    assert parse_header_script(LUA_INBOUND) == HeaderScript(request=(HeaderOp(APPEND, "x-lua-inbound", "hello world"),))


def test_both_hooks_every_method_both_quotes_comments_and_semicolons() -> None:
    code = """
    -- a line comment
    --[[ a long
         comment ]]
    function envoy_on_request(h)
      h:headers():add('X-A', "1");  h:headers():replace("x-b", '2')
      --[==[ ]] still a comment ]==]
      h:headers():remove('x-c')
    end
    function envoy_on_response(resp) resp:headers():add("x-r", "ok") end
    """
    assert parse_header_script(code) == HeaderScript(
        request=(HeaderOp(APPEND, "x-a", "1"), HeaderOp(OVERWRITE, "x-b", "2"), HeaderOp(REMOVE, "x-c")),
        response=(HeaderOp(APPEND, "x-r", "ok"),),
    )


@pytest.mark.parametrize(
    ("literal", "text"),
    [
        (r'"a\tb"', "a\tb"),
        (r"'it\'s'", "it's"),
        (r'"q\"q"', 'q"q'),
        (r'"\65\066\0677"', "ABC7"),
        (r'"\x41\x62"', "Ab"),
        (r'"\u{48}\u{e9}"', "Hé"),
        ('"a\\z   \n   b"', "ab"),
        (r'"back\\slash"', "back\\slash"),
        ("'\\\nx'", "\nx"),
    ],
)
def test_string_escapes_are_luas(literal: str, text: str) -> None:
    script = parse_header_script(f'function envoy_on_request(h) h:headers():add("x", {literal}) end')
    assert script.request == (HeaderOp(APPEND, "x", text),)


@pytest.mark.parametrize(
    ("code", "where"),
    [
        ("function envoy_on_request(h) os.execute('rm -rf /') end", "line 1, column 32"),
        ("function envoy_on_request(h) local x = 1 end", "line 1, column 38"),
        ("function envoy_on_request(h) h:headers():add('a', 'b' .. 'c') end", "line 1, column 55"),
        ("function envoy_on_request(h) h:headers():add('a', x) end", "line 1, column 51"),
        ("function envoy_on_request(h) other:headers():add('a', 'b') end", "line 1, column 30"),
        ("function envoy_on_request(h) h:headers():get('a') end", "line 1, column 42"),
        ("function envoy_on_request(h) h:headers():remove('a', 'b') end", "line 1, column 52"),
        ("function envoy_on_request(h) h:headers():add('a', 'b')", "line 1, column 55"),
        ("function helper(h) end", "line 1, column 10"),
        ("function envoy_on_request(h) end\nfunction envoy_on_request(h) end", "line 2, column 10"),
        ("function envoy_on_request(h) h:headers():add('a', 'b\nc') end", "line 1, column 51"),
        ("function envoy_on_request(h) h:headers():add('a', '\\256') end", "line 1, column 52"),
        ("function envoy_on_request(h) h:headers():add('a', '\\q') end", "line 1, column 52"),
        ("--[[ never closed", "line 1, column 3"),
        ("function envoy_on_request(h) h:headers():add([[a]], 'b') end", "line 1, column 46"),
        ("function envoy_on_request(end) end", "line 1, column 27"),
        ("function envoy_on_request(h) if true then end end", "line 1, column 30"),
    ],
)
def test_code_outside_the_subset_is_refused_with_its_place(code: str, where: str) -> None:
    with pytest.raises(LuaSubsetError, match=where):
        parse_header_script(code)


def test_deeply_nested_or_odd_code_is_refused_without_recursion() -> None:
    for code in ("(" * 100_000, "function envoy_on_request(h)" + " h:headers()" * 5000, "\x00\xff\u202e", "=" * 9999):
        with pytest.raises(LuaSubsetError):
            parse_header_script(code)


def test_huge_code_is_refused_before_it_is_read() -> None:
    statement = "h:headers():add('x', 'y') "
    with pytest.raises(LuaSubsetError, match="longer than"):
        parse_header_script("function envoy_on_request(h) " + statement * (MAX_CODE // len(statement) + 1) + "end")


def test_too_many_statements_are_refused() -> None:
    body = "h:headers():add('x','y')" * (MAX_STATEMENTS + 1)
    with pytest.raises(LuaSubsetError, match="statements"):
        parse_header_script(f"function envoy_on_request(h) {body} end")


def test_an_empty_chunk_edits_nothing() -> None:
    assert parse_header_script("  -- nothing\n") == HeaderScript()


@given(st.text(max_size=300))
@settings(max_examples=400, deadline=None)
def test_any_text_either_parses_or_raises_the_modules_own_error(code: str) -> None:
    with contextlib.suppress(LuaSubsetError):
        parse_header_script(code)


_PIECES = st.sampled_from(
    [
        "function",
        "envoy_on_request",
        "envoy_on_response",
        "end",
        "h",
        ":",
        "headers",
        "(",
        ")",
        ",",
        ";",
        "add",
        "replace",
        "remove",
        "'a'",
        '"b\\n"',
        "--x\n",
        "--[[y]]",
        " ",
        "\n",
        "'",
        '"',
        "\\",
        "[[",
        "]]",
        "\\u{",
    ]
)


@given(st.lists(_PIECES, max_size=60))
@settings(max_examples=400, deadline=None)
def test_near_miss_token_soup_either_parses_or_raises_the_modules_own_error(pieces: list[str]) -> None:
    with contextlib.suppress(LuaSubsetError):
        parse_header_script(" ".join(pieces))


_NAMES = st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True)
_VALUES = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF), max_size=20)


def _quote(value: str, quote: str) -> str:
    escaped = "".join(f"\\{ord(c):03d}" if c in "\\'\"" or 126 < ord(c) < 256 else c for c in value)
    return quote + escaped + quote


@given(st.lists(st.tuples(st.sampled_from(["add", "replace", "remove"]), _NAMES, _VALUES), max_size=8), st.booleans())
@settings(max_examples=200, deadline=None)
def test_written_edits_read_back_as_written(edits: list[tuple[str, str, str]], single: bool) -> None:
    quote = "'" if single else '"'
    lines = []
    for method, name, value in edits:
        args = _quote(name, quote) + ("" if method == "remove" else ", " + _quote(value, quote))
        lines.append(f"  handle:headers():{method}({args})")
    script = parse_header_script("function envoy_on_response(handle)\n" + "\n".join(lines) + "\nend\n")
    actions = {"add": APPEND, "replace": OVERWRITE, "remove": REMOVE}
    assert script.response == tuple(HeaderOp(actions[m], n, "" if m == "remove" else v) for m, n, v in edits)

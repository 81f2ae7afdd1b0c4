"""RFC 9110 tokens (ambit.model.field_names): every tchar, every kind of non-token, and the patterns held to a
plain set-membership reading of the RFC's grammar."""

from __future__ import annotations

import string

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ambit.model.field_names import LOWER_TOKEN, LOWER_TOKEN_BYTES, TCHAR_BYTES, TCHARS, TOKEN, is_token

# RFC 9110 §5.6.2, written out independently of the module:
#   tchar = "!" / "#" / "$" / "%" / "&" / "'" / "*" / "+" / "-" / "." / "^" / "_" / "`" / "|" / "~" / DIGIT / ALPHA
RFC_TCHAR = frozenset("!#$%&'*+-.^_`|~" + string.digits + string.ascii_letters)
UPPER = frozenset(string.ascii_uppercase)


def rfc_token(text: str, *, lower: bool = False) -> bool:
    allowed = RFC_TCHAR - UPPER if lower else RFC_TCHAR
    return bool(text) and all(c in allowed for c in text)


def test_the_listed_characters_are_the_rfcs_77() -> None:
    assert frozenset(TCHARS) == RFC_TCHAR and len(TCHARS) == 77
    assert frozenset(chr(b) for b in TCHAR_BYTES) == RFC_TCHAR


@pytest.mark.parametrize("char", sorted(RFC_TCHAR))
def test_every_tchar_alone_is_a_token(char: str) -> None:
    assert is_token(char) and TOKEN.fullmatch(char)
    lower = char not in UPPER
    assert bool(LOWER_TOKEN.fullmatch(char)) is lower
    assert bool(LOWER_TOKEN_BYTES.fullmatch(char.encode())) is lower


@pytest.mark.parametrize(
    "name",
    [
        "",
        *'"(),/:;<=>?@[\\]{}',  # the delimiters RFC 9110 §5.6.2 keeps out of tokens
        "x team",
        " x-team",
        "x-team\t",
        "x-team\n",  # what "^...$" with re.match would accept
        "x-team\r\n",
        "\nx-team",
        "x-\x00team",
        "x-\x7fteam",
        "x-\x1bteam",
        ":authority",
        "x-tëam",
        "x-team\u00a0",
        "\uff58-team",  # a full-width x: alphanumeric to Python, not ASCII
        "x-٣",  # an Arabic-Indic digit: matched by \\d, not a DIGIT
    ],
)
def test_anything_else_is_refused(name: str) -> None:
    assert not is_token(name)
    assert not TOKEN.fullmatch(name)
    assert not LOWER_TOKEN.fullmatch(name)
    assert not LOWER_TOKEN_BYTES.fullmatch(name.encode("utf-8"))


@pytest.mark.parametrize("name", ["Content-Type", "X-TEAM", "x-Team"])
def test_the_lower_case_patterns_refuse_upper_case(name: str) -> None:
    assert is_token(name)
    assert not LOWER_TOKEN.fullmatch(name)
    assert not LOWER_TOKEN_BYTES.fullmatch(name.encode("ascii"))
    assert LOWER_TOKEN.fullmatch(name.lower()) and LOWER_TOKEN_BYTES.fullmatch(name.lower().encode("ascii"))


NEAR_TOKENS = st.text(
    st.sampled_from(sorted(RFC_TCHAR)) | st.sampled_from(' "(),/:;<=>?@[\\]{}\t\r\n\x00\x7f\x80é\uff58٣'), max_size=12
)


@given(st.text(max_size=12) | NEAR_TOKENS)
@example("x-team\n")
@example("")
def test_the_patterns_agree_with_set_membership(text: str) -> None:
    assert is_token(text) is rfc_token(text)
    assert (TOKEN.fullmatch(text) is not None) is rfc_token(text)
    assert (LOWER_TOKEN.fullmatch(text) is not None) is rfc_token(text, lower=True)
    raw = text.encode("utf-8")
    assert (LOWER_TOKEN_BYTES.fullmatch(raw) is not None) is rfc_token(text, lower=True)


@given(st.binary(max_size=12))
def test_the_byte_pattern_agrees_with_set_membership_on_any_bytes(raw: bytes) -> None:
    expected = bool(raw) and all(chr(b) in RFC_TCHAR - UPPER for b in raw)
    assert (LOWER_TOKEN_BYTES.fullmatch(raw) is not None) is expected


def test_a_long_hostile_name_is_judged_in_linear_time() -> None:
    """The patterns are one character class repeated: no backtracking whatever the input (webhooks run them on
    user strings)."""
    hostile = "a" * 1_000_000 + "\n"
    assert not is_token(hostile)
    assert not LOWER_TOKEN_BYTES.fullmatch(hostile.encode())

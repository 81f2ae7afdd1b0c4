"""The pure parts of ``kubectl exec -t``: the resize channel's message, and the exec shim's exit codes."""

from __future__ import annotations

import json
import os
import signal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.k8s.remotecommand import MAX_RESIZE_MESSAGE, ResizeError, TerminalSize, parse_resize
from ambit.lab.runtime.exec_shim import exit_code


@pytest.mark.parametrize(
    ("message", "size"),
    [
        (b'{"Width": 80, "Height": 24}', TerminalSize(80, 24)),
        (b'{"Width":0,"Height":0}', TerminalSize(0, 0)),
        (b'{"Width": 65535, "Height": 1, "Extra": "ignored"}', TerminalSize(65535, 1)),
        (b'{"Height": 30}', TerminalSize(0, 30)),
        (b"{}", TerminalSize(0, 0)),
    ],
)
def test_a_resize_message_is_a_terminal_size(message: bytes, size: TerminalSize) -> None:
    assert parse_resize(message) == size


@pytest.mark.parametrize(
    ("message", "said"),
    [
        (b"", "not JSON"),
        (b"{", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[80, 24]", "a JSON list, not an object"),
        (b"null", "a JSON NoneType, not an object"),
        (b'{"Width": -1, "Height": 24}', "Width must be from 0 to 65535, not -1"),
        (b'{"Width": 80, "Height": 65536}', "Height must be from 0 to 65535, not 65536"),
        (b'{"Width": 80.5, "Height": 24}', "Width must be an integer, not 80.5"),
        (b'{"Width": true, "Height": 24}', "Width must be an integer, not true"),
        (b'{"Width": "80", "Height": 24}', 'Width must be an integer, not "80"'),
        (b'{"Width": 1' + b"0" * 200 + b', "Height": 24}', "Width must be from 0 to 65535, not 1000000000000"),
        (b"[" * 5000 + b"]" * 5000, "longer than 1024"),
        (b'{"Width": ' + b"1" * 2000 + b"}", "longer than 1024"),
    ],
)
def test_a_hostile_resize_message_is_one_clear_line(message: bytes, said: str) -> None:
    with pytest.raises(ResizeError) as caught:
        parse_resize(message)
    assert said in str(caught.value)
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 200


@given(st.binary(max_size=MAX_RESIZE_MESSAGE + 8))
def test_any_bytes_are_a_size_or_a_resize_error(message: bytes) -> None:
    try:
        size = parse_resize(message)
    except ResizeError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 200
    else:
        assert 0 <= size.width <= 0xFFFF and 0 <= size.height <= 0xFFFF


@given(
    st.dictionaries(
        st.sampled_from(["Width", "Height", "width", "Other"]),
        st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=False), st.text(max_size=8), st.booleans()),
    )
)
def test_a_json_object_is_a_size_exactly_when_both_sides_are_16_bit_integers(doc: dict[str, object]) -> None:
    def side(key: str) -> int | None:
        value = doc.get(key, 0)
        ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 0xFFFF
        return value if ok and isinstance(value, int) else None

    width, height = side("Width"), side("Height")
    message = json.dumps(doc).encode()
    if width is None or height is None:
        with pytest.raises(ResizeError):
            parse_resize(message)
    else:
        assert parse_resize(message) == TerminalSize(width, height)


def test_the_shim_reports_an_exit_code_or_128_plus_the_signal_as_a_shell_does() -> None:
    assert exit_code(0) == 0
    assert exit_code(7 << 8) == 7
    assert exit_code(signal.SIGKILL) == 128 + signal.SIGKILL
    assert exit_code(signal.SIGTERM) == 128 + signal.SIGTERM
    assert os.WIFEXITED(3 << 8)

"""The node agent's probe answers (ambit.cni.health.probe_answer, rule 1): a table, and a property over any
method and target."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.cni.health import ProbeAnswer, probe_answer


@pytest.mark.parametrize(
    ("method", "target", "ready", "expected"),
    [
        (b"GET", b"/healthz", False, ProbeAnswer(200, b"ok")),
        (b"HEAD", b"/healthz", False, ProbeAnswer(200, b"ok")),
        (b"GET", b"/readyz", True, ProbeAnswer(200, b"ok")),
        (b"GET", b"/readyz", False, ProbeAnswer(503, b"not ready")),
        (b"GET", b"/readyz?verbose", True, ProbeAnswer(200, b"ok")),
        (b"POST", b"/readyz", True, ProbeAnswer(405, b"method not allowed")),
        (b"GET", b"/readyz/", True, ProbeAnswer(404, b"not found")),
        (b"GET", b"/", True, ProbeAnswer(404, b"not found")),
        (b"GET", b"http://node:8000/readyz", True, ProbeAnswer(404, b"not found")),
    ],
)
def test_each_probe_gets_its_answer(method: bytes, target: bytes, ready: bool, expected: ProbeAnswer) -> None:
    assert probe_answer(method, target, ready=ready) == expected


@given(method=st.binary(max_size=16), target=st.binary(max_size=64), ready=st.booleans())
def test_any_request_gets_one_of_the_five_answers_and_only_readyz_depends_on_readiness(
    method: bytes, target: bytes, ready: bool
) -> None:
    answer = probe_answer(method, target, ready=ready)
    assert answer.status in (200, 404, 405, 503)
    if answer != probe_answer(method, target, ready=not ready):
        assert target.split(b"?", 1)[0] == b"/readyz"

"""Istio's two switches for HTTP/1.0 at the waypoint and gateway (:func:`ambit.waypoint.settings.accepts_http10`):
istiod's ``PILOT_HTTP10`` (a Go boolean) or the proxy's ``ISTIO_META_HTTP10`` metadata, exactly ``"1"``."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.waypoint.errors import WaypointSettingsError
from ambit.waypoint.settings import WaypointSettings, accepts_http10


@pytest.mark.parametrize(
    ("environ", "accepted"),
    [
        ({}, False),  # Istio's default: refused 426
        ({"PILOT_HTTP10": "true"}, True),
        ({"PILOT_HTTP10": "1"}, True),
        ({"PILOT_HTTP10": "T"}, True),
        ({"PILOT_HTTP10": "True"}, True),
        ({"PILOT_HTTP10": "false"}, False),
        ({"PILOT_HTTP10": "0"}, False),
        ({"PILOT_HTTP10": ""}, False),  # unset in effect (env.Register keeps its default)
        ({"ISTIO_META_HTTP10": "1"}, True),
        ({"ISTIO_META_HTTP10": "true"}, False),  # enableHTTP10: only "1" counts
        ({"ISTIO_META_HTTP10": " 1"}, False),
        ({"PILOT_HTTP10": "false", "ISTIO_META_HTTP10": "1"}, True),  # either switch
        ({"PILOT_HTTP10": "true", "ISTIO_META_HTTP10": "0"}, True),
    ],
)
def test_either_switch_accepts_http10(environ: dict[str, str], accepted: bool) -> None:
    assert accepts_http10(environ) is accepted


@pytest.mark.parametrize("value", ["yes", "on", "tRuE", " true", "2", "x" * 10_000])
def test_a_pilot_http10_that_is_no_go_boolean_is_an_error_naming_it(value: str) -> None:
    with pytest.raises(WaypointSettingsError) as caught:
        accepts_http10({"PILOT_HTTP10": value})
    message = str(caught.value)
    assert message.startswith("PILOT_HTTP10: expected true or false") and len(message) < 200


def test_settings_refuse_http10_by_default() -> None:
    assert WaypointSettings(namespace="app", gateway_name="waypoint", service_account="w").accept_http10 is False


@given(st.dictionaries(st.sampled_from(["PILOT_HTTP10", "ISTIO_META_HTTP10", "OTHER"]), st.text(max_size=40)))
def test_any_environment_gives_a_bool_or_one_clean_error(environ: dict[str, str]) -> None:
    try:
        accepted = accepts_http10(environ)
    except WaypointSettingsError as exc:
        assert "PILOT_HTTP10" in str(exc)
        return
    assert accepted is (environ.get("PILOT_HTTP10") in ("1", "t", "T", "TRUE", "true", "True")) or (
        environ.get("ISTIO_META_HTTP10") == "1"
    )

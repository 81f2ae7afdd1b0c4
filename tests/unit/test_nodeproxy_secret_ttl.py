"""The workload certificate lifetime a node proxy asks for: ``--secret-ttl``, else ztunnel's ``SECRET_TTL``."""

from __future__ import annotations

import pytest

from ambit.inpod.settings import DEFAULT_SECRET_TTL, NodeProxySettingsError, parse_secret_ttl


@pytest.mark.parametrize(
    ("flag", "environ", "seconds"),
    [
        (None, {}, DEFAULT_SECRET_TTL),  # ztunnel's 24 h
        (None, {"SECRET_TTL": "5m"}, 300),  # Istio's ambient test suite
        ("90s", {"SECRET_TTL": "5m"}, 90),  # the flag wins
        (None, {"SECRET_TTL": "3600"}, 3600),
        (None, {"SECRET_TTL": "1h"}, 3600),
        (None, {"SECRET_TTL": "1.5s"}, 1),  # whole seconds on the wire
    ],
)
def test_the_secret_ttl_follows_ztunnels_order(flag: str | None, environ: dict[str, str], seconds: int) -> None:
    assert parse_secret_ttl(flag, environ) == seconds


@pytest.mark.parametrize(
    ("flag", "environ", "message"),
    [
        (None, {"SECRET_TTL": "0"}, "at least 1 second"),
        (None, {"SECRET_TTL": "500ms"}, "at least 1 second"),
        (None, {"SECRET_TTL": "-5m"}, "0 seconds or more"),
        (None, {"SECRET_TTL": "soon"}, "expected seconds"),
        ("5 days", {}, "--secret-ttl"),
    ],
)
def test_a_bad_secret_ttl_is_one_clear_line(flag: str | None, environ: dict[str, str], message: str) -> None:
    with pytest.raises(NodeProxySettingsError, match=message):
        parse_secret_ttl(flag, environ)

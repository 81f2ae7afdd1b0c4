"""The waypoint's authorization gate, pure parts: path normalization (RFC 3986, Istio's BASE), which policies a
destination gets, and the request and connection it judges."""

from __future__ import annotations

import re

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from ambit.model.policy import Action, Policy, Scope
from ambit.model.routes import WaypointConfig
from ambit.waypoint.authorization import WaypointAuthorizer, normalize_path, request_of
from ambit.waypoint.decisions import RequestHead


@pytest.mark.parametrize(
    ("target", "path"),
    [
        ("/a/b?x=1", "/a/b"),
        ("/a/./b/../c", "/a/c"),
        ("/../../etc/passwd", "/etc/passwd"),
        ("/a/b/..", "/a/"),
        ("/a/b/.", "/a/b/"),
        ("/%61dmin", "/admin"),
        ("/%2e%2e/admin", "/admin"),
        ("/a/%2E%2E/admin", "/admin"),
        ("/a%2fb", "/a%2Fb"),
        ("/a//b", "/a//b"),
        ("/%7euser", "/~user"),
        ("/a%20b", "/a%20b"),
        ("/bad%zz", "/bad%zz"),
        ("http://host:80/x/../y?q", "/y"),
        ("*", "*"),
        ("/#frag", "/"),
    ],
)
def test_paths_are_normalized_as_envoy_normalize_path(target: str, path: str) -> None:
    assert normalize_path(target) == path


_path_chars = st.sampled_from(["/", ".", "a", "%2e", "%2E", "%41", "%2f", "..", "?", "%"])


@given(st.lists(_path_chars, max_size=20).map(lambda parts: "/" + "".join(parts)))
def test_normalization_is_idempotent_and_leaves_no_dot_segment(target: str) -> None:
    # Escapes are decoded once: a stray "%" may meet a decoded character and read as an escape in a second pass
    # ("/%a%41" → "/%aA"), which is why policies see the path normalized once, never twice.
    assume(re.search(r"%(?![0-9A-Fa-f]{2})", target) is None)
    path = normalize_path(target)
    assert normalize_path(path) == path
    assert "?" not in path
    segments = path.split("/")
    assert "." not in segments and ".." not in segments


def test_request_of_reads_the_head() -> None:
    head = RequestHead("GET", "/a/../b?x", "Shop.Example:80", (("x-env", "prod"),))
    request = request_of(head)
    assert (request.method, request.host, request.path, request.headers) == (
        "GET",
        "Shop.Example:80",
        "/b",
        (("x-env", "prod"),),
    )
    assert request.remote_ip is None and request.identity is None  # XFF is not trusted; no token yet


def test_a_destination_gets_the_waypoint_policies_and_its_own_service_policies() -> None:
    config = WaypointConfig(
        "app/waypoint",
        policies=(
            Policy("all", "app", Scope.WAYPOINT, Action.DENY),
            Policy("mine", "app", Scope.SERVICE, Action.ALLOW, services=("app/a.app.svc.cluster.local",)),
            Policy("theirs", "app", Scope.SERVICE, Action.AUDIT, services=("app/b.app.svc.cluster.local",)),
        ),
    )
    authorizer = WaypointAuthorizer()
    a = authorizer.applicable(config, "app/a.app.svc.cluster.local")
    assert ([p.key for p in a.deny], [p.key for p in a.allow], a.audit) == (["app/all"], ["app/mine"], ())
    b = authorizer.applicable(config, "app/b.app.svc.cluster.local")
    assert ([p.key for p in b.allow], [p.key for p in b.audit]) == ([], ["app/theirs"])
    workload = authorizer.applicable(config, "")
    assert [p.key for p in workload.deny] == ["app/all"] and not workload.allow
    assert authorizer.applicable(config, "") is workload  # cached per config
    assert authorizer.applicable(WaypointConfig("app/waypoint"), "").deny == ()  # a new config is read again

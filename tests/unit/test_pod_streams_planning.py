"""The pure parts of ``kubectl logs`` and ``kubectl exec``: log options and windows, the channel protocol's frames
and exit Status, and the API server's choice of container, node and error."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.apiserver.errors import ApiError
from ambit.apiserver.pod_streams import (
    choose_container,
    offered_protocols,
    plan_attach,
    plan_exec,
    plan_logs,
    plan_port_forward,
)
from ambit.apiserver.rbac_policy import request_attributes
from ambit.k8s.pod_logs import LogOptions, LogOptionsError, parse_log_options, plan_window, tail_start
from ambit.k8s.remotecommand import (
    AttachOptions,
    Channel,
    ExecOptionsError,
    closes_stdin,
    exit_code_of,
    exit_status,
    frame,
    parse_attach_options,
    parse_exec_options,
    parse_frame,
    status_message,
)
from ambit.lab.runtime.kubelet_server import attach_refusal


def pod(containers: tuple[str, ...] = ("main",), node: str = "node-a", **meta: Any) -> dict[str, Any]:
    running = [{"name": c, "state": {"running": {}}} for c in containers]
    return {
        "metadata": {"name": "p", "namespace": "default", **meta},
        "spec": {"nodeName": node, "containers": [{"name": c} for c in containers]},
        "status": {"phase": "Running", "containerStatuses": running},
    }


# -- log options and windows --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("data", "lines", "start"),
    [
        (b"a\nb\nc\n", 1, 4),
        (b"a\nb\nc\n", 2, 2),
        (b"a\nb\nc\n", 3, 0),
        (b"a\nb\nc\n", 9, 0),
        (b"a\nb\nc", 1, 4),
        (b"a\nb\nc\n", 0, 6),
        (b"", 3, 0),
        (b"\n\n", 1, 1),
    ],
)
def test_tail_start_finds_where_the_last_lines_begin(data: bytes, lines: int, start: int) -> None:
    assert tail_start(data, lines) == start


@given(st.lists(st.binary(max_size=8).map(lambda b: b.replace(b"\n", b"")), max_size=20), st.integers(0, 25))
def test_tail_start_gives_exactly_the_last_lines(lines: list[bytes], n: int) -> None:
    data = b"".join(line + b"\n" for line in lines)
    assert data[tail_start(data, n) :] == b"".join(line + b"\n" for line in lines[max(0, len(lines) - n) :] if n)


def test_a_window_takes_the_tail_or_nothing_when_the_file_is_older_than_since() -> None:
    data = b"one\ntwo\nthree\n"
    options = LogOptions(tail_lines=1, limit_bytes=3)
    assert plan_window(options, len(data), data, mtime=100.0, now=100.0).start == 8
    assert plan_window(options, len(data), data, mtime=100.0, now=100.0).limit == 3
    old = LogOptions(since_seconds=10)
    assert plan_window(old, len(data), b"", mtime=50.0, now=100.0).start == len(data)
    assert plan_window(old, len(data), b"", mtime=95.0, now=100.0).start == 0
    # a tail read from the file's last bytes only: offsets are the file's
    assert plan_window(LogOptions(tail_lines=1), 1000, b"x\nlast\n", mtime=0.0, now=0.0).start == 1000 - 5


def test_log_options_parse_kubes_query_and_refuse_what_kube_or_the_lab_cannot_serve() -> None:
    got = parse_log_options({"follow": "true", "tailLines": "5", "limitBytes": "10", "container": "c"})
    assert got == LogOptions(container="c", follow=True, tail_lines=5, limit_bytes=10)
    for query, code in [
        ({"tailLines": "x"}, 400),
        ({"tailLines": "-1"}, 422),
        ({"limitBytes": "0"}, 422),
        ({"sinceSeconds": "0"}, 422),
        ({"timestamps": "true"}, 400),
        ({"follow": "maybe"}, 400),
        ({"sinceTime": "2026-01-01T00:00:00Z"}, 400),
        ({"tailLines": "9" * 40}, 400),
    ]:
        with pytest.raises(LogOptionsError) as caught:
            parse_log_options(query)
        assert caught.value.code == code, query


@given(st.dictionaries(st.sampled_from(["follow", "tailLines", "limitBytes", "sinceSeconds", "container"]), st.text()))
def test_log_options_from_any_query_parse_or_are_refused_with_a_code(query: dict[str, str]) -> None:
    try:
        parse_log_options(query)
    except LogOptionsError as exc:
        assert exc.code in (400, 422)


# -- channel protocol ---------------------------------------------------------------------------------------------
def test_frames_carry_their_channel_first_and_empty_or_unknown_messages_are_ignored() -> None:
    assert frame(Channel.STDOUT, b"hi") == b"\x01hi"
    got = parse_frame(b"\x00data")
    assert got is not None and got.channel is Channel.STDIN and got.data == b"data"
    assert parse_frame(b"") is None
    assert parse_frame(b"\x09x") is None
    close = parse_frame(b"\xff\x00")
    assert close is not None and closes_stdin(close)
    other = parse_frame(b"\xff\x01")
    assert other is not None and not closes_stdin(other)


@given(st.binary(max_size=64))
def test_any_message_parses_to_a_frame_or_nothing(message: bytes) -> None:
    got = parse_frame(message)
    if got is not None:
        assert frame(got.channel, got.data) == message


@pytest.mark.parametrize("code", [0, 1, 3, 127, 255])
def test_the_exit_status_carries_the_code_as_kubes_kubelet_writes_it(code: int) -> None:
    status = exit_status(code)
    assert exit_code_of(status) == code
    message = status_message(status)
    assert message[0] == Channel.ERROR
    doc = json.loads(message[1:])
    if code:
        assert doc["reason"] == "NonZeroExitCode"
        assert doc["details"]["causes"] == [{"reason": "ExitCode", "message": str(code)}]
    else:
        assert doc == {"metadata": {}, "status": "Success"}


def test_exec_options_need_a_command_and_a_stream_and_merge_stderr_under_a_tty() -> None:
    got = parse_exec_options({"command": ["sh", "-c", "x"], "stdout": ["true"], "stderr": ["true"], "tty": ["true"]})
    assert got.command == ("sh", "-c", "x") and got.tty and not got.stderr
    with pytest.raises(ExecOptionsError, match="at least 1 command"):
        parse_exec_options({"stdout": ["true"]})
    with pytest.raises(ExecOptionsError, match="at least 1 of stdin, stdout, stderr"):
        parse_exec_options({"command": ["true"]})
    with pytest.raises(ExecOptionsError):
        parse_exec_options({"command": ["a\x00b"], "stdout": ["true"]})


@given(st.dictionaries(st.sampled_from(["command", "stdin", "stdout", "stderr", "tty"]), st.lists(st.text())))
def test_exec_options_from_any_query_parse_or_are_refused(query: dict[str, list[str]]) -> None:
    with contextlib.suppress(ExecOptionsError):
        parse_exec_options(query)


# -- the API server's plans ---------------------------------------------------------------------------------------
def test_the_container_is_the_named_the_only_or_the_annotated_one() -> None:
    assert choose_container(pod(), "") == "main"
    assert choose_container(pod(("a", "b")), "b") == "b"
    annotated = pod(("a", "b"), annotations={"kubectl.kubernetes.io/default-container": "b"})
    assert choose_container(annotated, "") == "b"
    with pytest.raises(ApiError, match=r"a container name must be specified for pod p, choose one of: \[a b\]"):
        choose_container(pod(("a", "b")), "")
    with pytest.raises(ApiError, match="container c is not valid for pod p"):
        choose_container(pod(), "c")


def test_plan_logs_forwards_the_options_to_the_pods_node() -> None:
    target = plan_logs(pod(), {"tailLines": "2", "follow": "true", "pretty": "x"})
    assert target.node == "node-a"
    assert target.path == "/containerLogs/default/p/main"
    assert dict(target.query) == {"tailLines": "2", "follow": "true"}


def test_plan_logs_refuses_previous_waiting_and_invalid_options_as_kube_does() -> None:
    with pytest.raises(ApiError, match='previous terminated container "main" in pod "p" not found') as caught:
        plan_logs(pod(), {"previous": "true"})
    assert caught.value.code == 400
    with pytest.raises(ApiError, match="is waiting to start: ContainerCreating"):
        plan_logs(pod(node=""), {})
    with pytest.raises(ApiError) as caught:
        plan_logs(pod(), {"tailLines": "-2"})
    assert caught.value.code == 422


def test_plan_exec_needs_a_node_and_a_pod_that_has_not_completed() -> None:
    target = plan_exec(pod(), {"command": ["ls", "-l"], "stdout": ["true"], "stdin": ["1"]})
    assert target.path == "/exec/default/p/main"
    assert target.query == (("command", "ls"), ("command", "-l"), ("stdin", "true"), ("stdout", "true"))
    with pytest.raises(ApiError, match="pod p does not have a host assigned"):
        plan_exec(pod(node=""), {"command": ["ls"], "stdout": ["true"]})
    done = pod()
    done["status"]["phase"] = "Succeeded"
    with pytest.raises(ApiError, match="cannot exec into a container in a completed pod; current phase is Succeeded"):
        plan_exec(done, {"command": ["ls"], "stdout": ["true"]})


def test_plan_attach_forwards_attachs_options_and_refuses_as_exec_does() -> None:
    target = plan_attach(pod(), {"stdout": ["true"], "stderr": ["true"], "tty": ["true"], "container": ["main"]})
    assert (target.node, target.path) == ("node-a", "/attach/default/p/main")
    assert target.query == (("stdout", "true"), ("tty", "true"))  # a tty has one output
    with pytest.raises(ApiError, match="you must specify at least 1 of stdin, stdout, stderr"):
        plan_attach(pod(), {})
    with pytest.raises(ApiError, match="pod p does not have a host assigned"):
        plan_attach(pod(node=""), {"stdout": ["true"]})
    done = pod()
    done["status"]["phase"] = "Failed"
    with pytest.raises(ApiError, match="cannot attach into a container in a completed pod; current phase is Failed"):
        plan_attach(done, {"stdout": ["true"]})
    with pytest.raises(ApiError, match="container other is not valid for pod p"):
        plan_attach(pod(), {"stdout": ["true"], "container": ["other"]})


@given(st.dictionaries(st.sampled_from(["stdin", "stdout", "stderr", "tty", "container"]), st.lists(st.text())))
def test_attach_options_parse_or_fail_with_a_clear_error(query: dict[str, list[str]]) -> None:
    try:
        options = parse_attach_options(query)
    except ExecOptionsError as exc:
        assert str(exc)
    else:
        assert isinstance(options, AttachOptions)
        assert options.stdin or options.stdout or options.stderr or options.tty
        assert not (options.tty and options.stderr)


def test_attach_to_stdin_is_refused_with_the_reason_and_output_alone_is_served() -> None:
    plain, interactive = pod(), pod()
    interactive["spec"]["containers"][0]["stdin"] = True
    out = AttachOptions("", stdin=False, stdout=True, stderr=True, tty=False)
    into = AttachOptions("", stdin=True, stdout=True, stderr=False, tty=True)
    assert attach_refusal(plain, "main", out) is None
    assert attach_refusal(interactive, "main", out) is None
    assert 'container "main" was not started with stdin: true' in str(attach_refusal(plain, "main", into))
    assert "keeps no container's stdin open" in str(attach_refusal(interactive, "main", into))


def test_only_our_subprotocols_are_taken_in_the_clients_order() -> None:
    assert offered_protocols("v5.channel.k8s.io, v4.channel.k8s.io") == ("v5.channel.k8s.io", "v4.channel.k8s.io")
    assert offered_protocols("base64.channel.k8s.io, v4.channel.k8s.io") == ("v4.channel.k8s.io",)
    assert offered_protocols("") == ()


def test_a_websocket_get_on_pods_exec_is_authorized_as_create() -> None:
    path = "/api/v1/namespaces/default/pods/p/exec"
    assert request_attributes("jane", (), "GET", path, False).verb == "create"
    assert request_attributes("jane", (), "POST", path, False).verb == "create"
    attach = request_attributes("jane", (), "GET", "/api/v1/namespaces/default/pods/p/attach", False)
    assert (attach.verb, attach.subresource) == ("create", "attach")
    logs = request_attributes("jane", (), "GET", "/api/v1/namespaces/default/pods/p/log", False)
    assert (logs.verb, logs.subresource) == ("get", "log")


# -- port-forward -------------------------------------------------------------------------------------------------
def test_port_forward_goes_to_the_pods_node_kubelet() -> None:
    target = plan_port_forward(pod())
    assert (target.node, target.path, target.query) == ("node-a", "/portForward/default/p", ())


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"spec": {"containers": [{"name": "main"}]}}, "pod p does not have a host assigned"),
        (
            {"status": {"phase": "Succeeded"}},
            "unable to forward port because pod is not running. Current status=Succeeded",
        ),
        ({"status": {"phase": "Pending"}}, "unable to forward port because pod is not running. Current status=Pending"),
    ],
)
def test_port_forward_needs_a_running_pod_on_a_node(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ApiError) as refused:
        plan_port_forward(pod() | changes)
    assert (refused.value.code, refused.value.message) == (400, message)


@given(st.text(max_size=20), st.text(max_size=20), st.text(max_size=12))
def test_port_forward_planning_of_any_stored_pod_is_a_target_or_a_400(name: str, node: str, phase: str) -> None:
    stored = {"metadata": {"name": name, "namespace": "ns"}, "spec": {"nodeName": node}, "status": {"phase": phase}}
    try:
        target = plan_port_forward(stored)
    except ApiError as exc:
        assert exc.code == 400
    else:
        assert (target.node, target.path) == (node, f"/portForward/ns/{name}")
        assert phase == "Running"


def test_a_port_forward_websocket_get_is_authorized_as_create() -> None:
    path = "/api/v1/namespaces/default/pods/p/portforward"
    for method in ("GET", "POST"):
        attrs = request_attributes("jane", (), method, path, False)
        assert (attrs.verb, attrs.resource, attrs.subresource) == ("create", "pods", "portforward")

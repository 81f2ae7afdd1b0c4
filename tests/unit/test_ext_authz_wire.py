"""The hand-encoded ``envoy.service.auth.v3`` subset (waypoint.ext_authz_wire rules 1-2), checked against the
protobuf runtime reading a schema with Envoy's field numbers; the gRPC verdicts (waypoint.ext_authz rule 8); the
lab's sample authorizer (lab.ext_authz_app rules 1-2)."""

from __future__ import annotations

import contextlib
import importlib
import subprocess
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.lab.ext_authz_app import DENY_BODY, decide, grpc_answer, http_answer
from ambit.model.envoyfilter import HeaderAction, HeaderOp
from ambit.model.extauthz import ExtAuthzProvider, ProviderKind
from ambit.waypoint.decisions import RequestHead
from ambit.waypoint.ext_authz import CheckAllowed, CheckDenied, check_attributes, judge_grpc_answer
from ambit.waypoint.ext_authz_edits import RequestEdit
from ambit.waypoint.ext_authz_wire import (
    ADD_IF_ABSENT,
    MAX_HEADERS,
    OVERWRITE_IF_EXISTS,
    OVERWRITE_IF_EXISTS_OR_ADD,
    CheckAnswer,
    CheckAttributes,
    ExtAuthzWireError,
    HeaderOption,
    decode_check_request,
    decode_check_response,
    encode_check_request,
    encode_check_response,
    options,
)

# Envoy's messages cut to the fields the waypoint uses, with Envoy's field numbers (external_auth.proto,
# attribute_context.proto, config/core/v3 address.proto and base.proto, type/v3 http_status.proto, google.rpc).
REFERENCE = """
syntax = "proto3";
package ref;
message SocketAddress { string address = 2; uint32 port_value = 3; }
message Address { SocketAddress socket_address = 1; }
message Peer { Address address = 1; string service = 2; string principal = 4; }
message HttpRequest {
  string id = 1; string method = 2; map<string, string> headers = 3; string path = 4; string host = 5;
  string scheme = 6; int64 size = 9; string protocol = 10; string body = 11; bytes raw_body = 12;
}
message Request { HttpRequest http = 2; }
message AttributeContext { Peer source = 1; Peer destination = 2; Request request = 4; }
message CheckRequest { AttributeContext attributes = 1; }
message RpcStatus { int32 code = 1; string message = 2; }
message HttpStatus { int32 code = 1; }
message HeaderValue { string key = 1; string value = 2; }
message BoolValue { bool value = 1; }
message HeaderValueOption { HeaderValue header = 1; BoolValue append = 2; int32 append_action = 3; }
message DeniedHttpResponse { HttpStatus status = 1; repeated HeaderValueOption headers = 2; string body = 3; }
message OkHttpResponse {
  repeated HeaderValueOption headers = 2; repeated string headers_to_remove = 5;
  repeated HeaderValueOption response_headers_to_add = 6;
}
message CheckResponse {
  RpcStatus status = 1;
  oneof http_response { DeniedHttpResponse denied_response = 2; OkHttpResponse ok_response = 3; }
}
"""


@pytest.fixture(scope="module")
def ref(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    folder = tmp_path_factory.mktemp("ref")
    (folder / "ref_authz.proto").write_text(REFERENCE, encoding="utf-8")
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{folder}", f"--python_out={folder}", "ref_authz.proto"],
        check=True,
        cwd=folder,
    )
    sys.path.insert(0, str(folder))
    try:
        yield importlib.import_module("ref_authz_pb2")
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("ref_authz_pb2", None)


ATTRIBUTES = CheckAttributes(
    method="GET",
    path="/headers?a=1",
    host="httpbin:8000",
    headers=((":authority", "httpbin:8000"), ("x-ext-authz", "allow"), ("cookie", "a"), ("cookie", "b")),
    request_id="r-1",
    protocol="HTTP/1.1",
    size=-1,
    source_address="10.0.0.1",
    source_port=43122,
    source_principal="spiffe://cluster.local/ns/foo/sa/sleep",
    destination_address="10.0.0.2",
    destination_port=8000,
    destination_principal="spiffe://cluster.local/ns/foo/sa/waypoint",
)


def test_a_check_request_reads_as_envoys(ref: ModuleType) -> None:
    message = ref.CheckRequest.FromString(encode_check_request(ATTRIBUTES))
    http = message.attributes.request.http
    assert (http.id, http.method, http.path, http.host, http.scheme, http.size, http.protocol) == (
        "r-1",
        "GET",
        "/headers?a=1",
        "httpbin:8000",
        "http",
        -1,
        "HTTP/1.1",
    )
    assert dict(http.headers) == {":authority": "httpbin:8000", "x-ext-authz": "allow", "cookie": "a,b"}
    source = message.attributes.source
    assert (source.address.socket_address.address, source.address.socket_address.port_value, source.principal) == (
        "10.0.0.1",
        43122,
        "spiffe://cluster.local/ns/foo/sa/sleep",
    )
    assert message.attributes.destination.principal.endswith("/sa/waypoint")
    back = decode_check_request(message.SerializeToString())
    assert set(back.headers) == {("x-ext-authz", "allow"), ("cookie", "a,b"), (":authority", "httpbin:8000")}
    assert (back.method, back.source_port, back.size, back.destination_address) == ("GET", 43122, -1, "10.0.0.2")


def test_check_responses_written_by_the_runtime_are_read(ref: ModuleType) -> None:
    ok = ref.CheckResponse(status=ref.RpcStatus(code=0))
    ok.ok_response.headers.add(header=ref.HeaderValue(key="x-user", value="alice"))
    ok.ok_response.headers_to_remove.append("authorization")
    ok.ok_response.response_headers_to_add.add(header=ref.HeaderValue(key="set-cookie", value="s=1"))
    assert decode_check_response(ok.SerializeToString()) == CheckAnswer(
        0, ok_headers=options((("x-user", "alice"),)), ok_headers_to_remove=("authorization",),
        ok_response_headers=options((("set-cookie", "s=1"),)),
    )  # fmt: skip
    denied = ref.CheckResponse(status=ref.RpcStatus(code=7, message="no"))
    denied.denied_response.status.code = 401
    denied.denied_response.headers.add(header=ref.HeaderValue(key="www-authenticate", value="Basic"))
    denied.denied_response.body = "who are you"
    assert decode_check_response(denied.SerializeToString()) == CheckAnswer(
        7, "no", 401, options((("www-authenticate", "Basic"),)), "who are you"
    )


def test_header_options_append_and_append_action_are_read_as_the_runtime_writes_them(ref: ModuleType) -> None:
    ok = ref.CheckResponse(status=ref.RpcStatus(code=0))
    ok.ok_response.headers.add(header=ref.HeaderValue(key="x-a", value="1"))  # neither set
    ok.ok_response.headers.add(header=ref.HeaderValue(key="x-b", value="2"), append=ref.BoolValue(value=True))
    ok.ok_response.headers.add(header=ref.HeaderValue(key="x-c", value="3"), append=ref.BoolValue())  # set, false
    ok.ok_response.headers.add(header=ref.HeaderValue(key="x-d", value="4"), append_action=ADD_IF_ABSENT)
    ok.ok_response.response_headers_to_add.add(
        header=ref.HeaderValue(key="set-cookie", value="s=1"), append_action=OVERWRITE_IF_EXISTS
    )
    ok.ok_response.response_headers_to_add.add(header=ref.HeaderValue(key="x-e", value="5"), append_action=-7)
    answer = decode_check_response(ok.SerializeToString())
    assert answer.ok_headers == (
        HeaderOption("x-a", "1"),
        HeaderOption("x-b", "2", True),
        HeaderOption("x-c", "3", False),
        HeaderOption("x-d", "4", None, ADD_IF_ABSENT),
    )
    assert answer.ok_response_headers == (
        HeaderOption("set-cookie", "s=1", None, OVERWRITE_IF_EXISTS),
        HeaderOption("x-e", "5", None, -7),
    )
    back = ref.CheckResponse.FromString(encode_check_response(answer))
    assert back == ok  # the same message, field for field, presence of the wrapper included
    assert [h.HasField("append") for h in back.ok_response.headers] == [False, True, True, False]
    denied = ref.CheckResponse(status=ref.RpcStatus(code=7))
    denied.denied_response.headers.add(
        header=ref.HeaderValue(key="set-cookie", value="a=1"), append_action=OVERWRITE_IF_EXISTS_OR_ADD
    )
    assert decode_check_response(denied.SerializeToString()).denied_headers == (
        HeaderOption("set-cookie", "a=1", None, OVERWRITE_IF_EXISTS_OR_ADD),
    )


def test_a_repeated_header_or_append_field_merges_as_protobuf_merges(ref: ModuleType) -> None:
    first = ref.HeaderValueOption(header=ref.HeaderValue(key="x-a", value="1"), append=ref.BoolValue(value=True))
    second = ref.HeaderValueOption(header=ref.HeaderValue(value="2"), append=ref.BoolValue())
    option = first.SerializeToString() + second.SerializeToString()  # one option written in two pieces
    ok = bytes([0x12, len(option)]) + option  # OkHttpResponse.headers (field 2)
    wire = bytes([0x0A, 0x00, 0x1A, len(ok)]) + ok  # status (field 1, empty), ok_response (field 3)
    parsed = ref.CheckResponse.FromString(wire).ok_response.headers[0]
    runtime = HeaderOption(parsed.header.key, parsed.header.value, parsed.append.value, parsed.append_action)
    assert decode_check_response(wire).ok_headers == (runtime,) == (HeaderOption("x-a", "2", True),)


def test_check_responses_we_write_read_back_in_the_runtime(ref: ModuleType) -> None:
    answer = CheckAnswer(7, "denied", 403, options((("x-ext-authz-check-result", "denied"),)), DENY_BODY)
    message = ref.CheckResponse.FromString(encode_check_response(answer))
    assert (message.status.code, message.denied_response.status.code, message.denied_response.body) == (
        7,
        403,
        DENY_BODY,
    )
    assert decode_check_response(encode_check_response(answer)) == answer


_text = st.text(max_size=12)
_option = st.builds(HeaderOption, _text, _text, st.none() | st.booleans(), st.integers(-(2**31), 2**31 - 1))
_headers = st.lists(_option, max_size=4).map(tuple)


@given(
    st.builds(
        CheckAnswer,
        st.integers(0, 16),
        _text,
        st.integers(0, 599),
        _headers,
        _text,
        _headers,
        st.lists(_text, max_size=3).map(tuple),
        _headers,
    )
)
@settings(max_examples=200, deadline=None)
def test_answers_round_trip(answer: CheckAnswer) -> None:
    back = decode_check_response(encode_check_response(answer))
    if answer.code == 0:  # an OK answer carries no denied_response, a denial no ok_response
        assert (back.ok_headers, back.ok_headers_to_remove, back.ok_response_headers) == (
            answer.ok_headers,
            answer.ok_headers_to_remove,
            answer.ok_response_headers,
        )
    else:
        assert (back.denied_status, back.denied_headers, back.denied_body) == (
            answer.denied_status,
            answer.denied_headers,
            answer.denied_body,
        )
    assert (back.code, back.message) == (answer.code, answer.message)


@given(st.binary(max_size=300))
@settings(max_examples=500, deadline=None)
def test_any_bytes_decode_or_raise_the_wire_error(data: bytes) -> None:
    for decode in (decode_check_response, decode_check_request):
        with contextlib.suppress(ExtAuthzWireError):
            decode(data)


def test_too_many_headers_are_refused() -> None:
    answer = CheckAnswer(0, ok_headers=options(tuple((f"h{i}", "v") for i in range(MAX_HEADERS + 1))))
    with pytest.raises(ExtAuthzWireError, match="more than"):
        decode_check_response(encode_check_response(answer))


# --- the gRPC verdicts ----------------------------------------------------------------------------------------------

GRPC = ExtAuthzProvider("g", ProviderKind.GRPC, "authz", 9000)


def test_an_ok_answer_sets_removes_and_adds_headers_but_never_pseudo_headers_or_host() -> None:
    answer = CheckAnswer(
        0,
        ok_headers=options((("X-User", "alice"), (":path", "/evil"), ("host", "evil"))),
        ok_headers_to_remove=("Authorization", ":authority"),
        ok_response_headers=options((("set-cookie", "s=1"),)),
    )
    assert judge_grpc_answer(GRPC, answer) == CheckAllowed(
        (RequestEdit("x-user", "alice"),), (HeaderOp(HeaderAction.APPEND, "set-cookie", "s=1"),), ("authorization",)
    )


def test_a_denial_uses_its_status_or_403() -> None:
    denied = judge_grpc_answer(
        GRPC, CheckAnswer(7, denied_status=401, denied_body="x", denied_headers=options((("a", "b"),)))
    )
    assert isinstance(denied, CheckDenied) and (denied.status, denied.body, denied.headers) == (
        401,
        b"x",
        (("a", "b"),),
    )
    bare = judge_grpc_answer(GRPC, CheckAnswer(16))
    assert isinstance(bare, CheckDenied) and (bare.status, bare.body, bare.flags) == (403, b"", "UAEX")


def test_the_attributes_carry_the_pseudo_headers_and_the_peers() -> None:
    head = RequestHead("POST", "/p", "h:80", (("content-length", "5"), ("x-request-id", "id")))
    attributes = check_attributes(head, "HTTP/2", (("10.0.0.1", 5, "spiffe://a"), ("10.0.0.2", 80, "spiffe://b")))
    assert attributes.headers[:3] == ((":authority", "h:80"), (":method", "POST"), (":path", "/p"))
    spoofed = RequestHead("POST", "/p", "h:80", (("x-envoy-auth-partial-body", "false"),))
    cut = check_attributes(spoofed, "HTTP/1.1", (("", 0, ""), ("", 0, "")), b"ab", partial=True)
    assert [v for n, v in cut.headers if n == "x-envoy-auth-partial-body"] == ["true"]  # ours, not the client's
    assert (attributes.size, attributes.request_id, attributes.protocol) == (5, "id", "HTTP/2")
    assert (attributes.source_principal, attributes.destination_port) == ("spiffe://a", 80)


# --- the lab's sample authorizer ------------------------------------------------------------------------------------


def test_the_sample_allows_on_its_header_or_its_service_account() -> None:
    assert decide({"x-ext-authz": "allow"})
    assert not decide({"x-ext-authz": "deny"}, "spiffe://td/ns/foo/sa/a", "a")  # the header decides when present
    assert decide({}, "spiffe://td/ns/foo/sa/a", "a")
    assert not decide({}, "spiffe://td/ns/foo/sa/b", "a")
    status, headers, body = http_answer("GET", "httpbin:8000", "/headers", {"x-ext-authz": "deny"})
    assert (status, body.decode()) == (403, DENY_BODY)
    assert ("x-ext-authz-check-result", "denied") in headers
    status, headers, body = http_answer("GET", "httpbin:8000", "/headers", {"x-ext-authz": "allow"})
    assert (status, body) == (200, b"") and ("x-ext-authz-check-received", "GET httpbin:8000/headers") in headers


def test_the_samples_grpc_answers() -> None:
    allowed = decode_check_response(grpc_answer(encode_check_request(ATTRIBUTES)))
    assert allowed.code == 0 and HeaderOption("x-ext-authz-check-result", "allowed") in allowed.ok_headers
    by_account = CheckAttributes("GET", "/", "h", (), source_principal="spiffe://td/ns/foo/sa/a")
    assert decode_check_response(grpc_answer(encode_check_request(by_account))).code == 0
    denied = decode_check_response(grpc_answer(encode_check_request(by_account), allowed_account="b"))
    assert (denied.code, denied.denied_status, denied.denied_body) == (7, 403, DENY_BODY)


def test_the_lab_runs_the_app() -> None:
    """``python3 -m ambit.lab.apps ext-authz`` is wired to the app (its help names the ports)."""
    out = subprocess.run(
        [sys.executable, "-m", "ambit.lab.apps", "ext-authz", "--help"], capture_output=True, text=True, check=True
    )
    assert "--http" in out.stdout and "--grpc" in out.stdout


@pytest.mark.parametrize(
    "answer",
    [
        CheckAnswer(0, ok_headers=options((("x-a", "1\r\nx-b: 2"),))),
        CheckAnswer(0, ok_response_headers=options((("bad name", "1"),))),
        CheckAnswer(7, denied_headers=options((("x-a", "\x00"),))),
    ],
)
def test_an_answer_header_that_could_split_a_head_is_an_error(answer: CheckAnswer) -> None:
    verdict = judge_grpc_answer(GRPC, answer)
    assert isinstance(verdict, CheckDenied) and verdict.status == 403 and "invalid header" in verdict.reason


def test_the_body_goes_in_body_or_raw_body(ref: ModuleType) -> None:
    text = CheckAttributes("POST", "/", "h", (), body=b"hello")
    assert ref.CheckRequest.FromString(encode_check_request(text)).attributes.request.http.body == "hello"
    raw = CheckAttributes("POST", "/", "h", (), body=b"\xff\x00", raw_body=True)
    http = ref.CheckRequest.FromString(encode_check_request(raw)).attributes.request.http
    assert (http.raw_body, http.body) == (b"\xff\x00", "")
    assert decode_check_request(encode_check_request(raw)) == raw


def test_a_connections_check_has_the_peers_and_no_request(ref: ModuleType) -> None:
    attributes = CheckAttributes(
        "", "", "", (), scheme="", protocol="", size=0, source_principal="spiffe://td/ns/a/sa/b", http=False
    )
    message = ref.CheckRequest.FromString(encode_check_request(attributes))
    assert not message.attributes.HasField("request") and message.attributes.source.principal.endswith("/sa/b")
    assert decode_check_request(encode_check_request(attributes)) == attributes

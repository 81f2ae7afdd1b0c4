"""API server input limits that held up in issue 14's review, kept so: deeply nested bodies and request smuggling,
replayed against ``ambit apiserver`` run as a subprocess (its RSS read from ``/proc``), over raw TLS where the
attack is below HTTP.

Stated bounds:

- a JSON or YAML body (or patch) nested 100,000 levels deep is answered 400 BadRequest, with the decoder's reason, in
  under 2 s each, and the server grows by less than 32 MiB over all of them and answers others afterwards;
- an object nests at most :data:`~ambit.apiserver.nesting.MAX_DEPTH` levels: one at the bound is created, patched
  and deleted like any other, one level more is 400, whether it comes as JSON, as YAML or from a JSON patch whose
  path nests a shallow value deeper (before the bound, a body a few hundred levels deep was stored and then every
  patch and deletion of it was a 500, and a YAML body of ~990 levels was a 500);
- a request that could be read two ways (Content-Length with Transfer-Encoding, two Content-Lengths, a folded
  header, a bare LF as line end, an unknown transfer coding) is answered 400 and the connection is closed: nothing
  after it on the connection is read as a request, so a request hidden in its body, and one pipelined after it, get
  no answer and change nothing.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest
from tests.harness import ServerProcess, free_port, process_rss
from tests.integration.apiserver_client import (
    CRDS,
    WIDGETS,
    ApiClient,
    Reply,
    assert_status,
    ssl_context_from_kubeconfig,
    widget_crd,
)

from ambit.apiserver.nesting import MAX_DEPTH

MiB = 1024 * 1024
CMS = "/api/v1/namespaces/default/configmaps"
DEEP = 100_000
YAML = "application/yaml"
JSON = "application/json"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path_factory.mktemp("input"), free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def api(server: ServerProcess) -> AsyncIterator[ApiClient]:
    token = (server.data_dir / "admin.token").read_text().strip()
    url = f"https://127.0.0.1:{server.port}"
    async with ApiClient(url, ssl_context_from_kubeconfig(server.kubeconfig), token) as client:
        if (await client.request("GET", WIDGETS)).status != 200:
            reply = await client.post(CRDS, widget_crd())
            assert reply.status in (201, 409), reply.body
            async with asyncio.timeout(10):  # the CRD is served once established
                while (await client.request("GET", WIDGETS)).status != 200:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
        yield client


def rss(server: ServerProcess) -> int:
    assert server.proc is not None
    return process_rss(server.proc.pid)


# --- nesting ------------------------------------------------------------------------------------------------------


def nest(levels: int) -> str:
    """JSON mappings nested ``levels`` deep around a scalar."""
    return '{"a":' * levels + "1" + "}" * levels


def widget_json(name: str, spec_levels: int) -> bytes:
    """A Widget whose spec nests ``spec_levels`` mappings: the object nests ``spec_levels + 1`` levels."""
    head = '{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"%s","namespace":"default"},"spec":'
    return (head % name + nest(spec_levels) + "}").encode()


def widget_yaml(name: str, spec_levels: int) -> bytes:
    """The same as block YAML for the envelope and flow YAML for the spec."""
    head = f"apiVersion: example.com/v1\nkind: Widget\nmetadata: {{name: {name}, namespace: default}}\nspec: "
    return (head + "{a: " * spec_levels + "1" + "}" * spec_levels + "\n").encode()


@dataclass(frozen=True)
class DeepBody:
    id: str
    method: str
    path: str
    content_type: str
    data: bytes
    message: str


DEEP_BODIES = [
    DeepBody("json-object", "POST", CMS, JSON, ("{" + '"a":{' * DEEP + "}" * DEEP + "}").encode(), "JSON"),
    DeepBody("json-array", "POST", CMS, JSON, b"[" * DEEP + b"]" * DEEP, "JSON"),
    DeepBody("yaml-flow", "POST", CMS, YAML, b"{a: " * DEEP + b"1" + b"}" * DEEP, "maximum nesting depth"),
    DeepBody("yaml-flow-sequence", "POST", CMS, YAML, b"[" * DEEP + b"]" * DEEP, "maximum nesting depth"),
    # Block YAML costs a line per level (quadratic in bytes), so 2,000 levels fill 2 MiB of the 3 MiB body limit.
    DeepBody(
        "yaml-block",
        "POST",
        CMS,
        YAML,
        "\n".join(" " * i + "a:" for i in range(2000)).encode() + b" 1\n",
        "maximum nesting depth",
    ),
    DeepBody(
        "merge-patch",
        "PATCH",
        f"{CMS}/target",
        "application/merge-patch+json",
        nest(DEEP).encode(),
        "the patch is not valid JSON",
    ),
    DeepBody(
        "json-patch",
        "PATCH",
        f"{CMS}/target",
        "application/json-patch+json",
        f'[{{"op":"add","path":"/data/x","value":{nest(DEEP)}}}]'.encode(),
        "the patch is not valid JSON",
    ),
    DeepBody("delete-options", "DELETE", f"{CMS}/target", JSON, nest(DEEP).encode(), "JSON"),
]


async def test_bodies_nested_a_hundred_thousand_levels_are_400_at_once_within_the_memory_bound(
    server: ServerProcess, api: ApiClient
) -> None:
    target = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "target"}, "data": {"k": "v"}}
    assert (await api.post(CMS, target)).status in (201, 409)
    before = rss(server)
    for case in DEEP_BODIES:
        start = time.monotonic()
        reply = await api.request(case.method, case.path, data=case.data, content_type=case.content_type)
        took = time.monotonic() - start
        status = assert_status(reply, 400, "BadRequest")
        assert case.message in status["message"], (case.id, status["message"])
        assert took < 2.0, f"{case.id}: answered in {took:.2f} s"
    growth = rss(server) - before
    assert growth < 32 * MiB, f"the server grew by {growth / MiB:.0f} MiB"
    reply = await api.request("GET", f"{CMS}/target")  # still up, and the target unchanged
    assert reply.status == 200 and reply.body["data"] == {"k": "v"}, reply.body
    names = {item["metadata"]["name"] for item in (await api.request("GET", CMS)).body["items"]}
    assert names <= {"target", "kube-root-ca.crt"}, names


@pytest.mark.parametrize("encoding", ["json", "yaml"])
async def test_an_object_at_the_depth_bound_lives_a_full_life_and_one_level_more_is_400(
    api: ApiClient, encoding: str
) -> None:
    make, content_type = (widget_json, JSON) if encoding == "json" else (widget_yaml, YAML)
    name = f"at-the-bound-{encoding}"
    reply = await api.request("POST", WIDGETS, data=make(name, MAX_DEPTH - 1), content_type=content_type)
    assert reply.status == 201, reply.body
    reply = await api.request(
        "PATCH", f"{WIDGETS}/{name}", {"metadata": {"labels": {"patched": "yes"}}}, content_type=MERGE
    )
    assert reply.status == 200, reply.body
    add_label = [{"op": "add", "path": "/metadata/labels/again", "value": "yes"}]
    reply = await api.request("PATCH", f"{WIDGETS}/{name}", add_label, content_type=JSON_PATCH)
    assert reply.status == 200, reply.body
    assert (await api.request("DELETE", f"{WIDGETS}/{name}")).status == 200
    assert (await api.request("GET", f"{WIDGETS}/{name}")).status == 404

    for levels in (MAX_DEPTH, 500, 990):  # one level over; where patches failed; where YAML bodies failed
        reply = await api.request("POST", WIDGETS, data=make(f"over-{levels}", levels), content_type=content_type)
        status = assert_status(reply, 400, "BadRequest")
        if encoding == "yaml" or levels < 900:  # msgspec refuses the deepest JSON with its own message first
            assert status["message"] == f"the request body is nested more than {MAX_DEPTH} levels deep", status
        assert (await api.request("GET", f"{WIDGETS}/over-{levels}")).status == 404


async def test_a_json_patch_cannot_nest_a_shallow_value_deeper_than_the_bound(api: ApiClient) -> None:
    """The JSON patch is 152 levels deep, its path 100 more: the object would nest 251 levels. (A merge patch nests
    the object no deeper than itself, so its own bound suffices.)"""
    name = "patched-deeper"
    reply = await api.request("POST", WIDGETS, data=widget_json(name, 100), content_type=JSON)
    assert reply.status == 201, reply.body
    path = "/spec" + "/a" * 99  # the innermost mapping of the spec
    value = json.loads(nest(150))
    reply = await api.request(
        "PATCH", f"{WIDGETS}/{name}", [{"op": "add", "path": f"{path}/b", "value": value}], content_type=JSON_PATCH
    )
    status = assert_status(reply, 400, "BadRequest")
    assert status["message"] == f"the patched object is nested more than {MAX_DEPTH} levels deep", status
    reply = await api.request("PATCH", f"{WIDGETS}/{name}", {"spec": json.loads(nest(MAX_DEPTH))}, content_type=MERGE)
    status = assert_status(reply, 400, "BadRequest")
    assert status["message"] == f"the patch is nested more than {MAX_DEPTH} levels deep", status
    stored = await api.request("GET", f"{WIDGETS}/{name}")
    assert stored.status == 200 and "b" not in json.dumps(stored.body["spec"]), "the deeper patch was stored"
    assert (await api.request("DELETE", f"{WIDGETS}/{name}")).status == 200


# --- smuggling ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


def parse_responses(data: bytes) -> tuple[list[Response], bytes]:
    """The complete HTTP/1.x responses at the start of ``data`` (Content-Length framed) and what follows them."""
    responses: list[Response] = []
    while (end := data.find(b"\r\n\r\n")) >= 0:
        head, rest = data[:end].decode("latin-1").split("\r\n"), data[end + 4 :]
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:])}
        length = int(headers.get("content-length", "0"))
        if len(rest) < length:
            break
        responses.append(Response(int(head[0].split()[1]), headers, rest[:length]))
        data = rest[length:]
    return responses, data


async def exchange(server: ServerProcess, data: bytes) -> tuple[bytes, bool]:
    """Write ``data`` on one TLS connection and read until the server closes it (5 s at most): (bytes, closed)."""
    context = ssl_context_from_kubeconfig(server.kubeconfig)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=context)
    writer.write(data)
    received, closed = b"", False
    try:
        async with asyncio.timeout(5):
            while chunk := await reader.read(65536):
                received += chunk
            closed = True
    except (ConnectionError, ssl.SSLError):
        closed = True
    except TimeoutError:
        pass
    finally:
        writer.transport.abort()
    return received, closed


SMUGGLED_NAME = "smuggled"


@pytest.fixture
def requests(server: ServerProcess) -> dict[str, bytes]:
    token = (server.data_dir / "admin.token").read_text().strip()
    auth = f"Host: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n".encode()
    configmap = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": SMUGGLED_NAME}}).encode()
    smuggled = (
        f"POST {CMS} HTTP/1.1\r\n".encode()
        + auth
        + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(configmap)
        + configmap
    )
    return {
        "front": f"POST {CMS} HTTP/1.1\r\n".encode() + auth + b"Content-Type: application/json\r\n",
        "smuggled": smuggled,
        "chunked": b"0\r\n\r\n" + smuggled,
        "next": b"GET /version HTTP/1.1\r\n" + auth + b"\r\n",
    }


def _attack(r: dict[str, bytes], case: str) -> bytes:
    front, smuggled, chunked = r["front"], r["smuggled"], r["chunked"]
    attacks = {
        "content-length-and-transfer-encoding": front
        + b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n" % len(chunked)
        + chunked,
        "transfer-encoding-and-content-length": front
        + b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n"
        + chunked,
        "two-content-lengths": front + b"Content-Length: 0\r\nContent-Length: %d\r\n\r\n" % len(smuggled) + smuggled,
        "two-equal-content-lengths": front + b"Content-Length: 0\r\nContent-Length: 0\r\n\r\n" + smuggled,
        "content-length-list": front + b"Content-Length: 0, %d\r\n\r\n" % len(smuggled) + smuggled,
        "obs-fold-transfer-encoding": front
        + b"Content-Length: %d\r\nTransfer-Encoding:\r\n chunked\r\n\r\n" % len(chunked)
        + chunked,
        "obs-fold-other-header": front + b"X-Folded: a\r\n b\r\nContent-Length: 0\r\n\r\n" + smuggled,
        "bare-lf-everywhere": front.replace(b"\r\n", b"\n") + b"Content-Length: 0\n\n" + smuggled,
        "bare-lf-one-header": front + b"Content-Length: 0\nX-After: y\r\n\r\n" + smuggled,
        "bare-lf-chunk-size": front + b"Transfer-Encoding: chunked\r\n\r\n2\nxx\r\n0\r\n\r\n" + smuggled,
        "unknown-transfer-coding": front
        + b"Transfer-Encoding: xchunked\r\nContent-Length: %d\r\n\r\n" % len(chunked)
        + chunked,
        "chunked-not-last": front + b"Transfer-Encoding: chunked, identity\r\n\r\n" + chunked,
        "space-before-colon": front
        + b"Transfer-Encoding : chunked\r\nContent-Length: %d\r\n\r\n" % len(chunked)
        + chunked,
    }
    return attacks[case]


SMUGGLING = [
    "content-length-and-transfer-encoding",
    "transfer-encoding-and-content-length",
    "two-content-lengths",
    "two-equal-content-lengths",
    "content-length-list",
    "obs-fold-transfer-encoding",
    "obs-fold-other-header",
    "bare-lf-everywhere",
    "bare-lf-one-header",
    "bare-lf-chunk-size",
    "unknown-transfer-coding",
    "chunked-not-last",
    "space-before-colon",
]


async def test_a_well_framed_pipeline_is_answered_request_by_request(
    server: ServerProcess, api: ApiClient, requests: dict[str, bytes]
) -> None:
    """The control: the same raw client, with the same requests framed once and unambiguously, gets both answered."""
    body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "pipelined"}}).encode()
    framed = requests["front"] + b"Content-Length: %d\r\n\r\n" % len(body) + body
    received, _ = await exchange(server, framed + requests["next"] + requests["next"].replace(b"GET", b"GET", 1))
    responses, _ = parse_responses(received)
    assert [r.status for r in responses] == [201, 200, 200], received[:2000]
    assert (await api.request("DELETE", f"{CMS}/pipelined")).status == 200


@pytest.mark.parametrize("case", SMUGGLING)
async def test_an_ambiguous_request_is_400_and_nothing_after_it_on_the_connection_is_read(
    server: ServerProcess, api: ApiClient, requests: dict[str, bytes], case: str
) -> None:
    received, closed = await exchange(server, _attack(requests, case) + requests["next"])
    responses, rest = parse_responses(received)
    assert [r.status for r in responses] == [400], received[:2000]
    assert rest == b"", f"bytes after the 400: {rest[:200]!r}"
    assert closed, "the server kept the connection open after a request it could not frame"
    assert responses[0].headers.get("connection", "close").lower() == "close" or closed
    reply: Reply = await api.request("GET", f"{CMS}/{SMUGGLED_NAME}")
    assert reply.status == 404, "the smuggled request was executed"
    assert (await api.request("GET", "/version")).status == 200


async def test_a_malformed_request_never_puts_its_bearer_token_in_the_log(server: ServerProcess) -> None:
    """aiohttp's parser error quotes the offending line: here the Authorization header itself (bare LF). The log
    gets one line naming the peer and the error, never the token (apiserver/request_log.py)."""
    token = (server.data_dir / "admin.token").read_text().strip()
    attack = f"GET /version HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\n\r\n".encode()
    received, closed = await exchange(server, attack)
    assert received.startswith(b"HTTP/1.") and b" 400 " in received.split(b"\r\n", 1)[0] and closed
    log = server.data_dir / "apiserver.log"
    async with asyncio.timeout(5):
        while "refused a malformed request" not in log.read_text():  # noqa: ASYNC110 (a file, no event to wait on)
            await asyncio.sleep(0.05)
    text = log.read_text()
    assert token not in text and "Traceback" not in text

"""API server availability (issue 14): attacks that cost the server memory or time, replayed against ``ambit
apiserver`` run as a subprocess, whose RSS is measured from ``/proc``.

Stated bounds (measured on the suite's 2-core runner, with margin):

- a 442-byte YAML alias bomb is answered 400 in under 2 s and the server grows by less than 32 MiB;
- a JSON patch of a few hundred bytes that doubles the object 30 times is answered 422 (kube's copy limit) and the
  server grows by less than 64 MiB; an object over 1.5 MiB is refused as kube refuses it (500, no reason,
  ``etcdserver: request is too large``) on create, update, patch and status writes;
- 200 watches whose clients never read, fed 200 writes of 64 KiB, keep the server under 400 MiB of growth, are all
  closed within the send timeout (2 s here, 10 s by default) plus 20 s, and the server answers others meanwhile;
- a user holds at most 100 watches (429 TooManyRequests, Retry-After) and makes at most its burst of requests at
  once (429 with Retry-After); the admin (system:masters) is exempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from tests.harness import ServerProcess, free_port
from tests.integration.apiserver_client import (
    CRDS,
    WIDGETS,
    ApiClient,
    assert_status,
    ssl_context_from_kubeconfig,
    widget,
    widget_crd,
)

MiB = 1024 * 1024
CMS = "/api/v1/namespaces/default/configmaps"
SAS = "/api/v1/namespaces/default/serviceaccounts"

BOMB = (
    b'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    b"b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
    b"c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
    b"d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
    b"e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
    b"f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
    b"g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n"
    b"h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]\n"
    b"i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]\n"
    b"kind: ConfigMap\napiVersion: v1\nmetadata: {name: lol}\n"
)


def rss(server: ServerProcess) -> int:
    assert server.proc is not None
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def open_sockets(server: ServerProcess) -> int:
    assert server.proc is not None
    fds = Path(f"/proc/{server.proc.pid}/fd")
    count = 0
    for fd in fds.iterdir():
        with contextlib.suppress(OSError):
            count += os.readlink(fd).startswith("socket:")
    return count


def start(tmp: Path, *args: str) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp, free_port(), extra_args=args)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from start(tmp_path_factory.mktemp("availability"), "--watch-send-timeout", "2")


@pytest.fixture(scope="module")
def throttled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from start(tmp_path_factory.mktemp("throttled"), "--user-qps", "5", "--user-burst", "10")


def client(server: ServerProcess, token: str | None = None) -> ApiClient:
    admin = (server.data_dir / "admin.token").read_text().strip()
    return ApiClient(f"https://127.0.0.1:{server.port}", ssl_context_from_kubeconfig(server.kubeconfig), token or admin)


async def service_account_token(api: ApiClient, name: str) -> str:
    """A token of service account ``name``, which may read and write in ``default`` (``edit``, bound by the admin):
    these attacks are on availability, by users who are allowed what they do."""
    reply = await api.post(SAS, {"metadata": {"name": name}})
    assert reply.status in (201, 409), reply.body
    binding = {
        "metadata": {"name": f"{name}-edit"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "default"}],
    }
    reply = await api.post("/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings", binding)
    assert reply.status in (201, 409), reply.body
    reply = await api.post(f"{SAS}/{name}/token", {"spec": {}})
    assert reply.status == 201, reply.body
    token: str = reply.body["status"]["token"]
    return token


@functools.cache
def trusting(kubeconfig: Path) -> ssl.SSLContext:
    """The client context of a server, built once: the watch tests open hundreds of connections."""
    return ssl_context_from_kubeconfig(kubeconfig)


def stalled_watch(server: ServerProcess, token: str, path: str) -> tuple[ssl.SSLSocket, int]:
    """A watch whose client never reads past the status line (receive buffer 4 KiB); (socket, HTTP status)."""
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.settimeout(10)
    owned: socket.socket = raw  # the caller's only once this returns
    try:
        raw.connect(("127.0.0.1", server.port))
        tls = owned = trusting(server.kubeconfig).wrap_socket(raw, server_hostname="127.0.0.1")
        request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\r\n"
        tls.sendall(request.encode())
        head = b""
        while b"\r\n" not in head:
            chunk = tls.recv(1)
            assert chunk, "closed before the status line"
            head += chunk
    except BaseException:
        owned.close()  # wrap_socket detaches ``raw``: the TLS socket holds the descriptor after it
        raise
    return tls, int(head.split()[1])


# ------------------------------------------------------------------------------------------------ YAML aliases


async def test_yaml_alias_bomb_is_refused_at_once_within_the_memory_bound(server: ServerProcess) -> None:
    assert len(BOMB) <= 442 + 60
    before = rss(server)
    async with client(server) as api:
        started = time.monotonic()
        reply = await api.request("POST", CMS, data=BOMB, content_type="application/yaml")
        elapsed = time.monotonic() - started
        assert_status(reply, 400, "BadRequest", "YAML aliases are not allowed (line 2, column 8)")
        assert elapsed < 2.0
        assert (await api.get(f"{CMS}/lol")).status == 404
        ok = await api.request(
            "POST", CMS, data=b"metadata: {name: plain}\ndata: {a: b}\n", content_type="application/yaml"
        )
        assert ok.status == 201, ok.body  # YAML without aliases still works
    assert rss(server) - before < 32 * MiB


# ------------------------------------------------------------------------------------------------ object size


async def test_a_small_json_patch_that_doubles_the_object_is_refused_by_the_copy_limit(server: ServerProcess) -> None:
    async with client(server) as api:
        created = await api.create(CMS, {"metadata": {"name": "doubled"}, "data": {"x": "y" * 1000}})
        ops = [{"op": "add", "path": "/metadata/annotations", "value": {}}]
        ops += [{"op": "copy", "from": "/metadata", "path": f"/metadata/m{i}"} for i in range(30)]
        body = aiohttp_json(ops)
        assert len(body) < 2048
        before = rss(server)
        reply = await api.request("PATCH", f"{CMS}/doubled", data=body, content_type="application/json-patch+json")
        assert_status(reply, 422, None, "Unable to complete the copy, the accumulated size increase of copy is")
        assert "exceeding the limit 3145728" in reply.body["message"]
        assert rss(server) - before < 64 * MiB
        assert (await api.must_get(f"{CMS}/doubled"))["metadata"]["resourceVersion"] == created["metadata"][
            "resourceVersion"
        ]
        too_many = [{"op": "test", "path": "/kind", "value": "ConfigMap"}] * 10_001
        reply = await api.request(
            "PATCH", f"{CMS}/doubled", data=aiohttp_json(too_many), content_type="application/json-patch+json"
        )
        assert_status(
            reply,
            413,
            "RequestEntityTooLarge",
            "Request entity too large: The allowed maximum operations in a JSON patch is 10000, got 10001",
        )


def aiohttp_json(value: Any) -> bytes:
    import msgspec

    return msgspec.json.encode(value)


def assert_etcd_too_large(reply: Any) -> None:
    """kube-apiserver passes etcd's error through: 500, no reason, etcd's words."""
    assert reply.status == 500, reply.body
    assert reply.body["message"] == "etcdserver: request is too large"
    assert "reason" not in reply.body


async def test_an_object_over_one_and_a_half_mib_is_not_stored_by_any_verb(server: ServerProcess) -> None:
    big = "z" * (1536 * 1024)
    async with client(server) as api:
        if (await api.get(f"{CRDS}/widgets.example.com")).status == 404:
            await api.create(CRDS, widget_crd())
        deadline = time.monotonic() + 10
        while (await api.get(WIDGETS)).status != 200:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        # create: a body under the 3 MiB request limit whose object is over the 1.5 MiB storage limit
        reply = await api.post(WIDGETS, dict(widget("huge"), spec={"blob": big}))
        assert_etcd_too_large(reply)
        assert (await api.get(f"{WIDGETS}/huge")).status == 404
        created = await api.create(WIDGETS, widget("grows"))
        path = f"{WIDGETS}/grows"
        # patch: a JSON patch inside the copy limit that quadruples 400 KiB into a 1.6 MiB object
        ops: list[dict[str, Any]] = [{"op": "add", "path": "/spec/k", "value": "q" * (400 * 1024)}]
        ops += [{"op": "copy", "from": "/spec/k", "path": f"/spec/k{i}"} for i in range(3)]
        reply = await api.request("PATCH", path, data=aiohttp_json(ops), content_type="application/json-patch+json")
        assert_etcd_too_large(reply)
        assert_etcd_too_large(await api.patch(path, {"spec": {"blob": big}}))
        # update and status
        assert_etcd_too_large(await api.put(path, dict(created, spec={"blob": big})))
        assert_etcd_too_large(await api.put(f"{path}/status", dict(created, status={"blob": big})))
        current = await api.must_get(path)
        assert current["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
        # just under the limit is stored
        assert (await api.patch(path, {"spec": {"blob": "f" * (1400 * 1024)}})).status == 200


# ------------------------------------------------------------------------------------------------ slow watchers


async def test_watches_that_never_read_are_closed_within_the_memory_bound(server: ServerProcess) -> None:
    async with client(server) as api:
        tokens = [await service_account_token(api, f"slow-{i}") for i in range(2)]
        await api.create(CMS, {"metadata": {"name": "fed"}, "data": {"v": "0"}})
        payload = "p" * (64 * 1024)
        for i in range(5):  # warm up the allocator with objects of the size that follows
            assert (await api.patch(f"{CMS}/fed", {"data": {"v": f"{i}{payload}"}})).status == 200
        sockets_before = open_sockets(server)
        before = rss(server)
        watch = f"{CMS}?watch=true&fieldSelector=metadata.name%3Dfed"
        stalled: list[ssl.SSLSocket] = []
        try:
            for i in range(200):  # 100 per user: the default per-user limit is not in the way
                sock, code = stalled_watch(server, tokens[i % 2], watch)
                stalled.append(sock)
                assert code == 200
            peak = rss(server)
            worst_answer = 0.0
            for i in range(200):
                reply = await api.patch(f"{CMS}/fed", {"data": {"v": f"w{i}{payload}"}})
                assert reply.status == 200
                if i % 20 == 0:
                    started = time.monotonic()
                    assert (await api.get("/version")).status == 200
                    worst_answer = max(worst_answer, time.monotonic() - started)
                    peak = max(peak, rss(server))
            deadline = time.monotonic() + 2 + 20
            while open_sockets(server) > sockets_before + 5 and time.monotonic() < deadline:
                peak = max(peak, rss(server))
                await asyncio.sleep(0.25)
            closed = open_sockets(server) <= sockets_before + 5
        finally:  # also when an assertion or the timeout ends the test early: no socket left to the GC
            for sock in stalled:
                sock.close()
        print(
            f"slow watchers: rss before {before / MiB:.0f} MiB, peak {peak / MiB:.0f} MiB, answer {worst_answer:.2f}s"
        )
        assert closed, f"{open_sockets(server) - sockets_before} watch connections still open"
        assert peak - before < 400 * MiB
        assert worst_answer < 5.0
        # their users' watch counts were freed: each may open watches again
        sock, code = stalled_watch(server, tokens[0], watch)
        sock.close()
        assert code == 200


async def test_a_user_holds_at_most_one_hundred_watches(server: ServerProcess) -> None:
    async with client(server) as api:
        token = await service_account_token(api, "many-watches")
        path = "/api/v1/namespaces/default/secrets?watch=true"
        held = []
        try:
            for _ in range(100):
                sock, code = stalled_watch(server, token, path)
                held.append(sock)
                assert code == 200
            async with client(server, token) as user:
                reply = await user.get("/api/v1/namespaces/default/secrets", watch="true")
            body = assert_status(reply, 429, "TooManyRequests", "too many watches: system:serviceaccount:default:")
            assert body["details"]["retryAfterSeconds"] == 1
            # the admin is exempt
            sock, code = stalled_watch(server, (server.data_dir / "admin.token").read_text().strip(), path)
            sock.close()
            assert code == 200
            # A watch whose client left frees its place once the server notices, at its next write (as kube).
            held.pop().close()
            async with client(server) as admin:
                await admin.create("/api/v1/namespaces/default/secrets", {"metadata": {"name": "nudge"}})
            deadline = time.monotonic() + 10
            while True:
                sock, code = stalled_watch(server, token, path)
                held.append(sock)
                if code == 200 or time.monotonic() > deadline:
                    break
                held.pop().close()
                await asyncio.sleep(0.1)
            assert code == 200
        finally:
            for sock in held:
                sock.close()


# ------------------------------------------------------------------------------------------------ rate limit


async def test_a_user_over_its_rate_is_answered_429_with_retry_after(throttled: ServerProcess) -> None:
    async with client(throttled) as api:
        token = await service_account_token(api, "busy")
    url = f"https://127.0.0.1:{throttled.port}/api/v1/namespaces/default/configmaps"
    context = ssl_context_from_kubeconfig(throttled.kubeconfig)
    admin = (throttled.data_dir / "admin.token").read_text().strip()

    async def burst(bearer: str) -> list[tuple[int, str | None, Any]]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:

            async def one() -> tuple[int, str | None, Any]:
                async with session.get(url, headers={"Authorization": f"Bearer {bearer}"}) as response:
                    return response.status, response.headers.get("Retry-After"), await response.json()

            return list(await asyncio.gather(*(one() for _ in range(60))))

    answers = await burst(token)
    refused = [a for a in answers if a[0] == 429]
    assert 0 < len(refused) <= 60 - 10
    assert all(a[0] in (200, 429) for a in answers)
    _status, retry, body = refused[0]
    assert retry is not None and int(retry) >= 1
    assert body["reason"] == "TooManyRequests" and body["code"] == 429
    assert body["message"] == "Too many requests, please try again later."
    assert body["details"]["retryAfterSeconds"] == int(retry)
    assert all(a[0] == 200 for a in await burst(admin))  # system:masters is exempt
    await asyncio.sleep(int(retry))
    async with client(throttled, token) as user:  # the bucket refills
        assert (await user.get("/api/v1/namespaces/default/configmaps")).status == 200

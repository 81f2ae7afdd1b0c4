"""Bad requests over HTTP: each is answered with a Kubernetes ``Status`` of the right code, and nothing is stored.

Every case runs against a server holding one ConfigMap (``existing``) and one ServiceEntry (``se``), a custom
resource; after the bad request the server still answers, and its resourceVersion has not moved, which is the
proof that no write happened at all (not even a half one).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest
import pytest_asyncio
from apiserver_client import ApiClient, Reply, assert_status, configmap, pod
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.apiserver.http_bodies import MAX_BODY
from ambit.apiserver.server import ApiServer, ApiServerSettings

CMS = "/api/v1/namespaces/default/configmaps"
PODS = "/api/v1/namespaces/default/pods"
SES = "/apis/networking.istio.io/v1/namespaces/default/serviceentries"
JSON_PATCH = "application/json-patch+json"


def service_entry(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "ServiceEntry",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"hosts": ["api.example.com"], "ports": [{"number": 443, "name": "https", "protocol": "TLS"}]},
    }


# One server for the whole module: no case may write, and each checks that it did not.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ApiServer]:
    async with ApiServer(ApiServerSettings(data_dir=tmp_path_factory.mktemp("bad-input"), port=0)) as running:
        yield running


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def api(server: ApiServer) -> AsyncIterator[ApiClient]:
    async with ApiClient.for_server(server) as client:
        await client.create(CMS, configmap("existing"))
        await client.create(SES, service_entry("se"))
        yield client


@dataclass(frozen=True)
class Case:
    id: str
    method: str
    path: str
    code: int
    reason: str
    message: str = ""
    body: Any = None
    data: bytes | None = None
    content_type: str | None = None
    params: dict[str, str] | None = None


def named(name: str) -> dict[str, Any]:
    return configmap(name)


CASES = [
    Case(
        "malformed-json",
        "POST",
        CMS,
        400,
        "BadRequest",
        "not valid JSON",
        data=b'{"metadata": {',
        content_type="application/json",
    ),
    Case(
        "json-trailing-garbage",
        "POST",
        CMS,
        400,
        "BadRequest",
        "not valid JSON",
        data=b'{"metadata": {}} x',
        content_type="application/json",
    ),
    Case(
        "malformed-yaml",
        "POST",
        CMS,
        400,
        "BadRequest",
        "not valid YAML",
        data=b"metadata: {name: [x\n",
        content_type="application/yaml",
    ),
    Case("empty-body", "POST", CMS, 400, "BadRequest", "empty", data=b"", content_type="application/json"),
    Case("non-object-list", "POST", CMS, 400, "BadRequest", "object", body=[1, 2]),
    Case("non-object-string", "POST", CMS, 400, "BadRequest", "object", body="configmap"),
    Case("non-object-null", "POST", CMS, 400, "BadRequest", "object", data=b"null", content_type="application/json"),
    Case(
        "non-object-yaml-list",
        "POST",
        CMS,
        400,
        "BadRequest",
        "object",
        data=b"- a\n- b\n",
        content_type="application/yaml",
    ),
    Case("metadata-not-object", "POST", CMS, 400, "BadRequest", "metadata", body={"metadata": ["x"]}),
    Case("unknown-resource", "POST", "/api/v1/namespaces/default/widgets", 404, "NotFound", body=named("w")),
    Case(
        "unknown-group", "POST", "/apis/nope.example.com/v1/namespaces/default/things", 404, "NotFound", body=named("w")
    ),
    Case("unknown-version", "POST", "/api/v9/namespaces/default/configmaps", 404, "NotFound", body=named("w")),
    Case(
        "unserved-crd-version",
        "POST",
        "/apis/networking.istio.io/v7/namespaces/default/serviceentries",
        404,
        "NotFound",
        body=service_entry("w"),
    ),
    Case("unknown-subresource", "PUT", f"{CMS}/existing/status", 404, "NotFound", body=named("existing")),
    Case("namespaced-kind-without-namespace-name", "GET", "/api/v1/configmaps/existing", 404, "NotFound"),
    Case("cluster-kind-under-namespace", "GET", "/api/v1/namespaces/default/nodes", 404, "NotFound"),
    Case("unknown-top-level", "GET", "/nonsense/path", 404, "NotFound"),
    Case("wrong-kind", "POST", CMS, 400, "BadRequest", "kind", body={**named("w"), "kind": "Secret"}),
    Case(
        "wrong-api-version", "POST", CMS, 400, "BadRequest", "API version", body={**named("w"), "apiVersion": "apps/v1"}
    ),
    Case(
        "wrong-crd-group",
        "POST",
        SES,
        400,
        "BadRequest",
        "API version",
        body={**service_entry("w"), "apiVersion": "security.istio.io/v1"},
    ),
    Case(
        "namespace-mismatch", "POST", CMS, 400, "BadRequest", "namespace", body=configmap("w", namespace="kube-system")
    ),
    Case(
        "namespace-mismatch-on-update",
        "PUT",
        f"{CMS}/existing",
        400,
        "BadRequest",
        "namespace",
        body=configmap("existing", namespace="kube-system"),
    ),
    Case("name-mismatch-on-update", "PUT", f"{CMS}/existing", 400, "BadRequest", "name", body=named("other")),
    Case(
        "missing-namespace",
        "POST",
        "/api/v1/namespaces/missing/configmaps",
        404,
        "NotFound",
        'namespaces "missing" not found',
        body=configmap("w", namespace="missing"),
    ),
    Case("missing-name", "POST", CMS, 422, "Invalid", "metadata.name", body={"data": {}}),
    Case(
        "resource-version-on-create",
        "POST",
        CMS,
        400,
        "BadRequest",
        "resourceVersion",
        body=configmap("w", resourceVersion="5"),
    ),
    Case(
        "already-exists",
        "POST",
        CMS,
        409,
        "AlreadyExists",
        'configmaps "existing" already exists',
        body=named("existing"),
    ),
    Case(
        "crd-already-exists",
        "POST",
        SES,
        409,
        "AlreadyExists",
        "serviceentries.networking.istio.io",
        body=service_entry("se"),
    ),
    Case("update-of-missing", "PUT", f"{CMS}/missing", 404, "NotFound", body=named("missing")),
    Case(
        "stale-resource-version",
        "PUT",
        f"{CMS}/existing",
        409,
        "Conflict",
        "has been modified",
        body=configmap("existing", resourceVersion="1"),
    ),
    Case(
        "bad-resource-version",
        "PUT",
        f"{CMS}/existing",
        409,
        "Conflict",
        body=configmap("existing", resourceVersion="nope"),
    ),
    Case("bad-label-selector", "GET", CMS, 400, "BadRequest", params={"labelSelector": "app in (a"}),
    Case("bad-label-selector-on-delete", "DELETE", CMS, 400, "BadRequest", params={"labelSelector": "=x"}),
    Case(
        "unsupported-field-selector",
        "GET",
        CMS,
        400,
        "BadRequest",
        "spec.nodeName",
        params={"fieldSelector": "spec.nodeName=n1"},
    ),
    Case("malformed-field-selector", "GET", PODS, 400, "BadRequest", params={"fieldSelector": "spec.nodeName"}),
    Case("bad-limit", "GET", CMS, 400, "BadRequest", "limit", params={"limit": "ten"}),
    Case("bad-continue", "GET", CMS, 400, "BadRequest", "continue", params={"limit": "1", "continue": "!!!"}),
    Case(
        "bad-watch-resource-version",
        "GET",
        CMS,
        400,
        "BadRequest",
        "resourceVersion",
        params={"watch": "true", "resourceVersion": "x"},
    ),
    Case(
        "bad-propagation-policy",
        "DELETE",
        f"{CMS}/existing",
        400,
        "BadRequest",
        "propagationPolicy",
        params={"propagationPolicy": "Sometimes"},
    ),
    Case(
        "bad-grace-period",
        "DELETE",
        f"{CMS}/existing",
        400,
        "BadRequest",
        "gracePeriodSeconds",
        params={"gracePeriodSeconds": "soon"},
    ),
    Case(
        "delete-uid-precondition",
        "DELETE",
        f"{CMS}/existing",
        409,
        "Conflict",
        "Precondition",
        body={"preconditions": {"uid": "not-the-uid"}},
    ),
    Case(
        "unsupported-patch-type",
        "PATCH",
        f"{CMS}/existing",
        415,
        "UnsupportedMediaType",
        data=b"{}",
        content_type="text/plain",
    ),
    Case("patch-without-type", "PATCH", f"{CMS}/existing", 415, "UnsupportedMediaType", data=b"{}", content_type=""),
    Case(
        "patch-not-json",
        "PATCH",
        f"{CMS}/existing",
        400,
        "BadRequest",
        data=b"{",
        content_type="application/merge-patch+json",
    ),
    Case(
        "merge-patch-into-non-object",
        "PATCH",
        f"{CMS}/existing",
        422,
        "Invalid",
        data=b"[1]",
        content_type="application/merge-patch+json",
    ),
    Case(
        "json-patch-failing-test",
        "PATCH",
        f"{CMS}/existing",
        422,
        "Invalid",
        "test",
        body=[
            {"op": "test", "path": "/data/key", "value": "other"},
            {"op": "replace", "path": "/data/key", "value": "x"},
        ],
        content_type=JSON_PATCH,
    ),
    Case(
        "json-patch-missing-path",
        "PATCH",
        f"{CMS}/existing",
        422,
        "Invalid",
        body=[{"op": "remove", "path": "/data/nothing"}],
        content_type=JSON_PATCH,
    ),
    Case(
        "json-patch-not-a-list",
        "PATCH",
        f"{CMS}/existing",
        400,
        "BadRequest",
        body={"op": "add"},
        content_type=JSON_PATCH,
    ),
    Case(
        "patch-renames",
        "PATCH",
        f"{CMS}/existing",
        400,
        "BadRequest",
        "name",
        body={"metadata": {"name": "other"}},
        content_type="application/merge-patch+json",
    ),
    Case(
        "patch-invalid-label",
        "PATCH",
        f"{CMS}/existing",
        422,
        "Invalid",
        "metadata.labels",
        body={"metadata": {"labels": {"bad key!": "x"}}},
        content_type="application/merge-patch+json",
    ),
    Case(
        "strategic-merge-on-crd",
        "PATCH",
        f"{SES}/se",
        415,
        "UnsupportedMediaType",
        "strategic merge patch",
        body={"spec": {"hosts": ["x"]}},
        content_type="application/strategic-merge-patch+json",
    ),
    Case(
        "server-side-apply",
        "PATCH",
        f"{CMS}/existing",
        415,
        "UnsupportedMediaType",
        "use client-side apply",
        data=b"apiVersion: v1\nkind: ConfigMap\n",
        content_type="application/apply-patch+yaml",
    ),
    Case(
        "patch-of-missing",
        "PATCH",
        f"{CMS}/missing",
        404,
        "NotFound",
        body={},
        content_type="application/merge-patch+json",
    ),
    Case("post-to-named-object", "POST", f"{CMS}/existing", 405, "MethodNotAllowed", body=named("existing")),
    Case("post-across-namespaces", "POST", "/api/v1/configmaps", 405, "MethodNotAllowed", body=named("w")),
    Case(
        "unsupported-body-type",
        "POST",
        CMS,
        415,
        "UnsupportedMediaType",
        data=b"<configmap/>",
        content_type="application/xml",
    ),
]

INVALID_NAMES = [
    ("uppercase", "Upper"),
    ("underscore", "bad_name"),
    ("space", "bad name"),
    ("leading-dash", "-lead"),
    ("trailing-dot", "trail."),
    ("too-long", "a" * 254),
    ("unicode", "caf\u00e9"),
]


def _send(api: ApiClient, case: Case) -> Any:
    return api.request(
        case.method,
        case.path,
        case.body,
        data=case.data,
        content_type=case.content_type,
        params=case.params,
    )


async def _assert_unchanged(server: ApiServer, api: ApiClient, before: int) -> None:
    assert server.manager is not None
    assert server.manager.store.resource_version == before, "a bad request wrote something"
    health = await api.request("GET", "/readyz")
    assert (health.status, health.body) == (200, "ok")
    existing = await api.must_get(f"{CMS}/existing")
    assert existing["data"] == {"key": "value"}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_bad_request_is_a_status_and_stores_nothing(server: ApiServer, api: ApiClient, case: Case) -> None:
    assert server.manager is not None
    before = server.manager.store.resource_version
    reply = await _send(api, case)
    assert_status(reply, case.code, case.reason, case.message or None)
    await _assert_unchanged(server, api, before)


@pytest.mark.parametrize(("name"), [n for _, n in INVALID_NAMES], ids=[i for i, _ in INVALID_NAMES])
async def test_invalid_name_is_422_with_a_cause_on_metadata_name(server: ApiServer, api: ApiClient, name: str) -> None:
    assert server.manager is not None
    before = server.manager.store.resource_version
    reply = await api.post(CMS, configmap(name))
    status = assert_status(reply, 422, "Invalid", "is invalid")
    causes = status["details"]["causes"]
    assert causes and all(c["field"] == "metadata.name" for c in causes), causes
    assert status["details"]["kind"] == "ConfigMap"
    await _assert_unchanged(server, api, before)


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/api/v1/namespaces", {"metadata": {"name": "n" * 64}}, "metadata.name"),
        ("/api/v1/namespaces", {"metadata": {"name": "has.dot"}}, "metadata.name"),
        (
            "/api/v1/namespaces/default/services",
            {"metadata": {"name": "1starts-with-digit"}, "spec": {"ports": [{"port": 80}]}},
            "metadata.name",
        ),
        (CMS, configmap("ok", labels={"app": "x" * 64}), "metadata.labels"),
        (CMS, configmap("ok", annotations={"/bad": "x"}), "metadata.annotations"),
        (PODS, {"metadata": {"name": "p"}, "spec": {"containers": []}}, "spec.containers"),
        (SES, {**service_entry("Bad_Name")}, "metadata.name"),
    ],
    ids=[
        "namespace-too-long",
        "namespace-with-dot",
        "service-dns1035",
        "label-value-too-long",
        "annotation-key",
        "pod-without-containers",
        "crd-object-name",
    ],
)
async def test_invalid_object_is_422_with_causes(
    server: ApiServer, api: ApiClient, path: str, body: dict[str, Any], field: str
) -> None:
    assert server.manager is not None
    before = server.manager.store.resource_version
    reply = await api.post(path, body)
    status = assert_status(reply, 422, "Invalid")
    fields = [c["field"] for c in status["details"]["causes"]]
    assert any(f.startswith(field) for f in fields), fields
    await _assert_unchanged(server, api, before)


async def test_stale_resource_version_loses_to_the_write_that_won(api: ApiClient) -> None:
    current = await api.create(CMS, configmap("contested"))
    first = await api.put(f"{CMS}/contested", current | {"data": {"key": "first"}})
    assert first.status == 200
    second = await api.put(f"{CMS}/contested", current | {"data": {"key": "second"}})
    assert_status(second, 409, "Conflict", 'configmaps "contested"')
    assert (await api.must_get(f"{CMS}/contested"))["data"] == {"key": "first"}


async def test_body_over_the_size_limit_is_413(server: ApiServer, api: ApiClient) -> None:
    assert MAX_BODY == 3 * 1024 * 1024
    assert server.manager is not None
    before = server.manager.store.resource_version
    big = configmap("big") | {"data": {"blob": "x" * MAX_BODY}}
    reply = await api.post(CMS, big)
    assert_status(reply, 413, "RequestEntityTooLarge", f"Request entity too large: limit is {MAX_BODY}")
    await _assert_unchanged(server, api, before)
    assert not await api.exists(f"{CMS}/big")
    # Just under the limit the body is read and judged: a ConfigMap's own limit is 1 MiB of data.
    fits = configmap("fits") | {"data": {"blob": "x" * (MAX_BODY - 1024)}}
    status = assert_status(await api.post(CMS, fits), 422, "Invalid", "Too long")
    assert [c["field"] for c in status["details"]["causes"]] == ["data"]
    await _assert_unchanged(server, api, before)


async def test_bad_requests_on_one_connection_do_not_break_the_next_request(api: ApiClient) -> None:
    for case in CASES[:10]:
        reply = await _send(api, case)
        assert reply.status == case.code
    assert (await api.post(CMS, named("after"))).status == 201


# -- arbitrary bodies -------------------------------------------------------------------------------------------

KEYS = st.sampled_from(
    [
        "apiVersion",
        "kind",
        "metadata",
        "name",
        "generateName",
        "namespace",
        "labels",
        "annotations",
        "finalizers",
        "ownerReferences",
        "resourceVersion",
        "uid",
        "deletionTimestamp",
        "spec",
        "status",
        "data",
        "binaryData",
        "containers",
        "image",
        "hosts",
        "ports",
        "nodeName",
        "number",
        "items",
    ]
) | st.text(max_size=8)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["", "v1", "Pod", "ConfigMap", "ServiceEntry", "default", "a", "x" * 300, "A_b"])
    | st.text(max_size=16)
)
JSON_VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=6), max_leaves=30
)
NAMES = st.sampled_from(["fuzz", "fuzz-1", "Fuzz", "", "-", "a.b", "x" * 254]) | st.text(max_size=10)
OBJECTS = st.fixed_dictionaries(
    {
        "metadata": st.fixed_dictionaries(
            {"name": NAMES}, optional={"labels": JSON_VALUES, "namespace": NAMES, "generateName": NAMES}
        )
    },
    optional={
        "apiVersion": st.sampled_from(["v1", "networking.istio.io/v1", "apps/v1"]),
        "spec": JSON_VALUES,
        "data": JSON_VALUES,
        "status": JSON_VALUES,
    },
)
TARGETS = {
    PODS: "Pod",
    CMS: "ConfigMap",
    SES: "ServiceEntry",
}


def _assert_status_or_object(reply: Reply, kind: str, success: int = 201) -> None:
    assert reply.status < 500, reply.body
    assert isinstance(reply.body, dict), reply.body
    if reply.body.get("kind") == "Status":
        assert reply.status >= 400 and reply.body["code"] == reply.status, reply.body
    else:
        assert reply.status == success, reply.body
        assert reply.body["kind"] == kind
        assert reply.body["metadata"]["uid"]


@settings(max_examples=100, deadline=None)
@given(path=st.sampled_from(sorted(TARGETS)), body=JSON_VALUES | OBJECTS)
async def test_arbitrary_json_body_is_never_a_server_error(api: ApiClient, path: str, body: Any) -> None:
    reply = await api.request("POST", path, data=msgspec.json.encode(body), content_type="application/json")
    _assert_status_or_object(reply, TARGETS[path])


@settings(max_examples=40, deadline=None)
@given(body=st.binary(max_size=64), content_type=st.sampled_from(["application/json", "application/yaml"]))
async def test_arbitrary_bytes_are_never_a_server_error(api: ApiClient, body: bytes, content_type: str) -> None:
    reply = await api.request("POST", CMS, data=body, content_type=content_type)
    _assert_status_or_object(reply, "ConfigMap")


PATCH_PATHS = st.sampled_from(
    [
        "",
        "/",
        "/metadata",
        "/metadata/name",
        "/metadata/namespace",
        "/metadata/labels",
        "/metadata/labels/a",
        "/metadata/finalizers",
        "/metadata/finalizers/0",
        "/metadata/finalizers/-",
        "/metadata/resourceVersion",
        "/metadata/uid",
        "/metadata/ownerReferences",
        "/kind",
        "/apiVersion",
        "/data",
        "/data/key",
        "/spec",
        "/spec/containers/0",
        "/spec/containers/-",
        "/spec/containers/0/image",
        "/spec/hosts/0",
        "/status",
        "/a~1b",
        "/~2",
        "/data/0",
    ]
) | st.text(max_size=8)
JSON_PATCHES = st.lists(
    st.fixed_dictionaries(
        {"op": st.sampled_from(["add", "remove", "replace", "move", "copy", "test", "bogus"]), "path": PATCH_PATHS},
        optional={"value": JSON_VALUES, "from": PATCH_PATHS},
    ),
    max_size=4,
)
PATCH_TYPES = ["application/merge-patch+json", "application/json-patch+json", "application/strategic-merge-patch+json"]
FUZZED = {f"{PODS}/fuzzed": "Pod", f"{CMS}/fuzzed": "ConfigMap", f"{SES}/fuzzed": "ServiceEntry"}


@settings(max_examples=100, deadline=None)
@given(
    path=st.sampled_from(sorted(FUZZED)),
    content_type=st.sampled_from(PATCH_TYPES),
    body=JSON_VALUES | OBJECTS | JSON_PATCHES,
)
async def test_arbitrary_patch_is_never_a_server_error(api: ApiClient, path: str, content_type: str, body: Any) -> None:
    if not await api.exists(path):
        seed = {"Pod": pod, "ConfigMap": configmap, "ServiceEntry": service_entry}[FUZZED[path]]("fuzzed")
        await api.create(path.rsplit("/", 1)[0], seed)
    reply = await api.request("PATCH", path, data=msgspec.json.encode(body), content_type=content_type)
    _assert_status_or_object(reply, FUZZED[path], success=200)


@settings(max_examples=60, deadline=None)
@given(
    labels=st.text(max_size=20) | st.sampled_from(["a in (b)", "a notin (b,c)", "!a", "a!=b", "a,b=c"]),
    fields=st.text(max_size=20),
)
async def test_arbitrary_selectors_are_never_a_server_error(api: ApiClient, labels: str, fields: str) -> None:
    for params in ({"labelSelector": labels}, {"fieldSelector": fields}):
        reply = await api.get(PODS, **params)
        assert reply.status in (200, 400), reply.body
        assert reply.body["kind"] == ("PodList" if reply.status == 200 else "Status")

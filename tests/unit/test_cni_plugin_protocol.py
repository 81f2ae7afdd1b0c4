"""The plugin's protocol handling through ``run()``, with recording stand-ins for the API and the agent."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.cni.errors import AgentError, KubeLookupError
from ambit.cni.plugin import parse_cni_args, run

PREV = {
    "cniVersion": "1.0.0",
    "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/p1"}],
    "ips": [{"interface": 0, "address": "198.18.1.5/24", "gateway": "198.18.1.1"}],
}
ENV = {
    "CNI_COMMAND": "ADD",
    "CNI_CONTAINERID": "c1",
    "CNI_NETNS": "/var/run/netns/p1",
    "CNI_IFNAME": "eth0",
    "CNI_PATH": "/opt/cni/bin",
    "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=apps;K8S_POD_NAME=web;K8S_POD_UID=u1",
}


def config(**extra: Any) -> bytes:
    doc = {"cniVersion": "1.0.0", "name": "lab", "type": "ambit-cni", "prevResult": PREV, "kubeconfig": "/kc"}
    return json.dumps({**doc, **extra}).encode()


class Recorder:
    def __init__(self, pod_labels: dict[str, str], fail: Exception | None = None) -> None:
        self.pod_labels = pod_labels
        self.fail = fail
        self.gets: list[str] = []
        self.posts: list[tuple[str, dict[str, Any]]] = []

    def kube_get(self, kubeconfig: str, path: str) -> dict[str, Any]:
        self.gets.append(path)
        if path.endswith("/pods/web"):
            return {"metadata": {"name": "web", "namespace": "apps", "labels": self.pod_labels}}
        return {"metadata": {"name": "apps"}}

    def post_event(self, socket: str, event: dict[str, Any]) -> None:
        if self.fail:
            raise self.fail
        self.posts.append((socket, event))


def invoke(rec: Recorder, env: dict[str, str] = ENV, stdin: bytes | None = None) -> tuple[dict[str, Any] | None, int]:
    out, status = run(env, config() if stdin is None else stdin, kube_get=rec.kube_get, post_event=rec.post_event)
    return (json.loads(out) if out else None), status


def test_add_of_an_ambient_pod_posts_the_event_and_echoes_prev_result() -> None:
    rec = Recorder({"istio.io/dataplane-mode": "ambient"})
    result, status = invoke(rec)
    assert (result, status) == (PREV, 0)
    assert rec.gets == ["/api/v1/namespaces/apps/pods/web", "/api/v1/namespaces/apps"]
    assert rec.posts == [
        (
            "/var/run/ambit-cni/pluginevent.sock",
            {
                "netns": "/var/run/netns/p1",
                "podName": "web",
                "podNamespace": "apps",
                "podUid": "u1",
                "ips": [{"interface": 0, "address": "198.18.1.5/24", "gateway": "198.18.1.1"}],
            },
        )
    ]


def test_add_of_a_plain_pod_posts_nothing() -> None:
    rec = Recorder({})
    assert invoke(rec) == (PREV, 0)
    assert rec.posts == []


@pytest.mark.parametrize(
    ("env_args", "stdin"),
    [
        ("IgnoreUnknown=1", config()),
        (ENV["CNI_ARGS"], config(exclude_namespaces=["apps"])),
        (ENV["CNI_ARGS"], config(ambient_enabled=False)),
    ],
)
def test_add_without_a_lookup_passes_through(env_args: str, stdin: bytes) -> None:
    rec = Recorder({"istio.io/dataplane-mode": "ambient"})
    assert invoke(rec, {**ENV, "CNI_ARGS": env_args}, stdin) == (PREV, 0)
    assert rec.gets == [] and rec.posts == []


def test_add_echoes_prev_result_in_the_configured_version() -> None:
    result, status = invoke(Recorder({}), stdin=config(cniVersion="0.4.0"))
    assert status == 0 and result == {**PREV, "cniVersion": "0.4.0"}


@pytest.mark.parametrize(
    ("fail", "code"), [(AgentError("agent down", "ECONNREFUSED"), 11), (RuntimeError("boom"), 999)]
)
def test_add_fails_when_the_agent_does(fail: Exception, code: int) -> None:
    result, status = invoke(Recorder({"istio.io/dataplane-mode": "ambient"}, fail=fail))
    assert status == 1 and result is not None
    assert result["code"] == code and result["cniVersion"] == "1.0.0" and result["msg"]


def test_add_fails_when_the_api_lookup_does() -> None:
    def kube_get(kubeconfig: str, path: str) -> dict[str, Any]:
        raise KubeLookupError("GET failed", "HTTP 404: not found")

    out, status = run(ENV, config(), kube_get=kube_get, post_event=Recorder({}).post_event)
    assert status == 1 and json.loads(out)["code"] == 11 and "404" in json.loads(out)["details"]


@pytest.mark.parametrize(
    ("env", "stdin", "code"),
    [
        ({**ENV, "CNI_COMMAND": "BOGUS"}, config(), 4),
        ({k: v for k, v in ENV.items() if k != "CNI_COMMAND"}, config(), 4),
        ({k: v for k, v in ENV.items() if k != "CNI_NETNS"}, config(), 4),
        ({**ENV, "CNI_ARGS": "K8S_POD_NAME=web;FOO=1"}, config(), 4),
        ({**ENV, "CNI_ARGS": "garbage"}, config(), 4),
        (ENV, b"{not json", 6),
        (ENV, b"[1]", 6),
        (ENV, b"\xff\xfe", 6),
        (ENV, config(cniVersion="0.2.0"), 1),
        (ENV, config(cniVersion=3), 7),
        (ENV, config(name=""), 7),
        (ENV, config(prevResult=None), 7),
        (ENV, config(exclude_namespaces="kube-system"), 7),
        (ENV, config(ambient_enabled="yes"), 7),
        ({**ENV, "CNI_COMMAND": "CHECK"}, config(cniVersion="0.3.1"), 1),
    ],
)
def test_bad_invocations_produce_cni_errors(env: dict[str, str], stdin: bytes, code: int) -> None:
    result, status = invoke(Recorder({}), env, stdin)
    assert status == 1 and result is not None and result["code"] == code


@pytest.mark.parametrize("command", ["DEL", "CHECK"])
def test_del_and_check_succeed_silently(command: str) -> None:
    rec = Recorder({"istio.io/dataplane-mode": "ambient"})
    assert invoke(rec, {**ENV, "CNI_COMMAND": command}) == (None, 0)
    assert rec.posts == []


def test_del_does_not_need_a_netns() -> None:
    env = {k: v for k, v in ENV.items() if k != "CNI_NETNS"}
    assert invoke(Recorder({}), {**env, "CNI_COMMAND": "DEL"}) == (None, 0)


def test_version_lists_supported_versions() -> None:
    result, status = invoke(Recorder({}), {"CNI_COMMAND": "VERSION"}, b"")
    assert status == 0
    assert result == {"cniVersion": "1.0.0", "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0"]}


def test_cni_args_keep_known_keys_and_honour_ignore_unknown() -> None:
    assert parse_cni_args("IgnoreUnknown=true;K8S_POD_NAME=a;X=1;;") == {"K8S_POD_NAME": "a", "X": "1"}
    assert parse_cni_args("") == {}


@given(st.binary(max_size=200), st.dictionaries(st.sampled_from(sorted(ENV)), st.text(max_size=20)))
def test_run_never_raises(stdin: bytes, env: dict[str, str]) -> None:
    out, status = run(env, stdin, kube_get=Recorder({}).kube_get, post_event=Recorder({}).post_event)
    assert status in (0, 1)
    if status:
        assert isinstance(json.loads(out)["code"], int)

"""The runtime side of CNI: configuration loading, invocation (env, stdin, order, cache), results and errors."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.commands import Call, CommandResult, RecordingRunner
from ambit.lab.cluster.record import Record
from ambit.lab.network import plugins as lab_cni
from ambit.lab.network.bridge import CONFLIST_NAME, write_node_cni_files
from ambit.lab.network.plugins import CniConfigError, CniInvocationError, NetworkConfigList
from ambit.lab.network.topology import Topology

# What the bridge plugin of containernetworking-plugins 1.1.1 printed for an ADD on this machine.
BRIDGE_RESULT = {
    "cniVersion": "1.0.0",
    "interfaces": [
        {"name": "cni0", "mac": "0e:6b:e5:ca:78:63"},
        {"name": "vethd12365bc", "mac": "aa:e6:c8:a1:32:48"},
        {"name": "eth0", "mac": "ca:67:47:9f:55:f4", "sandbox": "/run/netns/ab3484-p-1"},
    ],
    "ips": [{"interface": 2, "address": "198.18.1.2/24", "gateway": "198.18.1.1"}],
    "routes": [{"dst": "0.0.0.0/0", "gw": "198.18.1.1"}],
    "dns": {},
}
BRIDGE_ERROR = (
    b'{\n    "code": 999,\n    "msg": "failed to open netns \\"/run/netns/x\\": failed to Statfs '
    b'\\"/run/netns/x\\": no such file or directory"\n}'
)
CONFLIST = {
    "cniVersion": "1.0.0",
    "name": "ambit-lab",
    "plugins": [
        {"type": "bridge", "bridge": "cni0", "ipam": {"type": "host-local"}},
        {"type": "loopback"},
    ],
}
ARGS = {"K8S_POD_NAMESPACE": "default", "K8S_POD_NAME": "web-0", "K8S_POD_UID": "u-1"}


# -- configuration --------------------------------------------------------------------------------------------


def test_the_lexically_first_configuration_file_wins(tmp_path: Path) -> None:
    (tmp_path / "20-other.conflist").write_text(json.dumps({**CONFLIST, "name": "other"}))
    (tmp_path / "10-ambit-lab.conflist").write_text(json.dumps(CONFLIST))
    (tmp_path / "05-notes.txt").write_text("not a configuration")
    conflist = lab_cni.load_conflist(tmp_path)
    assert conflist.name == "ambit-lab"
    assert [p["type"] for p in conflist.plugins] == ["bridge", "loopback"]
    assert conflist.source == str(tmp_path / "10-ambit-lab.conflist")


def test_a_conf_file_is_a_list_of_one_plugin(tmp_path: Path) -> None:
    (tmp_path / "99-loopback.conf").write_text(json.dumps({"cniVersion": "0.4.0", "name": "lo", "type": "loopback"}))
    conflist = lab_cni.load_conflist(tmp_path)
    assert (conflist.name, conflist.cni_version, len(conflist.plugins)) == ("lo", "0.4.0", 1)
    assert conflist.plugins[0]["type"] == "loopback"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "is not JSON"),
        ("[]", "expected a JSON object"),
        (json.dumps({**CONFLIST, "name": ""}), "'name'"),
        (json.dumps({**CONFLIST, "cniVersion": "9.9.9"}), "cniVersion '9.9.9'"),
        (json.dumps({**CONFLIST, "plugins": []}), "'plugins'"),
        (json.dumps({**CONFLIST, "plugins": [{"type": "../../bin/sh"}]}), "plain file name"),
    ],
)
def test_bad_configurations_are_config_errors(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "10-x.conflist").write_text(content)
    with pytest.raises(CniConfigError, match=message) as caught:
        lab_cni.load_conflist(tmp_path)
    assert caught.value.error.code == 7


def test_an_empty_or_missing_directory_has_no_configuration(tmp_path: Path) -> None:
    with pytest.raises(CniConfigError, match="no CNI configuration"):
        lab_cni.load_conflist(tmp_path)
    with pytest.raises(CniConfigError, match="cannot read"):
        lab_cni.load_conflist(tmp_path / "missing")


def test_the_lab_conflist_chains_bridge_and_loopback_on_the_nodes_range(tmp_path: Path) -> None:
    topology = Topology("beef", 2, str(tmp_path))
    node = topology.node(2)
    write_node_cni_files(topology, node, Record(topology.record_file))
    conflist = lab_cni.load_conflist(topology.cni_conf_dir("node-2"))
    assert conflist.source.endswith(CONFLIST_NAME)
    assert (conflist.name, conflist.cni_version) == ("ambit-lab", "1.0.0")
    bridge, loopback = conflist.plugins
    assert loopback == {"type": "loopback"}
    assert (bridge["type"], bridge["bridge"], bridge["isGateway"], bridge["ipMasq"]) == ("bridge", "cni0", True, False)
    assert bridge["ipam"] == {
        "type": "host-local",
        "ranges": [[{"subnet": "198.18.2.0/24", "gateway": "198.18.2.1"}]],
        "routes": [{"dst": "0.0.0.0/0", "gw": "198.18.2.1"}],
        "dataDir": str(tmp_path / "nodes" / "node-2" / "ipam"),
    }
    assert lab_cni.find_plugin("host-local", [topology.cni_bin_dir("node-2")]).is_symlink()
    assert [e.kind for e in Record(topology.record_file).entries()] == ["dir"]


# -- invocation, pure parts -----------------------------------------------------------------------------------


def test_the_environment_carries_the_kubelet_args_after_ignore_unknown() -> None:
    env = lab_cni.plugin_env("ADD", "u-1", "/run/netns/p", "eth0", ARGS, ["/a", Path("/b")])
    assert env == {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "u-1",
        "CNI_NETNS": "/run/netns/p",
        "CNI_IFNAME": "eth0",
        "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_UID=u-1",
        "CNI_PATH": "/a:/b",
    }


@pytest.mark.parametrize(
    ("container_id", "ifname", "args"),
    [("", "eth0", {}), ("a/b", "eth0", {}), ("c", "eth0/", {}), ("c", "x" * 16, {}), ("c", "eth0", {"K": "a;b"})],
)
def test_values_the_protocol_cannot_carry_are_refused(container_id: str, ifname: str, args: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        lab_cni.plugin_env("ADD", container_id, "", ifname, args, [])


def test_the_plugin_config_gets_the_networks_name_version_and_prev_result() -> None:
    conflist = lab_cni.parse_conflist(json.dumps(CONFLIST).encode())
    plugin = {"type": "loopback", "name": "stale", "prevResult": {"old": 1}}
    sent = json.loads(lab_cni.plugin_stdin(conflist, plugin, BRIDGE_RESULT))
    assert sent == {"type": "loopback", "name": "ambit-lab", "cniVersion": "1.0.0", "prevResult": BRIDGE_RESULT}
    assert "prevResult" not in json.loads(lab_cni.plugin_stdin(conflist, plugin, None))


def test_the_bridge_result_is_parsed_with_the_pods_address() -> None:
    result = lab_cni.parse_result(json.dumps(BRIDGE_RESULT).encode(), "bridge")
    assert result.cni_version == "1.0.0"
    assert [i.name for i in result.interfaces] == ["cni0", "vethd12365bc", "eth0"]
    assert result.ips == (lab_cni.CniIp("198.18.1.2/24", "198.18.1.1", 2),)
    assert result.routes == (lab_cni.CniRoute("0.0.0.0/0", "198.18.1.1"),)
    assert result.pod_ips == ("198.18.1.2",)
    assert result.raw == BRIDGE_RESULT


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"[]",
        b'{"ips": [{"address": "198.18.1.2"}]}',
        b'{"ips": [{"address": "198.18.1.2/24", "interface": 0}]}',
        b'{"ips": [{"address": "198.18.1.2/24", "interface": true}], "interfaces": [{"name": "a"}]}',
        b'{"routes": [{"dst": "nowhere/8"}]}',
        b'{"interfaces": [{"mac": "x"}]}',
        b'{"dns": {"nameservers": "8.8.8.8"}}',
        b"\xff\xfe\x00",
    ],
)
def test_malformed_results_are_decode_errors(data: bytes) -> None:
    with pytest.raises(CniInvocationError) as caught:
        lab_cni.parse_result(data, "bridge")
    assert (caught.value.error.code, caught.value.plugin) == (6, "bridge")


def test_a_plugins_error_object_becomes_a_cni_error() -> None:
    error = lab_cni.parse_error(1, BRIDGE_ERROR, b"", "bridge", "ADD")
    assert (error.error.code, error.plugin, error.command) == (999, "bridge", "ADD")
    assert error.error.msg.startswith("failed to open netns")
    assert str(error).startswith("CNI plugin 'bridge' ADD failed: failed to open netns")
    spec = lab_cni.parse_error(1, b'{"cniVersion":"1.0.0","code":7,"msg":"bad","details":"field x"}', b"", "p")
    assert str(spec) == "CNI plugin 'p' failed: bad (code 7, invalid network config): field x"


def test_a_failure_without_an_error_object_shows_what_the_plugin_printed() -> None:
    error = lab_cni.parse_error(2, b"", b"panic: runtime error\n", "bridge", "DEL")
    assert error.error.code == 0
    assert "exited 2" in error.error.msg
    assert error.error.details == "panic: runtime error"


# -- hypothesis: the parsers never raise anything but CniInvocationError -------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
result_keys = st.sampled_from(
    ["cniVersion", "interfaces", "ips", "routes", "dns", "address", "gateway", "interface", "dst", "gw", "name"]
)
result_like = st.recursive(
    st.none() | st.integers(-2, 4) | st.sampled_from(["198.18.1.2/24", "198.18.1.1", "::1/128", "x", ""]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(result_keys, inner, max_size=5),
    max_leaves=25,
)


@given(st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()))
def test_parse_result_raises_only_cni_errors(data: bytes) -> None:
    with contextlib.suppress(CniInvocationError):
        lab_cni.parse_result(data)


@given(result_like)
def test_parse_result_of_result_shaped_json_raises_only_cni_errors(value: Any) -> None:
    try:
        result = lab_cni.parse_result(json.dumps(value).encode())
    except CniInvocationError:
        return
    assert isinstance(result.pod_ips, tuple)


@given(st.integers(-5, 300), st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()), st.binary())
def test_parse_error_always_returns_a_cni_error(returncode: int, stdout: bytes, stderr: bytes) -> None:
    error = lab_cni.parse_error(returncode, stdout, stderr, "p", "ADD")
    assert isinstance(error, CniInvocationError)
    assert str(error)


# -- invocation through the runner ----------------------------------------------------------------------------


class Plugins:
    """Answers plugin invocations: bridge returns BRIDGE_RESULT, loopback echoes its prevResult."""

    def __init__(self, fail: Mapping[tuple[str, str], bytes] | None = None) -> None:
        self.fail = dict(fail or {})
        self.seen: list[tuple[str, str, dict[str, Any], dict[str, str]]] = []

    def __call__(self, call: Call) -> CommandResult:
        kind = Path(call.argv[-1]).name
        env = dict(call.env or {})
        conf = json.loads(call.stdin or b"{}")
        self.seen.append((env["CNI_COMMAND"], kind, conf, env))
        if (env["CNI_COMMAND"], kind) in self.fail:
            return CommandResult(call.argv, 1, self.fail[env["CNI_COMMAND"], kind])
        if env["CNI_COMMAND"] != "ADD":
            return CommandResult(call.argv, 0)
        out = BRIDGE_RESULT if kind == "bridge" else conf["prevResult"]
        return CommandResult(call.argv, 0, json.dumps(out).encode())


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "bin"
    directory.mkdir()
    for name in ("bridge", "loopback"):
        (directory / name).write_text("#!/bin/sh\n")
        (directory / name).chmod(0o755)
    return directory


def conflist() -> NetworkConfigList:
    return lab_cni.parse_conflist(json.dumps(CONFLIST).encode(), "10-ambit-lab.conflist")


async def test_add_chains_the_plugins_in_order_inside_the_node_namespace(bin_dir: Path, tmp_path: Path) -> None:
    plugins = Plugins()
    runner = RecordingRunner(respond=plugins)
    cache = tmp_path / "cache"
    result = await lab_cni.add(
        conflist(), "u-1", "/run/netns/p", "eth0", ARGS, [bin_dir], runner, "ab12-node-1", cache_dir=cache
    )
    assert result.pod_ips == ("198.18.1.2",)
    assert runner.commands == [
        f"ip netns exec ab12-node-1 {bin_dir}/bridge",
        f"ip netns exec ab12-node-1 {bin_dir}/loopback",
    ]
    (_, _, bridge_conf, env), (_, _, loopback_conf, _) = plugins.seen
    assert "prevResult" not in bridge_conf
    assert loopback_conf["prevResult"] == BRIDGE_RESULT
    assert bridge_conf["name"] == loopback_conf["name"] == "ambit-lab"
    assert env["CNI_NETNS"] == "/run/netns/p"
    cached = json.loads((cache / "results" / "ambit-lab-u-1-eth0").read_text())
    assert (cached["kind"], cached["containerId"], cached["result"]) == ("cniCacheV1", "u-1", BRIDGE_RESULT)


async def test_del_runs_in_reverse_with_the_cached_result_and_drops_the_cache(bin_dir: Path, tmp_path: Path) -> None:
    plugins = Plugins()
    runner = RecordingRunner(respond=plugins)
    cache = tmp_path / "cache"
    netns = tmp_path / "netns"
    netns.touch()
    await lab_cni.add(conflist(), "u-1", str(netns), "eth0", ARGS, [bin_dir], runner, cache_dir=cache)
    plugins.seen.clear()
    await lab_cni.delete(conflist(), "u-1", str(netns), "eth0", ARGS, [bin_dir], runner, cache_dir=cache)
    assert [(command, kind) for command, kind, _, _ in plugins.seen] == [("DEL", "loopback"), ("DEL", "bridge")]
    assert all(conf["prevResult"] == BRIDGE_RESULT for _, _, conf, _ in plugins.seen)
    assert all(env["CNI_NETNS"] == str(netns) for _, _, _, env in plugins.seen)
    assert not (cache / "results" / "ambit-lab-u-1-eth0").exists()


async def test_del_of_a_gone_namespace_without_cache_still_asks_every_plugin(bin_dir: Path, tmp_path: Path) -> None:
    plugins = Plugins()
    runner = RecordingRunner(respond=plugins)
    await lab_cni.delete(
        conflist(), "u-1", "/run/netns/gone-for-good", "eth0", ARGS, [bin_dir], runner, cache_dir=tmp_path
    )
    assert [kind for _, kind, _, _ in plugins.seen] == ["loopback", "bridge"]
    assert all(env["CNI_NETNS"] == "" for _, _, _, env in plugins.seen)
    assert all("prevResult" not in conf for _, _, conf, _ in plugins.seen)


async def test_del_tries_every_plugin_and_raises_the_first_failure(bin_dir: Path, tmp_path: Path) -> None:
    plugins = Plugins(fail={("DEL", "loopback"): b'{"code": 5, "msg": "lo is stuck"}'})
    runner = RecordingRunner(respond=plugins)
    with pytest.raises(CniInvocationError, match="lo is stuck") as caught:
        await lab_cni.delete(conflist(), "u-1", "", "eth0", ARGS, [bin_dir], runner, cache_dir=tmp_path)
    assert caught.value.plugin == "loopback"
    assert [kind for _, kind, _, _ in plugins.seen] == ["loopback", "bridge"]


async def test_a_failing_plugin_stops_add_with_its_error(bin_dir: Path, tmp_path: Path) -> None:
    plugins = Plugins(fail={("ADD", "bridge"): BRIDGE_ERROR})
    runner = RecordingRunner(respond=plugins)
    with pytest.raises(CniInvocationError, match="failed to open netns") as caught:
        await lab_cni.add(conflist(), "u-1", "/x", "eth0", ARGS, [bin_dir], runner, cache_dir=tmp_path)
    assert (caught.value.error.code, caught.value.plugin, caught.value.command) == (999, "bridge", "ADD")
    assert len(runner.calls) == 1
    assert not (tmp_path / "results").exists()


async def test_a_missing_plugin_is_a_config_error(tmp_path: Path) -> None:
    runner = RecordingRunner()
    with pytest.raises(CniConfigError, match="failed to find plugin 'bridge'"):
        await lab_cni.add(conflist(), "u-1", "/x", "eth0", ARGS, [tmp_path], runner)
    assert runner.calls == []


async def test_check_needs_the_cached_result_and_passes_it_to_every_plugin(bin_dir: Path, tmp_path: Path) -> None:
    plugins = Plugins()
    runner = RecordingRunner(respond=plugins)
    with pytest.raises(CniInvocationError, match="no cached ADD result"):
        await lab_cni.check(conflist(), "u-1", "/x", "eth0", ARGS, [bin_dir], runner, cache_dir=tmp_path)
    await lab_cni.add(conflist(), "u-1", "/x", "eth0", ARGS, [bin_dir], runner, cache_dir=tmp_path)
    plugins.seen.clear()
    await lab_cni.check(conflist(), "u-1", "/x", "eth0", ARGS, [bin_dir], runner, cache_dir=tmp_path)
    assert [(command, kind) for command, kind, _, _ in plugins.seen] == [("CHECK", "bridge"), ("CHECK", "loopback")]
    assert all(conf["prevResult"] == BRIDGE_RESULT for _, _, conf, _ in plugins.seen)


async def test_a_plugin_that_hangs_is_an_error_after_the_timeout(bin_dir: Path) -> None:
    class Hanging(RecordingRunner):
        async def run_async(self, argv: Any, **kwargs: Any) -> CommandResult:
            await asyncio.sleep(10)
            raise AssertionError("not reached")

    with pytest.raises(CniInvocationError, match=r"no answer within 0\.05 s"):
        await lab_cni.add(conflist(), "u-1", "/x", "eth0", ARGS, [bin_dir], Hanging(), plugin_timeout=0.05)

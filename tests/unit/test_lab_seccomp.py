"""seccomp for lab containers (:mod:`ambit.lab.runtime.seccomp`, rule 12 of :mod:`ambit.lab.runtime.oci_spec`): which
profile applies, what ``RuntimeDefault`` allows, ``Localhost`` paths and files (hypothesis on the profile parser),
and the mesh's own manifests under it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.lab.runtime.oci_apply import read_seccomp_profile
from ambit.lab.runtime.oci_spec import (
    DEFAULT_CAPABILITIES,
    BundlePaths,
    ProcessSpec,
    SecurityContextError,
    container_config,
    container_id,
)
from ambit.lab.runtime.seccomp import (
    ACTIONS,
    MAX_PROFILE_BYTES,
    MAX_RULES,
    Machine,
    SeccompChoice,
    SeccompFieldError,
    SeccompProfileError,
    kernel_version,
    localhost_path,
    parse_profile,
    runtime_default,
    seccomp_choice,
    syscall_names,
)

REPO = Path(__file__).resolve().parents[2]
UID = "0d5c7e36-5b1e-4c61-9f0e-2f7e1a2b3c4d"
PATHS = BundlePaths(container_id(UID, "app"), "/run/netns/x", "/sa", "/ambit-x")
PROCESS = ProcessSpec(("sleep", "1"), {})
X86 = Machine("x86_64", (6, 1))
ARM = Machine("aarch64", (6, 1))

FORBIDDEN = (
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "open_by_handle_at", "bpf",
    "perf_event_open", "keyctl", "add_key", "request_key", "userfaultfd", "mount", "umount2", "setns", "unshare",
    "pivot_root", "swapon", "swapoff", "reboot", "acct", "settimeofday", "clock_settime", "iopl",
    "ioperm", "fsopen", "move_mount", "open_tree", "name_to_handle_at_", "quotactl", "lookup_dcookie", "vhangup",
    "syslog", "kcmp", "process_madvise", "pidfd_getfd", "nfsservctl", "uselib", "ustat", "sysfs", "_sysctl",
    "create_module", "get_kernel_syms", "query_module", "vm86", "vm86old", "mbind", "set_mempolicy",
)  # fmt: skip


def pod(*, pod_sc: dict[str, Any] | None = None, **container_sc: Any) -> dict[str, Any]:
    container = {"name": "app", "securityContext": container_sc} if container_sc else {"name": "app"}
    spec: dict[str, Any] = {"containers": [container]}
    if pod_sc is not None:
        spec["securityContext"] = pod_sc
    return {"metadata": {"name": "web", "namespace": "default", "uid": UID}, "spec": spec}


def config_of(p: dict[str, Any], paths: BundlePaths = PATHS) -> dict[str, Any]:
    return container_config(p, p["spec"]["containers"][0], PROCESS, paths)


def allowed_unconditionally(profile: dict[str, Any]) -> set[str]:
    return {
        name
        for rule in profile["syscalls"]
        if rule["action"] == "SCMP_ACT_ALLOW" and not rule.get("args")
        for name in rule["names"]
    }


RD = {"type": "RuntimeDefault"}
UNCONFINED = {"type": "Unconfined"}
LOCAL = {"type": "Localhost", "localhostProfile": "profiles/audit.json"}


@pytest.mark.parametrize(
    ("p", "expected"),
    [
        (pod(), SeccompChoice("RuntimeDefault")),  # the lab's --seccomp-default
        (pod(pod_sc={"seccompProfile": UNCONFINED}), SeccompChoice("Unconfined")),
        (pod(pod_sc={"seccompProfile": UNCONFINED}, seccompProfile=RD), SeccompChoice("RuntimeDefault")),
        (pod(pod_sc={"seccompProfile": RD}, seccompProfile=UNCONFINED), SeccompChoice("Unconfined")),
        (pod(pod_sc={"seccompProfile": RD}, seccompProfile=LOCAL), SeccompChoice("Localhost", "profiles/audit.json")),
        (pod(pod_sc={"seccompProfile": LOCAL}), SeccompChoice("Localhost", "profiles/audit.json")),
        (pod(pod_sc={"seccompProfile": LOCAL}, runAsUser=5), SeccompChoice("Localhost", "profiles/audit.json")),
        (pod(pod_sc={"seccompProfile": LOCAL}, privileged=True), SeccompChoice("Unconfined")),
        (pod(seccompProfile=RD, privileged=True), SeccompChoice("Unconfined")),
    ],
)
def test_the_container_s_profile_wins_over_the_pod_s_and_unset_is_runtime_default(
    p: dict[str, Any], expected: SeccompChoice
) -> None:
    container = p["spec"]["containers"][0]
    privileged = (container.get("securityContext") or {}).get("privileged") is True
    assert seccomp_choice(p, container, privileged=privileged) == expected


def test_unconfined_and_privileged_containers_get_no_filter() -> None:
    assert "seccomp" not in config_of(pod(seccompProfile=UNCONFINED))["linux"]
    assert "seccomp" not in config_of(pod(seccompProfile=RD, privileged=True))["linux"]
    assert config_of(pod())["linux"]["seccomp"]["defaultAction"] == "SCMP_ACT_ERRNO"


def test_runtime_default_is_an_allow_list_that_fails_with_eperm() -> None:
    profile = config_of(pod())["linux"]["seccomp"]
    assert (profile["defaultAction"], profile["defaultErrnoRet"]) == ("SCMP_ACT_ERRNO", 1)
    assert profile["architectures"][0] == "SCMP_ARCH_X86_64"
    allowed = allowed_unconditionally(profile)
    assert {"read", "write", "openat", "execve", "clone", "epoll_wait", "setsockopt", "socket", "pipe2"} - allowed <= {
        "clone",
        "socket",
    }
    for name in FORBIDDEN:
        assert name not in syscall_names(profile), name


def test_without_cap_sys_admin_clone_may_not_make_namespaces_and_clone3_is_enosys() -> None:
    profile = runtime_default(DEFAULT_CAPABILITIES, X86)
    (clone,) = [r for r in profile["syscalls"] if r["names"] == ["clone"]]
    assert clone["args"] == [{"index": 0, "value": 0x7E020000, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]
    (clone3,) = [r for r in profile["syscalls"] if r["names"] == ["clone3"]]
    assert (clone3["action"], clone3["errnoRet"]) == ("SCMP_ACT_ERRNO", 38)
    (socket,) = [r for r in profile["syscalls"] if r["names"] == ["socket"]]
    assert socket["args"] == [{"index": 0, "value": 40, "op": "SCMP_CMP_NE"}]  # AF_VSOCK
    assert {r["args"][0]["value"] for r in profile["syscalls"] if r["names"] == ["personality"]} == {
        0,
        8,
        0x20000,
        0x20008,
        0xFFFFFFFF,
    }


@pytest.mark.parametrize(
    ("cap", "calls"),
    [
        ("CAP_SYS_ADMIN", {"mount", "umount2", "setns", "unshare", "clone", "clone3", "bpf", "pivot_root_"}),
        ("CAP_SYS_PTRACE", {"kcmp", "pidfd_getfd", "process_madvise"}),
        ("CAP_SYS_MODULE", {"init_module", "finit_module", "delete_module"}),
        ("CAP_SYS_TIME", {"settimeofday", "clock_settime"}),
        ("CAP_DAC_READ_SEARCH", {"open_by_handle_at"}),
        ("CAP_SYS_BOOT", {"reboot"}),
        ("CAP_SYS_CHROOT", {"chroot"}),
        ("CAP_BPF", {"bpf"}),
        ("CAP_PERFMON", {"perf_event_open"}),
    ],
)
def test_calls_gated_on_a_capability_are_allowed_with_it_only(cap: str, calls: set[str]) -> None:
    calls = {c for c in calls if not c.endswith("_")}  # a trailing _: never allowed (pivot_root: not even so)
    without = allowed_unconditionally(runtime_default([c for c in DEFAULT_CAPABILITIES if c != cap], X86))
    held = allowed_unconditionally(runtime_default([*DEFAULT_CAPABILITIES, cap], X86))
    assert calls <= held
    assert not calls & without
    assert "pivot_root" not in held and "kexec_load" not in held and "keyctl" not in held


def test_cap_sys_admin_lifts_the_clone_rules() -> None:
    profile = runtime_default(["CAP_SYS_ADMIN"], X86)
    assert not [r for r in profile["syscalls"] if r["names"] in (["clone"], ["clone3"])]


def test_the_architecture_decides_the_filter_s_architectures_and_arch_calls() -> None:
    x86, arm = runtime_default([], X86), runtime_default([], ARM)
    assert x86["architectures"] == ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"]
    assert arm["architectures"] == ["SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"]
    assert "arch_prctl" in allowed_unconditionally(x86) and "arch_prctl" not in allowed_unconditionally(arm)
    assert "set_tls" in allowed_unconditionally(arm) and "set_tls" not in allowed_unconditionally(x86)


def test_the_filter_follows_the_capabilities_after_drop_add_and_what_the_runtime_holds() -> None:
    node_proxy = pod(capabilities={"drop": ["ALL"], "add": ["NET_ADMIN", "SYS_ADMIN", "NET_RAW"]})
    assert "setns" in allowed_unconditionally(config_of(node_proxy)["linux"]["seccomp"])
    held = dataclasses.replace(PATHS, held_capabilities=frozenset({"CAP_NET_ADMIN"}))
    assert "setns" in allowed_unconditionally(config_of(node_proxy, held)["linux"]["seccomp"])  # not privileged
    dropped = config_of(pod(capabilities={"drop": ["SYS_ADMIN"]}))["linux"]["seccomp"]
    assert "setns" not in allowed_unconditionally(dropped)


def _manifest_pod(path: str) -> dict[str, Any]:
    daemonset = yaml.safe_load((REPO / path).read_text())
    template = daemonset["spec"]["template"]
    return {"metadata": {"name": "x", "namespace": "istio-system", "uid": UID}, "spec": template["spec"]}


def test_the_mesh_s_node_proxy_gets_setns_under_runtime_default_and_the_cni_agent_is_unconfined() -> None:
    ztunnel = _manifest_pod("deploy/base/ztunnel/daemonset.yaml")
    container = ztunnel["spec"]["containers"][0]
    profile = container_config(ztunnel, container, PROCESS, PATHS)["linux"]["seccomp"]
    allowed = allowed_unconditionally(profile)
    assert {"setns", "setsockopt", "unshare", "mount"} <= allowed  # setns into pods; SO_MARK is a setsockopt
    assert "keyctl" not in allowed and "kexec_load" not in allowed
    cni = _manifest_pod("deploy/base/istio-cni/daemonset.yaml")
    assert "seccomp" not in container_config(cni, cni["spec"]["containers"][0], PROCESS, PATHS)["linux"]


# -- Localhost ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, "must be set when seccomp type is Localhost"),
        ("", "must be set when seccomp type is Localhost"),
        ("/etc/passwd", "must be a relative path"),
        ("../../../etc/shadow", "must not contain '..'"),
        ("profiles/../../x.json", "must not contain '..'"),
        ("./", "names no file"),
        ("a\0b", "not a usable path"),
        ("a" * 5000, "not a usable path"),
        (7, "must be set"),
    ],
)
def test_a_localhost_path_that_could_leave_the_seccomp_directory_is_a_config_error(value: Any, message: str) -> None:
    with pytest.raises(SeccompFieldError, match=message):
        localhost_path(value)
    p = pod(seccompProfile={"type": "Localhost", "localhostProfile": value})
    with pytest.raises(SecurityContextError, match=message):
        config_of(p, dataclasses.replace(PATHS, seccomp_localhost=b"{}"))


def test_an_unknown_profile_type_is_a_config_error() -> None:
    with pytest.raises(SecurityContextError, match="'Permissive' is not one of"):
        config_of(pod(seccompProfile={"type": "Permissive"}))


def test_a_localhost_path_is_normalised() -> None:
    assert localhost_path("./profiles//audit.json") == "profiles/audit.json"


OCI_PROFILE = {
    "defaultAction": "SCMP_ACT_ERRNO",
    "defaultErrnoRet": 1,
    "architectures": ["SCMP_ARCH_X86_64"],
    "syscalls": [
        {"names": ["read", "write", "exit_group"], "action": "SCMP_ACT_ALLOW"},
        {"names": ["personality"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 0, "value": 0, "op": "SCMP_CMP_EQ"}]},
    ],
}


def test_a_localhost_profile_in_oci_form_is_used_as_it_is() -> None:
    p = pod(seccompProfile=LOCAL)
    paths = dataclasses.replace(PATHS, seccomp_localhost=json.dumps(OCI_PROFILE).encode())
    assert config_of(p, paths)["linux"]["seccomp"] == OCI_PROFILE


def test_a_docker_form_profile_is_narrowed_to_this_machine_and_bounding_set() -> None:
    docker = {
        "defaultAction": "SCMP_ACT_ERRNO",
        "archMap": [
            {"architecture": "SCMP_ARCH_X86_64", "subArchitectures": ["SCMP_ARCH_X86", "SCMP_ARCH_X32"]},
            {"architecture": "SCMP_ARCH_AARCH64", "subArchitectures": ["SCMP_ARCH_ARM"]},
        ],
        "syscalls": [
            {"names": ["read"], "action": "SCMP_ACT_ALLOW", "comment": "always"},
            {"names": ["mount"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_SYS_ADMIN"]}},
            {"names": ["arch_prctl"], "action": "SCMP_ACT_ALLOW", "includes": {"arches": ["amd64"]}},
            {"names": ["ptrace"], "action": "SCMP_ACT_ALLOW", "includes": {"minKernel": "4.8"}},
            {"names": ["futex_waitv"], "action": "SCMP_ACT_ALLOW", "includes": {"minKernel": "9.1"}},
            {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38, "excludes": {"caps": ["CAP_SYS_ADMIN"]}},
        ],
    }
    out = parse_profile(json.dumps(docker).encode(), DEFAULT_CAPABILITIES, X86)
    assert out["architectures"] == ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"]
    assert [r["names"] for r in out["syscalls"]] == [["read"], ["arch_prctl"], ["ptrace"], ["clone3"]]
    admin = parse_profile(json.dumps(docker).encode(), ["CAP_SYS_ADMIN"], ARM)
    assert admin["architectures"] == ["SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"]
    assert [r["names"] for r in admin["syscalls"]] == [["read"], ["mount"], ["ptrace"]]


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (b"not json", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[]", "not a JSON object"),
        (b"[" * 100_000, "not valid JSON"),
        (b"{}", "defaultAction: 'None' is not a seccomp action"),
        (b'{"defaultAction": "SCMP_ACT_NOTIFY"}', "SCMP_ACT_NOTIFY is not supported"),
        (b'{"defaultAction": "SCMP_ACT_ALLOW", "listenerPath": "/run/x"}', "notification is not supported"),
        (b'{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": {}}', "syscalls must be a list"),
        (b'{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"action": "SCMP_ACT_ALLOW"}]}', "names no syscall"),
        (
            b'{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["rm -rf"], "action": "SCMP_ACT_ALLOW"}]}',
            "is not a syscall name",
        ),
        (b'{"defaultAction": "SCMP_ACT_ALLOW", "architectures": ["SCMP_ARCH_Z80"]}', "unknown architecture"),
        (b'{"defaultAction": "SCMP_ACT_ALLOW", "flags": ["SECCOMP_FILTER_FLAG_X"]}', "unknown flag"),
        (b'{"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": -1}', "defaultErrnoRet must be an integer"),
        (
            b'{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["read"], "action": "SCMP_ACT_ALLOW",'
            b' "args": [{"index": 6, "value": 0, "op": "SCMP_CMP_EQ"}]}]}',
            r"args\[0\].index must be an integer from 0 to 5",
        ),
        (
            b'{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["read"], "action": "SCMP_ACT_ALLOW",'
            b' "args": [{"index": 0, "value": 0, "op": "SCMP_CMP_LIKE"}]}]}',
            "is not a seccomp comparison",
        ),
        (
            b'{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["read"], "action": "SCMP_ACT_ALLOW",'
            b' "includes": {"minKernel": "four"}}]}',
            "minKernel must be like",
        ),
    ],
)
def test_a_malformed_profile_is_one_clear_error_naming_the_field(document: bytes, message: str) -> None:
    with pytest.raises(SeccompProfileError, match=message) as caught:
        parse_profile(document, DEFAULT_CAPABILITIES, X86, name="profiles/bad.json")
    assert str(caught.value).startswith("cannot load seccomp profile 'profiles/bad.json': ")
    assert "\n" not in str(caught.value)


def test_profiles_are_bounded_in_size_rules_and_names() -> None:
    big = b'{"defaultAction": "SCMP_ACT_ALLOW", "x": "' + b"a" * MAX_PROFILE_BYTES + b'"}'
    with pytest.raises(SeccompProfileError, match="larger than"):
        parse_profile(big, [], X86)
    rules = [{"names": ["read"], "action": "SCMP_ACT_ALLOW"}] * (MAX_RULES + 1)
    with pytest.raises(SeccompProfileError, match="more than 1024 rules"):
        parse_profile(json.dumps({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": rules}).encode(), [], X86)
    names = [{"names": ["read"] * 1000, "action": "SCMP_ACT_ALLOW"}] * 9
    with pytest.raises(SeccompProfileError, match="more than 8192 names"):
        parse_profile(json.dumps({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": names}).encode(), [], X86)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
_keys = st.sampled_from(
    ["defaultAction", "defaultErrnoRet", "architectures", "archMap", "flags", "syscalls", "names", "action", "args"]
)
_rule = st.fixed_dictionaries(
    {"names": st.lists(st.sampled_from(["read", "write", "mount", "Bad!"]), max_size=3)},
    optional={
        "action": st.sampled_from([*ACTIONS, "SCMP_ACT_NOTIFY", 3]),
        "errnoRet": st.integers(-2, 2**32),
        "args": st.lists(
            st.fixed_dictionaries(
                {
                    "index": st.integers(-1, 7),
                    "value": st.integers(-1, 2**64),
                    "op": st.sampled_from(["SCMP_CMP_EQ", "x"]),
                }
            ),
            max_size=7,
        ),
        "includes": st.dictionaries(st.sampled_from(["caps", "arches", "minKernel"]), _json, max_size=3),
        "excludes": st.dictionaries(st.sampled_from(["caps", "arches", "minKernel"]), _json, max_size=3),
    },
)
_profile = st.fixed_dictionaries(
    {},
    optional={
        "defaultAction": st.sampled_from([*ACTIONS, "nope"]),
        "defaultErrnoRet": st.integers(-1, 2**32),
        "architectures": st.lists(st.sampled_from(["SCMP_ARCH_X86_64", "SCMP_ARCH_ARM", "Z80"]), max_size=3),
        "syscalls": st.lists(_rule, max_size=4) | _json,
        "flags": _json,
    },
)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200) | (_json | _profile).map(lambda v: json.dumps(v).encode()))
def test_the_profile_parser_returns_an_oci_filter_or_one_profile_error(data: bytes) -> None:
    try:
        out = parse_profile(data, DEFAULT_CAPABILITIES, X86)
    except SeccompProfileError as exc:
        assert str(exc).startswith("cannot load seccomp profile")
        return
    assert out["defaultAction"] in ACTIONS
    for rule in out["syscalls"]:
        assert rule["action"] in ACTIONS and rule["names"]
        assert all(0 <= a["index"] <= 5 for a in rule.get("args", ()))


@given(_keys, _json)
def test_any_value_of_any_field_is_accepted_or_refused_cleanly(key: str, value: Any) -> None:
    document = {"defaultAction": "SCMP_ACT_ALLOW", key: value}
    with contextlib.suppress(SeccompProfileError):
        parse_profile(json.dumps(document).encode(), [], ARM)


def test_kernel_versions_are_read_from_the_release_string() -> None:
    assert kernel_version("6.1.0-18-amd64") == (6, 1)
    assert kernel_version("6.18.44-fc-v1045") == (6, 18)
    assert kernel_version("weird") == (0, 0)


# -- reading the file (the shell) ----------------------------------------------------------------------------------
def test_a_profile_is_read_from_inside_the_seccomp_directory_only(tmp_path: Path) -> None:
    root = tmp_path / "seccomp"
    (root / "profiles").mkdir(parents=True)
    (root / "profiles" / "audit.json").write_bytes(b'{"defaultAction": "SCMP_ACT_LOG"}')
    (tmp_path / "secret.json").write_text('{"password": "hunter2"}')
    (root / "profiles" / "escape.json").symlink_to(tmp_path / "secret.json")
    (root / "profiles" / "inside.json").symlink_to(root / "profiles" / "audit.json")
    (root / "profiles" / "dir.json").mkdir()
    os.mkfifo(root / "profiles" / "fifo.json")
    (root / "profiles" / "big.json").write_bytes(b" " * (MAX_PROFILE_BYTES + 1))

    assert read_seccomp_profile(root, "profiles/audit.json") == b'{"defaultAction": "SCMP_ACT_LOG"}'
    assert read_seccomp_profile(root, "profiles/inside.json") == b'{"defaultAction": "SCMP_ACT_LOG"}'
    for name, why in [
        ("profiles/escape.json", "leads out of the seccomp profile directory"),
        ("profiles/missing.json", "no such file"),
        ("profiles/dir.json", "not a regular file"),
        ("profiles/fifo.json", "not a regular file"),
        ("profiles/big.json", "larger than"),
    ]:
        with pytest.raises(SeccompProfileError, match=why) as caught:
            read_seccomp_profile(root, name)
        assert "hunter2" not in str(caught.value)
    with pytest.raises(SeccompProfileError, match="no such file"):
        read_seccomp_profile(tmp_path / "absent", "profiles/audit.json")

"""The OCI configuration of lab containers (:mod:`ambit.lab.runtime.oci_spec`): golden files for whole
configurations, tables for the security context, limits, masks and the service-account mount, hypothesis on the
quantity parser.

Golden files live in ``golden/lab_oci/<case>.json``; ``AMBIT_UPDATE_GOLDEN=1 pytest ...`` rewrites them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.lab.cluster.node import closed_ancestors
from ambit.lab.runtime.oci_apply import prepare_root_view
from ambit.lab.runtime.oci_spec import (
    ALL_CAPABILITIES,
    DEFAULT_CAPABILITIES,
    RUNC_MASKED_PATHS,
    SERVICE_ACCOUNT_DIR,
    BundlePaths,
    ProcessSpec,
    SecurityContextError,
    VolumeMount,
    container_config,
    container_id,
    linux_resources,
    parse_quantity,
    security_view,
    view_source,
)

GOLDEN = Path(__file__).parent / "golden" / "lab_oci"
UID = "0d5c7e36-5b1e-4c61-9f0e-2f7e1a2b3c4d"
PATHS = BundlePaths(
    container_id=container_id(UID, "app"),
    netns_path="/run/netns/ab12cd-p-0d5c7e365b1e",
    service_account_dir=f"/var/lib/ambit/lab/pods/{UID}/serviceaccount",
    cgroup_parent="/ambit-ab12cd",
    masked=("/var/lib/ambit/lab", "/root", "/run/netns", "/work/repo/.git", "/etc/shadow"),
    masked_files=frozenset({"/etc/shadow"}),
    revealed=("/root/.pyenv/versions/3.11.7",),
    pids_limit=1024,
)
PROCESS = ProcessSpec(("python3", "-m", "ambit.lab.apps", "http-echo", "--port", "8080"), {"PATH": "/usr/bin"})


def pod(*, spec: dict[str, Any] | None = None, **container: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "web", "namespace": "default", "uid": UID},
        "spec": {"containers": [{"name": "app", **container}], **(spec or {})},
    }


def config_of(p: dict[str, Any], paths: BundlePaths = PATHS, process: ProcessSpec = PROCESS) -> dict[str, Any]:
    return container_config(p, p["spec"]["containers"][0], process, paths)


CASES: dict[str, dict[str, Any]] = {
    "default": pod(),
    "restricted": pod(
        spec={"securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "fsGroup": 2000}},
        securityContext={
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
        },
        resources={"limits": {"memory": "64Mi", "cpu": "250m"}, "requests": {"cpu": "100m"}},
    ),
    "privileged": pod(securityContext={"privileged": True}),
    "no_token_host_network": pod(spec={"automountServiceAccountToken": False, "hostNetwork": True}),
}


def golden(name: str, config: dict[str, Any]) -> None:
    path = GOLDEN / f"{name}.json"
    text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    if os.environ.get("AMBIT_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{path} differs (AMBIT_UPDATE_GOLDEN=1 rewrites it)"


@pytest.mark.parametrize("case", sorted(CASES))
def test_configuration_matches_its_golden_file(case: str) -> None:
    paths = PATHS
    if case == "no_token_host_network":
        paths = dataclasses.replace(PATHS, netns_path="")
    golden(case, config_of(CASES[case], paths))


# -- namespaces, root, masks, token (rules 1 to 4) ----------------------------------------------------------------
def test_the_pod_network_namespace_is_joined_by_path_and_the_rest_are_the_container_s_own() -> None:
    config = config_of(pod())
    assert config["linux"]["namespaces"] == [
        {"type": "network", "path": PATHS.netns_path},
        {"type": "pid"},
        {"type": "ipc"},
        {"type": "uts"},
        {"type": "mount"},
    ]
    assert config["hostname"] == "web"


def test_the_root_is_the_host_read_only_whatever_read_only_root_filesystem_says() -> None:
    for flag in (True, False, None):
        config = config_of(pod(securityContext={"readOnlyRootFilesystem": flag}))
        assert config["root"] == {"path": "rootfs", "readonly": True}
        assert config["mounts"][0] == {"destination": "/", "type": "bind", "source": "/", "options": ["rbind", "rro"]}


def mounts_at(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["destination"]: m for m in config["mounts"]}


def test_a_pod_in_the_runtime_s_network_namespace_gets_its_sys_bound_read_only() -> None:
    shared = mounts_at(config_of(pod(), dataclasses.replace(PATHS, netns_path="")))
    assert shared["/sys"] == {
        "destination": "/sys",
        "type": "bind",
        "source": "/sys",
        "options": ["rbind", "nosuid", "noexec", "nodev", "rro"],
    }
    assert mounts_at(config_of(pod()))["/sys"]["type"] == "sysfs"


def test_tmp_run_and_dev_shm_are_private_and_writable() -> None:
    for flag in (False, None):
        mounts = mounts_at(config_of(pod(securityContext={"readOnlyRootFilesystem": flag})))
        for path in ("/tmp", "/run", "/root", "/dev/shm"):
            assert mounts[path]["type"] == "tmpfs" and "ro" not in mounts[path]["options"], path


def test_read_only_root_filesystem_makes_the_private_directories_read_only_but_not_dev_shm() -> None:
    mounts = mounts_at(config_of(pod(securityContext={"readOnlyRootFilesystem": True}), PATHS))
    for path in ("/tmp", "/run", "/root"):
        assert mounts[path]["type"] == "tmpfs" and mounts[path]["options"][-1] == "ro", path
    assert "ro" not in mounts["/dev/shm"]["options"]  # as under containerd: the pod's shared memory, not the root
    # The field is the container's; a pod-level one (which kube's PodSecurityContext does not have) changes nothing.
    ignored = mounts_at(config_of(pod(spec={"securityContext": {"readOnlyRootFilesystem": True}})))
    assert "ro" not in ignored["/tmp"]["options"]


def test_with_read_only_root_filesystem_a_volume_on_a_private_directory_stays_writable() -> None:
    """runc makes a read-only tmpfs read-only last, by remounting its path: a volume mounted on that path would be
    what is remounted, so the tmpfs under it is left writable (the volume hides it)."""
    for destination, private in (("/tmp", "/tmp"), ("/tmp/", "/tmp"), ("/var/run", "/run")):
        volume = VolumeMount(source=f"/var/lib/ambit/lab/pods/{UID}/volumes/v", destination=destination)
        paths = dataclasses.replace(PATHS, volume_mounts=(volume,))
        config = config_of(pod(securityContext={"readOnlyRootFilesystem": True}), paths)
        [tmpfs] = [m for m in config["mounts"] if m["destination"] == private and m["type"] == "tmpfs"]
        assert "ro" not in tmpfs["options"], destination
        bind = [m for m in config["mounts"] if m["destination"] == destination][-1]
        assert bind["type"] == "bind" and bind["options"] == ["rbind", "rw", "rprivate"], destination
        others = {"/tmp", "/run", "/root"} - {private}
        assert all(mounts_at(config)[path]["options"][-1] == "ro" for path in others), destination


def test_secrets_are_masked_and_the_interpreter_is_revealed_after_the_masks() -> None:
    config = config_of(pod())
    destinations = [m["destination"] for m in config["mounts"]]
    mounts = mounts_at(config)
    for path in ("/var/lib/ambit/lab", "/work/repo/.git"):
        assert mounts[path]["type"] == "tmpfs" and "ro" in mounts[path]["options"]
    assert mounts["/etc/shadow"] == {
        "destination": "/etc/shadow",
        "type": "bind",
        "source": "/dev/null",
        "options": ["bind", "ro"],
    }
    assert "/run/netns" not in destinations  # /run is a private tmpfs already
    assert destinations.index("/root/.pyenv/versions/3.11.7") > destinations.index("/root")
    assert "rro" in mounts["/root/.pyenv/versions/3.11.7"]["options"]


def test_a_checkout_under_a_closed_directory_is_revealed_beneath_a_view_of_it(tmp_path: Path) -> None:
    """A clone in a 0700 directory (``mktemp -d`` outside /tmp): the directory is covered by a read-only 0755 view
    holding only the mount points of the interpreter bound back beneath it (runc would give a tmpfs there the
    covered directory's 0700, and a container running as another user could not enter it)."""
    paths = dataclasses.replace(
        PATHS,
        masked=(*PATHS.masked, "/work/ci/run.x"),
        revealed=(*PATHS.revealed, "/work/ci/run.x/ci/.venv", "/work/ci/run.x/ci/src"),
        views=str(tmp_path / "views"),
    )
    config = config_of(pod(), paths)
    destinations = [m["destination"] for m in config["mounts"]]
    mounts = mounts_at(config)
    view = view_source(paths.views, "/work/ci/run.x")
    assert mounts["/work/ci/run.x"] == {
        "destination": "/work/ci/run.x",
        "type": "bind",
        "source": view,
        "options": ["rbind", "ro", "nosuid", "nodev"],
    }
    assert mounts["/var/lib/ambit/lab"]["type"] == "tmpfs"  # nothing revealed beneath: an empty read-only tmpfs
    assert "ro" in mounts["/var/lib/ambit/lab"]["options"]
    prepare_root_view(Path(view), config, "/work/ci/run.x")
    assert sorted(str(p.relative_to(view)) for p in Path(view).rglob("*")) == ["ci", "ci/.venv", "ci/src"]
    assert all(p.stat().st_mode & 0o777 == 0o755 for p in [Path(view), *Path(view).rglob("*")])
    for revealed in ("/work/ci/run.x/ci/.venv", "/work/ci/run.x/ci/src"):
        assert destinations.index(revealed) > destinations.index("/work/ci/run.x")
        assert mounts[revealed]["options"] == ["rbind", "rro"]


def test_closed_ancestors_are_the_directories_others_cannot_enter(tmp_path: Path) -> None:
    outer = tmp_path / "open"
    closed = outer / "closed"
    inner = closed / "checkout" / ".venv"
    inner.mkdir(parents=True)
    outer.chmod(0o755)
    closed.chmod(0o700)
    found = closed_ancestors(inner)
    assert closed in found and outer not in found
    assert closed_ancestors(Path("/usr/bin")) == []


@pytest.mark.parametrize(
    ("masked", "kept"),
    [
        (("/var/lib/ambit/lab", "/var/lib/ambit/lab/pods"), ["/var/lib/ambit/lab"]),
        (("/tmp/lab", "/run/netns", "/root/.ssh"), []),
        (("/srv/x/", "/srv//x", "/srv/./x"), ["/srv/x"]),
        (("/", "", "/srv/../etc"), []),
    ],
)
def test_masks_inside_other_masks_or_private_directories_are_left_out(masked: tuple[str, ...], kept: list[str]) -> None:
    paths = BundlePaths(PATHS.container_id, "", "/sa", "/ambit-ab12cd", masked=masked)
    fixed = {
        "/",
        "/proc",
        "/dev",
        "/dev/pts",
        "/dev/shm",
        "/dev/mqueue",
        "/sys",
        "/tmp",
        "/run",
        "/root",
        SERVICE_ACCOUNT_DIR,
    }
    assert [m["destination"] for m in config_of(pod(), paths)["mounts"] if m["destination"] not in fixed] == kept


@pytest.mark.parametrize(
    ("spec", "mounted"),
    [({}, True), ({"automountServiceAccountToken": True}, True), ({"automountServiceAccountToken": False}, False)],
)
def test_the_service_account_directory_is_bound_read_only_unless_automount_is_off(
    spec: dict[str, Any], mounted: bool
) -> None:
    mounts = mounts_at(config_of(pod(spec=spec)))
    assert (SERVICE_ACCOUNT_DIR in mounts) is mounted
    if mounted:
        mount = mounts[SERVICE_ACCOUNT_DIR]
        assert mount["source"] == PATHS.service_account_dir  # this pod's own directory, nothing else
        assert mount["type"] == "bind" and "ro" in mount["options"]


# -- security context (rules 5 to 7) ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("pod_sc", "container_sc", "uid", "gid"),
    [
        ({}, {}, 0, 0),
        ({"runAsUser": 1000}, {}, 1000, 0),
        ({"runAsUser": 1000, "runAsGroup": 3000}, {"runAsUser": 2000}, 2000, 3000),
        ({"runAsNonRoot": True}, {"runAsUser": 1001}, 1001, 0),
        ({"runAsUser": 0}, {"runAsGroup": 5}, 0, 5),
    ],
)
def test_identity_comes_from_the_container_then_the_pod(
    pod_sc: dict[str, Any], container_sc: dict[str, Any], uid: int, gid: int
) -> None:
    config = config_of(pod(spec={"securityContext": pod_sc}, securityContext=container_sc))
    assert (config["process"]["user"]["uid"], config["process"]["user"]["gid"]) == (uid, gid)


@pytest.mark.parametrize(
    ("pod_sc", "container_sc", "message"),
    [
        ({"runAsNonRoot": True}, {}, "container has runAsNonRoot and image will run as root"),
        ({}, {"runAsNonRoot": True}, "container has runAsNonRoot and image will run as root"),
        ({"runAsNonRoot": True, "runAsUser": 0}, {}, "container's runAsUser breaks non-root policy"),
        ({"runAsNonRoot": True}, {"runAsUser": 0}, "container's runAsUser breaks non-root policy"),
    ],
)
def test_run_as_non_root_without_a_non_root_user_is_a_config_error(
    pod_sc: dict[str, Any], container_sc: dict[str, Any], message: str
) -> None:
    with pytest.raises(SecurityContextError) as caught:
        config_of(pod(spec={"securityContext": pod_sc}, securityContext=container_sc))
    assert str(caught.value) == f'{message} (pod: "web_default({UID})", container: app)'


def test_the_container_s_run_as_non_root_false_overrides_the_pod_s() -> None:
    config = config_of(pod(spec={"securityContext": {"runAsNonRoot": True}}, securityContext={"runAsNonRoot": False}))
    assert config["process"]["user"]["uid"] == 0


def test_supplemental_groups_and_fs_group_are_additional_groups() -> None:
    sc = {"supplementalGroups": [10, 20], "fsGroup": 20}
    assert config_of(pod(spec={"securityContext": sc}))["process"]["user"]["additionalGids"] == [10, 20]


@pytest.mark.parametrize(
    ("capabilities", "expected"),
    [
        ({}, list(DEFAULT_CAPABILITIES)),
        ({"drop": ["ALL"]}, []),
        ({"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}, ["CAP_NET_BIND_SERVICE"]),
        ({"drop": ["NET_RAW", "cap_kill"]}, [c for c in DEFAULT_CAPABILITIES if c not in ("CAP_NET_RAW", "CAP_KILL")]),
        ({"add": ["NET_ADMIN", "CAP_CHOWN"]}, [*DEFAULT_CAPABILITIES, "CAP_NET_ADMIN"]),
        ({"add": ["ALL"]}, list(ALL_CAPABILITIES)),
    ],
)
def test_capabilities_are_containerd_s_defaults_minus_drop_plus_add(
    capabilities: dict[str, Any], expected: list[str]
) -> None:
    caps = config_of(pod(securityContext={"capabilities": capabilities}))["process"]["capabilities"]
    assert caps["bounding"] == caps["effective"] == caps["permitted"] == expected
    assert caps["inheritable"] == caps["ambient"] == []


def test_an_unknown_capability_is_a_config_error() -> None:
    with pytest.raises(SecurityContextError, match="unknown capability 'FLY'"):
        config_of(pod(securityContext={"capabilities": {"add": ["FLY"]}}))


@pytest.mark.parametrize(
    ("sc", "no_new_privileges"),
    [
        ({}, False),
        ({"allowPrivilegeEscalation": True}, False),
        ({"allowPrivilegeEscalation": False}, True),
        ({"allowPrivilegeEscalation": False, "privileged": True}, False),
    ],
)
def test_no_new_privileges_exactly_when_escalation_is_disallowed(sc: dict[str, Any], no_new_privileges: bool) -> None:
    assert config_of(pod(securityContext=sc))["process"]["noNewPrivileges"] is no_new_privileges


def test_privileged_gets_every_capability_and_no_runc_masks_but_keeps_the_lab_s() -> None:
    config = config_of(pod(securityContext={"privileged": True}))
    assert config["process"]["capabilities"]["bounding"] == list(ALL_CAPABILITIES)
    assert "maskedPaths" not in config["linux"] and "readonlyPaths" not in config["linux"]
    mounts = mounts_at(config)
    assert "ro" not in mounts["/sys"]["options"]
    assert mounts["/var/lib/ambit/lab"]["type"] == "tmpfs"
    plain = config_of(pod())
    assert plain["linux"]["maskedPaths"] == list(RUNC_MASKED_PATHS)
    assert "ro" in mounts_at(plain)["/sys"]["options"]


@pytest.mark.parametrize("bad", [-1, "1000", 2**31, True, 1.5])
def test_a_malformed_user_id_is_a_config_error(bad: Any) -> None:
    with pytest.raises(SecurityContextError, match="runAsUser"):
        security_view(pod(securityContext={"runAsUser": bad}), {"name": "app", "securityContext": {"runAsUser": bad}})


# -- limits (rule 8) ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        ({}, {"pids": {"limit": 1024}}),
        ({"limits": {"memory": "64Mi"}}, {"memory": {"limit": 64 * 2**20}, "pids": {"limit": 1024}}),
        ({"limits": {"memory": "1G"}}, {"memory": {"limit": 10**9}, "pids": {"limit": 1024}}),
        (
            {"limits": {"cpu": "500m"}, "requests": {"cpu": "250m"}},
            {"cpu": {"shares": 256, "quota": 50_000, "period": 100_000}, "pids": {"limit": 1024}},
        ),
        ({"limits": {"cpu": "2"}}, {"cpu": {"quota": 200_000, "period": 100_000}, "pids": {"limit": 1024}}),
        ({"limits": {"cpu": "1m"}}, {"cpu": {"quota": 1000, "period": 100_000}, "pids": {"limit": 1024}}),
        ({"requests": {"cpu": "1m"}}, {"cpu": {"shares": 2}, "pids": {"limit": 1024}}),
    ],
)
def test_limits_become_cgroup_resources(resources: dict[str, Any], expected: dict[str, Any]) -> None:
    assert linux_resources({"resources": resources}, PATHS) == expected


def test_unavailable_controllers_get_no_limits_and_the_container_a_cgroup_under_the_lab_s_parent() -> None:
    paths = BundlePaths(
        **{**{f: getattr(PATHS, f) for f in PATHS.__slots__}, "unavailable": frozenset({"memory", "pids"})}
    )
    p = pod(resources={"limits": {"memory": "64Mi", "cpu": "1"}})
    config = config_of(p, paths)
    assert set(config["linux"]["resources"]) == {"devices", "cpu"}
    assert config["linux"]["cgroupsPath"] == f"/ambit-ab12cd/{PATHS.container_id}"


@pytest.mark.parametrize("bad", ["", "lots", "1.2.3", "5Xi", "-1", "1e", None, [1]])
def test_a_malformed_quantity_is_a_config_error(bad: Any) -> None:
    with pytest.raises(SecurityContextError, match="quantity"):
        parse_quantity(bad)


@given(st.integers(min_value=0, max_value=10**12), st.sampled_from(["", "Ki", "Mi", "Gi", "k", "M", "G", "m"]))
def test_quantities_scale_by_their_suffix(number: int, suffix: str) -> None:
    scale = {"": 1, "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "k": 1000, "M": 10**6, "G": 10**9, "m": Decimal("0.001")}
    assert parse_quantity(f"{number}{suffix}") == number * Decimal(scale[suffix])


@given(st.text(max_size=12))
def test_the_quantity_parser_never_fails_otherwise(text: str) -> None:
    with contextlib.suppress(SecurityContextError):
        assert parse_quantity(text) >= 0


# -- the process (rule 9) -----------------------------------------------------------------------------------------
def test_the_process_runs_the_given_argv_env_and_working_directory_without_a_terminal() -> None:
    process = ProcessSpec(("sh", "-c", "pwd"), {"A": "1", "PATH": "/bin"}, "/srv")
    config = config_of(pod(), process=process)["process"]
    assert config["args"] == ["sh", "-c", "pwd"]
    assert config["env"] == ["A=1", "PATH=/bin"]
    assert (config["cwd"], config["terminal"]) == ("/srv", False)
    assert config_of(pod())["process"]["cwd"] == "/"


def test_container_ids_are_derived_from_the_pod_uid_and_the_container_name() -> None:
    assert container_id(UID, "app") == "0d5c7e365b1e4c619f0e2f7e1a2b3c4d-app"

"""Pod volumes without I/O: parsing, payloads, hostPath checks and mappings, volumeMounts, and the OCI mounts."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.lab.network.topology import HostPathError, HostPathLayout
from ambit.lab.runtime.oci_spec import (
    SERVICE_ACCOUNT_DIR,
    BundlePaths,
    MountPointDir,
    ProcessSpec,
    VolumeMount,
    container_config,
)
from ambit.lab.runtime.volumes import (
    DownwardSource,
    EmptyDirVolume,
    FileData,
    FileKind,
    HostPathVolume,
    ObjectSource,
    ProjectedVolume,
    TokenSource,
    VolumeError,
    VolumeInputs,
    VolumeSource,
    container_mounts,
    host_path_action,
    nested_mount_points,
    object_data,
    parse_volumes,
    volume_payload,
)


def pod(*volumes: dict[str, Any], **meta: Any) -> dict[str, Any]:
    containers = [{"name": "app", "resources": {"limits": {"memory": "64Mi"}, "requests": {"cpu": "250m"}}}]
    metadata = {"name": "web", "namespace": "shop", "uid": "u-1", **meta}
    return {"metadata": metadata, "spec": {"containers": containers, "volumes": list(volumes)}}


def inputs(p: dict[str, Any], **kw: Any) -> VolumeInputs:
    values: dict[str, Any] = {"config_maps": {}, "secrets": {}, "tokens": {}, "allocatable": {"cpu": "2"}}
    values.update(kw)
    return VolumeInputs(pod=p, **values)


def only(p: dict[str, Any]) -> ProjectedVolume:
    (volume,) = parse_volumes(p)
    assert isinstance(volume, ProjectedVolume)
    return volume


# -- parsing ------------------------------------------------------------------------------------------------------
def test_each_supported_volume_type_parses() -> None:
    p = pod(
        {"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
        {"name": "bin", "hostPath": {"path": "/opt/cni/bin", "type": "DirectoryOrCreate"}},
        {"name": "cfg", "configMap": {"name": "app", "defaultMode": 0o400}},
        {"name": "creds", "secret": {"secretName": "db", "optional": True}},
        {"name": "info", "downwardAPI": {"items": [{"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}},
        {
            "name": "token",
            "projected": {"sources": [{"serviceAccountToken": {"audience": "istio-ca", "path": "istio-token"}}]},
        },
    )
    scratch, host, cfg, creds, info, token = parse_volumes(p)
    assert scratch == EmptyDirVolume("scratch", "Memory")
    assert host == HostPathVolume("bin", "/opt/cni/bin", "DirectoryOrCreate")
    assert cfg == ProjectedVolume("cfg", "configMap", (ObjectSource("configmap", "app"),), 0o400)
    assert creds == ProjectedVolume("creds", "secret", (ObjectSource("secret", "db", (), True),))
    assert isinstance(info, ProjectedVolume) and isinstance(info.sources[0], DownwardSource)
    assert token == ProjectedVolume("token", "projected", (TokenSource("istio-token", "istio-ca", 3600),))


@pytest.mark.parametrize(
    ("volume", "message"),
    [
        ({"name": "data", "ephemeral": {"volumeClaimTemplate": {}}}, "not supported by the lab"),
        ({"name": "two", "emptyDir": {}, "hostPath": {"path": "/x"}}, "exactly one volume type"),
        ({"name": "cfg", "configMap": {"name": "a", "items": [{"key": "k", "path": "../etc/passwd"}]}}, "'..'"),
        ({"name": "cfg", "configMap": {"name": "a", "items": [{"key": "k", "path": "/abs"}]}}, "relative"),
        ({"name": "cfg", "configMap": {"name": "a", "items": [{"key": "k", "path": "..data"}]}}, "start with"),
        ({"name": "cfg", "configMap": {"name": "a", "defaultMode": 0o1777}}, "mode"),
        ({"name": "h", "hostPath": {"path": "/x", "type": "Pipe"}}, "Pipe is an invalid volume type"),
        (
            {"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "t", "expirationSeconds": 60}}]}},
            "less than 10 minutes",
        ),
        (
            {"name": "d", "downwardAPI": {"items": [{"path": "n", "fieldRef": {"fieldPath": "spec.nodeName"}}]}},
            "unsupported fieldRef",
        ),
    ],
)
def test_volumes_kube_would_refuse_are_refused_for_good(volume: dict[str, Any], message: str) -> None:
    with pytest.raises(VolumeError, match=message) as caught:
        parse_volumes(pod(volume))
    assert not caught.value.retry


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8), lambda c: st.lists(c, max_size=3)))
def test_any_malformed_volume_list_is_a_volume_error_never_a_crash(junk: Any) -> None:
    for volumes in (
        junk,
        [junk],
        [{"name": "v", "configMap": junk}],
        [{"name": "v", "configMap": {"name": "c", "items": junk}}],
        [{"name": "v", "downwardAPI": {"items": [junk]}}],
        [{"name": "v", "projected": {"sources": junk}}],
        [{"name": "v", "projected": {"sources": [{"serviceAccountToken": junk}]}}],
    ):
        p = {"spec": {"volumes": volumes}}
        with contextlib.suppress(VolumeError):
            parse_volumes(p)


# -- payloads -----------------------------------------------------------------------------------------------------
def test_a_config_map_volume_holds_every_key_or_the_chosen_items_with_their_modes() -> None:
    data = {"config_maps": {"app": {"a.conf": b"A", "b.conf": b"B"}}}
    whole = only(pod({"name": "cfg", "configMap": {"name": "app"}}))
    assert volume_payload(whole, inputs({}, **data)) == {
        "a.conf": FileData(b"A", 0o644),
        "b.conf": FileData(b"B", 0o644),
    }
    items = [{"key": "a.conf", "path": "dir/a", "mode": 0o600}]
    chosen = only(pod({"name": "cfg", "configMap": {"name": "app", "items": items, "defaultMode": 0o440}}))
    assert volume_payload(chosen, inputs({}, **data)) == {"dir/a": FileData(b"A", 0o600)}


def test_a_missing_object_or_key_fails_with_kube_s_text_and_is_retried_unless_optional() -> None:
    cm = only(pod({"name": "cfg", "configMap": {"name": "app"}}))
    with pytest.raises(VolumeError, match=r'^configmap "app" not found$') as caught:
        volume_payload(cm, inputs({}, config_maps={"app": None}))
    assert caught.value.retry
    secret = only(pod({"name": "s", "secret": {"secretName": "db", "items": [{"key": "pw", "path": "pw"}]}}))
    with pytest.raises(VolumeError, match=r"^references non-existent secret key: pw$"):
        volume_payload(secret, inputs({}, secrets={"db": {"user": b"u"}}))
    keyed = only(pod({"name": "c", "configMap": {"name": "app", "items": [{"key": "x", "path": "x"}]}}))
    with pytest.raises(VolumeError, match=r"^configmap references non-existent config key: x$"):
        volume_payload(keyed, inputs({}, config_maps={"app": {}}))
    optional = only(pod({"name": "s", "secret": {"secretName": "db", "optional": True}}))
    assert volume_payload(optional, inputs({}, secrets={"db": None})) == {}


def test_object_data_decodes_secrets_and_binary_config_map_data() -> None:
    assert object_data("secret", {"data": {"pw": "aHVudGVyMg==", "bad": "%%%"}}) == {"pw": b"hunter2"}
    assert object_data("configmap", {"data": {"t": "text"}, "binaryData": {"b": "AAE="}}) == {
        "t": b"text",
        "b": b"\0\1",
    }


def test_a_key_that_is_no_file_name_is_not_written() -> None:
    cm = only(pod({"name": "cfg", "configMap": {"name": "app"}}))
    data = {"app": {"..data": b"x", "ok": b"y", "a/b": b"z"}}
    assert set(volume_payload(cm, inputs({}, config_maps=data))) == {"ok"}


def test_downward_api_files_follow_kube_s_formats() -> None:
    items = [
        {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
        {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
        {"path": "app", "fieldRef": {"fieldPath": "metadata.labels['app']"}},
        {"path": "mem", "resourceFieldRef": {"containerName": "app", "resource": "limits.memory", "divisor": "1Mi"}},
        {"path": "cpu", "resourceFieldRef": {"containerName": "app", "resource": "requests.cpu", "divisor": "1m"}},
        {"path": "cpu-limit", "resourceFieldRef": {"containerName": "app", "resource": "limits.cpu"}},
    ]
    p = pod({"name": "info", "downwardAPI": {"items": items}}, labels={"tier": "web", "app": 'say "hi"'})
    files = volume_payload(only(p), inputs(p))
    assert {k: v.data.decode() for k, v in files.items()} == {
        "name": "web",
        "labels": 'app="say \\"hi\\""\ntier="web"',
        "app": 'say "hi"',
        "mem": "64",
        "cpu": "250",
        "cpu-limit": "2",  # no limit: the node's allocatable
    }


def test_a_token_source_uses_the_fetched_token() -> None:
    volume = only(
        pod({"name": "t", "projected": {"sources": [{"serviceAccountToken": {"audience": "istio-ca", "path": "t"}}]}})
    )
    with pytest.raises(VolumeError) as caught:
        volume_payload(volume, inputs({}))
    assert caught.value.retry
    source = volume.sources[0]
    assert isinstance(source, TokenSource)
    assert volume_payload(volume, inputs({}, tokens={source: "jwt"})) == {"t": FileData(b"jwt", 0o644)}


# -- hostPath -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("host_type", "found", "expected"),
    [
        ("", None, "mkdir"),
        ("", FileKind.FILE, "none"),
        ("DirectoryOrCreate", None, "mkdir"),
        ("DirectoryOrCreate", FileKind.DIRECTORY, "none"),
        ("FileOrCreate", None, "create-file"),
        ("File", FileKind.FILE, "none"),
        ("Socket", FileKind.SOCKET, "none"),
        ("CharDevice", FileKind.CHAR_DEVICE, "none"),
        ("BlockDevice", FileKind.BLOCK_DEVICE, "none"),
    ],
)
def test_host_path_types_that_pass(host_type: str, found: FileKind | None, expected: str) -> None:
    assert host_path_action(host_type, found, "/p") == expected


@pytest.mark.parametrize(
    ("host_type", "found", "message"),
    [
        ("Directory", None, "hostPath type check failed: /p is not a directory"),
        ("DirectoryOrCreate", FileKind.FILE, "hostPath type check failed: /p is not a directory"),
        ("File", FileKind.DIRECTORY, "hostPath type check failed: /p is not a file"),
        ("FileOrCreate", FileKind.SOCKET, "hostPath type check failed: /p is not a file"),
        ("Socket", FileKind.FILE, "hostPath type check failed: /p is not a socket file"),
        ("CharDevice", None, "hostPath type check failed: /p is not a character device"),
        ("BlockDevice", FileKind.CHAR_DEVICE, "hostPath type check failed: /p is not a block device"),
    ],
)
def test_host_path_type_checks_fail_with_kube_s_text(host_type: str, found: FileKind | None, message: str) -> None:
    with pytest.raises(VolumeError) as caught:
        host_path_action(host_type, found, "/p")
    assert str(caught.value) == message and caught.value.retry


def test_a_node_s_host_paths_map_to_its_cni_dirs_the_machine_s_namespaces_or_its_own_tree() -> None:
    layout = HostPathLayout(Path("/lab"), "node-2")
    node = Path("/lab/nodes/node-2")
    assert layout.map("/opt/cni/bin").machine_path == node / "cni/bin"
    assert layout.map("/etc/cni/net.d/10.conf").machine_path == node / "cni/net.d/10.conf"
    assert layout.map("/var/run/netns").machine_path == Path("/run/netns")
    assert layout.map("/run/netns/x").machine_path == Path("/run/netns/x")
    assert layout.map("/proc").machine_path == Path("/proc")
    assert layout.map("/dev/net/tun").machine_path == Path("/dev/net/tun")
    assert layout.map("/var/run/ztunnel").machine_path == node / "root/var/run/ztunnel"
    assert layout.map("/").machine_path == node / "root"
    assert layout.map("/opt/cni/binaries").machine_path == node / "root/opt/cni/binaries"
    assert layout.map("/etc/shadow").machine_path == node / "root/etc/shadow"
    assert layout.map("/var/lib/ambit/lab").machine_path == node / "root/var/lib/ambit/lab"


@pytest.mark.parametrize("path", ["relative", "/opt/cni/bin/../../..", "/../lab", ""])
def test_a_host_path_that_names_no_node_path_is_refused(path: str) -> None:
    with pytest.raises(HostPathError):
        HostPathLayout(Path("/lab"), "node-1").map(path)


@given(st.lists(st.sampled_from(["a", ".", "..", "", "opt", "cni", "bin", "proc", "lab", "nodes"]), max_size=8))
def test_every_mapped_host_path_stays_under_its_base(parts: list[str]) -> None:
    layout = HostPathLayout(Path("/lab"), "node-1")
    try:
        mapping = layout.map("/" + "/".join(parts))
    except HostPathError:
        return
    assert mapping.machine_path == mapping.base or mapping.base in mapping.machine_path.parents
    assert not str(mapping.machine_path).startswith("/lab/") or str(mapping.machine_path).startswith(
        "/lab/nodes/node-1/"
    )


# -- volumeMounts and the OCI configuration -----------------------------------------------------------------------
SOURCES = {
    "cfg": VolumeSource("/lab/pods/u/volumes/kubernetes.io~configmap/cfg", read_only=True),
    "scratch": VolumeSource("/lab/pods/u/volumes/kubernetes.io~empty-dir/scratch", read_only=False),
    "netns": VolumeSource("/run/netns", read_only=False),
}


def mounts(*volume_mounts: dict[str, Any], privileged: bool = False) -> list[VolumeMount]:
    container = {"name": "app", "volumeMounts": list(volume_mounts)}
    plans = container_mounts(container, SOURCES, privileged=privileged, expand=lambda t: t.replace("$(POD)", "web"))
    return [plan.mount for plan in plans]


def test_volume_mounts_bind_their_volumes_read_only_when_kube_would() -> None:
    found = mounts(
        {"name": "cfg", "mountPath": "/etc/app/"},
        {"name": "scratch", "mountPath": "/data", "subPathExpr": "$(POD)/cache"},
        {"name": "scratch", "mountPath": "/ro", "readOnly": True},
        {"name": "netns", "mountPath": "/var/run/netns", "mountPropagation": "HostToContainer"},
    )
    assert found == [
        VolumeMount(SOURCES["cfg"].path, "/etc/app", True, "rprivate"),
        VolumeMount(SOURCES["scratch"].path + "/web/cache", "/data", False, "rprivate"),
        VolumeMount(SOURCES["scratch"].path, "/ro", True, "rprivate"),
        VolumeMount("/run/netns", "/var/run/netns", False, "rslave"),
    ]


@pytest.mark.parametrize(
    ("mount", "message"),
    [
        ({"name": "nope", "mountPath": "/x"}, "names no volume"),
        ({"name": "scratch", "mountPath": "relative"}, "must be absolute"),
        ({"name": "scratch", "mountPath": "/x", "subPath": "../other-pod"}, "without '..'"),
        ({"name": "scratch", "mountPath": "/x", "subPath": "/etc"}, "relative path"),
        ({"name": "scratch", "mountPath": "/x", "subPathExpr": "$(POD)/../.."}, "without '..'"),
        (
            {"name": "netns", "mountPath": "/n", "mountPropagation": "Bidirectional"},
            "^Bidirectional mount propagation is available only to privileged containers$",
        ),
    ],
)
def test_volume_mounts_kube_would_refuse_are_refused(mount: dict[str, Any], message: str) -> None:
    with pytest.raises(VolumeError, match=message):
        mounts(mount)


def test_bidirectional_propagation_is_for_privileged_containers_and_makes_the_root_shared() -> None:
    (mount,) = mounts({"name": "netns", "mountPath": "/n", "mountPropagation": "Bidirectional"}, privileged=True)
    assert mount.propagation == "rshared"
    paths = BundlePaths("c", "/run/netns/p", "/lab/pods/u/serviceaccount", "/ab", volume_mounts=(mount,))
    p = {"metadata": {"name": "p"}, "spec": {}}
    container = {"name": "app", "securityContext": {"privileged": True}}
    config = container_config(p, container, ProcessSpec(("true",), {}), paths)
    assert config["linux"]["rootfsPropagation"] == "rshared"
    assert config["mounts"][-1] == {
        "destination": "/n",
        "type": "bind",
        "source": "/run/netns",
        "options": ["rbind", "rw", "rshared"],
    }


def test_volumes_are_bound_after_the_masks_parents_first_and_may_replace_the_token_mount() -> None:
    volume_mounts = (
        VolumeMount("/lab/v/deep", "/etc/app/conf.d", True),
        VolumeMount("/lab/v/sa", SERVICE_ACCOUNT_DIR, True),
        VolumeMount("/lab/v/top", "/etc/app", False),
    )
    paths = BundlePaths("c", "", "/lab/pods/u/serviceaccount", "/ab", masked=("/lab",), volume_mounts=volume_mounts)
    config = container_config({"metadata": {"name": "p"}, "spec": {}}, {"name": "a"}, ProcessSpec(("x",), {}), paths)
    destinations = [m["destination"] for m in config["mounts"]]
    assert destinations.index("/lab") < destinations.index("/etc/app") < destinations.index("/etc/app/conf.d")
    assert destinations.count(SERVICE_ACCOUNT_DIR) == 1
    sa = next(m for m in config["mounts"] if m["destination"] == SERVICE_ACCOUNT_DIR)
    assert sa["source"] == "/lab/v/sa" and "ro" in sa["options"]
    assert "rootfsPropagation" not in config["linux"]


def test_a_missing_mount_point_rebuilds_its_directory_as_a_tmpfs_of_bound_entries() -> None:
    rebuilt = (
        MountPointDir("/etc", (("hosts", False), ("ssl", True))),
        MountPointDir("/", (("bin", True), ("etc", True), ("proc", True), ("usr", True))),
    )
    mounts = (VolumeMount("/lab/v/cfg", "/etc/app", True), VolumeMount("/lab/v/bin", "/host/opt/cni/bin", True))
    paths = BundlePaths(
        "c", "/run/netns/p", "/sa", "/ab", masked=("/etc/ssl",), volume_mounts=mounts, mount_point_dirs=rebuilt
    )
    config = container_config({"metadata": {"name": "p"}, "spec": {}}, {"name": "a"}, ProcessSpec(("x",), {}), paths)
    shown = [(m["destination"], m["type"], tuple(m.get("options") or ())) for m in config["mounts"]]
    assert shown[0] == ("/", "tmpfs", ("mode=755", "size=1m"))
    assert shown[1:4] == [
        ("/bin", "bind", ("rbind", "rro")),
        ("/etc", "bind", ("rbind", "rro")),
        ("/usr", "bind", ("rbind", "rro")),
    ]
    assert shown[4][:2] == ("/etc", "tmpfs")
    assert shown[5:7] == [("/etc/hosts", "bind", ("bind", "ro")), ("/etc/ssl", "bind", ("rbind", "rro"))]
    destinations = [d for d, _, _ in shown]
    assert destinations.index("/etc/ssl") < len(destinations) - 1 - destinations[::-1].index("/etc/ssl")  # masked after
    assert destinations.index("/proc") > 6 and config["root"]["readonly"] is True
    assert destinations[-2:] == ["/etc/app", "/host/opt/cni/bin"]


def test_a_privileged_container_gets_the_capabilities_the_runtime_holds() -> None:
    """As containerd grants its own set: a machine whose bounding set lacks CAP_SYS_RESOURCE (bit 24) still runs
    privileged pods."""
    from ambit.lab.runtime.oci_spec import BundlePaths, ProcessSpec, capabilities_in, container_config

    held = capabilities_in("Name:\tx\nCapBnd:\t000001fffeffffff\n")
    assert held is not None and "CAP_SYS_RESOURCE" not in held and "CAP_SYS_ADMIN" in held
    assert capabilities_in("no such line") is None and capabilities_in("CapBnd:\tzz") is None
    pod = {"metadata": {"name": "p"}, "spec": {}}
    container = {"name": "c", "securityContext": {"privileged": True}}
    paths = BundlePaths("id", "", "/sa", "/lab", held_capabilities=held)
    caps = container_config(pod, container, ProcessSpec(("true",), {}), paths)["process"]["capabilities"]
    assert "CAP_SYS_RESOURCE" not in caps["bounding"] and "CAP_NET_ADMIN" in caps["bounding"]


def test_root_is_a_read_only_0755_view_holding_only_the_revealed_mount_points(tmp_path: Path) -> None:
    """runc gives a tmpfs the mode of what it covers (the machine's /root is 0700), so a non-root container could
    not reach an interpreter revealed under /root; the bound view is 0755 and holds nothing else."""
    import stat as stat_module

    from ambit.lab.runtime.oci_apply import prepare_root_view
    from ambit.lab.runtime.oci_spec import BundlePaths, ProcessSpec, container_config

    view = tmp_path / "rootview"
    paths = BundlePaths("id", "", "/sa", "/lab", revealed=("/root/.pyenv/versions/3.11.7",), root_view=str(view))
    config = container_config({"metadata": {"name": "p"}, "spec": {}}, {"name": "c"}, ProcessSpec(("true",), {}), paths)
    (root,) = [m for m in config["mounts"] if m["destination"] == "/root"]
    assert root["source"] == str(view) and "ro" in root["options"]
    prepare_root_view(view, config)
    assert stat_module.S_IMODE(view.stat().st_mode) == 0o755
    assert (view / ".pyenv" / "versions" / "3.11.7").is_dir()
    assert sorted(p.name for p in view.iterdir()) == [".pyenv"]


def test_a_volume_over_tmp_does_not_hide_an_interpreter_revealed_under_it() -> None:
    """A CI checkout lives under /tmp; the istiod and ztunnel pods mount an emptyDir at /tmp."""
    from ambit.lab.runtime.oci_spec import BundlePaths, ProcessSpec, VolumeMount, container_config

    venv = "/tmp/ci.x/ambit/.venv"
    paths = BundlePaths(
        "id", "", "/sa", "/lab", revealed=(venv, "/root/py"), volume_mounts=(VolumeMount("/lab/pods/u/tmp", "/tmp"),)
    )
    config = container_config({"metadata": {"name": "p"}, "spec": {}}, {"name": "c"}, ProcessSpec(("true",), {}), paths)
    order = [m["destination"] for m in config["mounts"]]
    assert order.index(venv, order.index("/tmp", order.index("/tmp") + 1)) > order.index(
        "/tmp", order.index("/tmp") + 1
    )
    assert order.count("/root/py") == 1


def test_mounts_nested_under_a_config_map_volume_get_their_mount_points_made_inside_it() -> None:
    # The node proxy's DaemonSet: the CRL ConfigMap under the root-cert ConfigMap, as in Istio's chart.
    mounts = [
        {"name": "root", "mountPath": "/var/run/secrets/istio"},
        {"name": "crl", "mountPath": "/var/run/secrets/istio/crl"},
        {"name": "deep", "mountPath": "/var/run/secrets/istio//a/./b/"},
        {"name": "writer", "mountPath": "/var/run/secrets/istio/..data/x"},
        {"name": "sibling", "mountPath": "/var/run/secrets/istio-other"},
    ]
    pod = {
        "spec": {
            "initContainers": [
                {"volumeMounts": [mounts[0], {"name": "i", "mountPath": "/var/run/secrets/istio/init"}]}
            ],
            "containers": [{"volumeMounts": mounts}, {"volumeMounts": [mounts[1]]}],
        }
    }
    assert nested_mount_points(pod, "root") == ("a/b", "crl", "init")
    assert nested_mount_points(pod, "crl") == ()
    assert nested_mount_points({"spec": {"containers": "junk"}}, "root") == ()

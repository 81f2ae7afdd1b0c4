"""User namespaces of lab pods (:mod:`ambit.lab.runtime.userns`, rule 13 of :mod:`ambit.lab.runtime.oci_spec`):
the allocator's rules, the saved form (hypothesis on its parser), and what a container's configuration becomes.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.lab.runtime.oci_spec import BundlePaths, ProcessSpec, SecurityContextError, container_config, container_id
from ambit.lab.runtime.userns import (
    USERNS_LENGTH,
    IdRange,
    UsernsAllocator,
    UsernsError,
    hosts_users,
    node_id_range,
    parse_saved,
    render_saved,
)

UID = "0d5c7e36-5b1e-4c61-9f0e-2f7e1a2b3c4d"
IDS = IdRange(5 * USERNS_LENGTH)
PATHS = BundlePaths(container_id(UID, "app"), "/run/netns/p", "/sa", "/ambit-x", shared_rootfs="/run/ambit-x-rootfs")


def pod(spec: dict[str, Any] | None = None, **container: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "web", "namespace": "default", "uid": UID},
        "spec": {"containers": [{"name": "app", **container}], **(spec or {})},
    }


def config_of(p: dict[str, Any], paths: BundlePaths = PATHS) -> dict[str, Any]:
    return container_config(p, p["spec"]["containers"][0], ProcessSpec(("sleep", "1"), {}), paths)


@pytest.mark.parametrize(("value", "hosts"), [(None, True), (True, True), (False, False), ("false", True)])
def test_only_host_users_false_asks_for_a_user_namespace(value: Any, hosts: bool) -> None:
    spec = {} if value is None else {"hostUsers": value}
    assert hosts_users({"spec": spec}) is hosts


def test_lab_nodes_get_disjoint_stretches_above_the_machine_s_own_ids() -> None:
    ranges = [node_id_range(i) for i in range(1, 64)]
    assert ranges[0] == (USERNS_LENGTH, 1024)
    for (first, blocks), (following, _) in itertools.pairwise(ranges):
        assert first % USERNS_LENGTH == 0 and first + blocks * USERNS_LENGTH == following
    last_first, last_blocks = ranges[-1]
    assert last_first + last_blocks * USERNS_LENGTH <= 2**32
    with pytest.raises(ValueError, match="no user namespace ids left"):
        node_id_range(64)


def test_each_pod_gets_its_own_block_the_same_again_and_a_freed_one_is_reused() -> None:
    allocator = UsernsAllocator(USERNS_LENGTH, 3)
    a, b = allocator.allocate("a"), allocator.allocate("b")
    assert (a.first, b.first) == (USERNS_LENGTH, 2 * USERNS_LENGTH)
    assert allocator.allocate("a") == a and allocator.find("a") == a
    allocator.allocate("c")
    with pytest.raises(UsernsError, match="all 3 ranges of this node are in use"):
        allocator.allocate("d")
    allocator.release("b")
    assert allocator.allocate("d") == b
    assert allocator.find("b") is None


def test_a_saved_block_is_taken_back_only_when_it_is_the_node_s_and_free() -> None:
    allocator = UsernsAllocator(USERNS_LENGTH, 4)
    allocator.restore("a", IdRange(3 * USERNS_LENGTH))
    assert allocator.find("a") == IdRange(3 * USERNS_LENGTH)
    allocator.restore("a", IdRange(3 * USERNS_LENGTH))  # idempotent
    assert allocator.allocate("b") == IdRange(USERNS_LENGTH)  # the lowest free one
    for ids, why in [
        (IdRange(3 * USERNS_LENGTH), "held by another pod"),
        (IdRange(9 * USERNS_LENGTH), "not one of this node's"),
        (IdRange(0), "not one of this node's"),
        (IdRange(USERNS_LENGTH + 5), "not one of this node's"),
        (IdRange(2 * USERNS_LENGTH, 10), "not one of this node's"),
    ]:
        with pytest.raises(UsernsError, match=why):
            allocator.restore("c", ids)
    with pytest.raises(UsernsError, match="held by another pod"):
        allocator.restore("a", IdRange(2 * USERNS_LENGTH))  # a pod holds one block


def test_the_saved_form_is_the_kubelet_s_and_round_trips() -> None:
    text = render_saved(IDS)
    assert json.loads(text) == {
        "uidMappings": [{"hostId": IDS.first, "containerId": 0, "length": 65536}],
        "gidMappings": [{"hostId": IDS.first, "containerId": 0, "length": 65536}],
    }
    assert parse_saved(text) == IDS


@pytest.mark.parametrize(
    "text",
    [
        "",
        "[]",
        '{"uidMappings": []}',
        '{"uidMappings": [{"hostId": 65536, "containerId": 0, "length": 65536}]}',
        '{"uidMappings": [{"hostId": 0, "containerId": 0, "length": 65536}],'
        ' "gidMappings": [{"hostId": 0, "containerId": 0, "length": 65536}]}',
        '{"uidMappings": [{"hostId": 65536, "containerId": 1, "length": 65535}],'
        ' "gidMappings": [{"hostId": 65536, "containerId": 1, "length": 65535}]}',
        '{"uidMappings": [{"hostId": 65536, "containerId": 0, "length": 65536}],'
        ' "gidMappings": [{"hostId": 131072, "containerId": 0, "length": 65536}]}',
        '{"uidMappings": [{"hostId": true, "containerId": 0, "length": 65536}],'
        ' "gidMappings": [{"hostId": 65536, "containerId": 0, "length": 65536}]}',
    ],
)
def test_a_saved_form_that_is_not_one_block_does_not_parse(text: str) -> None:
    with pytest.raises(UsernsError):
        parse_saved(text)


@given(
    st.text(max_size=300)
    | st.recursive(
        st.integers() | st.text(max_size=8),
        lambda x: (
            st.lists(x)
            | st.dictionaries(st.sampled_from(["uidMappings", "gidMappings", "hostId", "containerId", "length"]), x)
        ),
    ).map(json.dumps)
)
def test_the_saved_form_parser_returns_a_block_or_one_error(text: str) -> None:
    try:
        ids = parse_saved(text)
    except UsernsError:
        return
    assert ids.length == USERNS_LENGTH and ids.first % USERNS_LENGTH == 0 and ids.first > 0


# -- rule 13 ------------------------------------------------------------------------------------------------------
def test_a_container_in_a_user_namespace_gets_the_pod_s_maps_the_shared_root_and_the_runtime_s_sys() -> None:
    paths = dataclasses.replace(PATHS, user_namespace=IDS)
    config = config_of(pod({"hostUsers": False}), paths)
    linux = config["linux"]
    assert {"type": "user"} in linux["namespaces"]
    assert {"type": "network", "path": "/run/netns/p"} in linux["namespaces"]
    mapping = [{"containerID": 0, "hostID": IDS.first, "size": 65536}]
    assert linux["uidMappings"] == linux["gidMappings"] == mapping
    assert config["root"] == {"path": "/run/ambit-x-rootfs", "readonly": True}
    (sys_mount,) = [m for m in config["mounts"] if m["destination"] == "/sys"]
    assert sys_mount["type"] == "bind" and "rro" in sys_mount["options"]
    assert config["process"]["user"] == {"uid": 0, "gid": 0}  # ids inside the namespace
    assert "seccomp" in linux  # RuntimeDefault as for any other pod


def test_a_container_joins_the_pod_s_user_namespace_by_path_with_its_maps_stated() -> None:
    paths = dataclasses.replace(PATHS, user_namespace=IDS, user_namespace_path="/proc/7/fd/9")
    linux = config_of(pod({"hostUsers": False}), paths)["linux"]
    assert {"type": "user", "path": "/proc/7/fd/9"} in linux["namespaces"]
    assert [n for n in linux["namespaces"] if n["type"] == "user"] == [{"type": "user", "path": "/proc/7/fd/9"}]
    mapping = [{"containerID": 0, "hostID": IDS.first, "size": 65536}]
    assert linux["uidMappings"] == linux["gidMappings"] == mapping  # runc computes host ids from them


def test_without_a_user_namespace_nothing_changes() -> None:
    config = config_of(pod())
    assert {"type": "user"} not in config["linux"]["namespaces"] and "uidMappings" not in config["linux"]
    assert config["root"]["path"] == "rootfs"


@pytest.mark.parametrize(
    "security",
    [{"runAsUser": 65536}, {"runAsGroup": 70000}, {"runAsUser": 1000, "runAsGroup": 2**31 - 1}],
)
def test_ids_outside_the_user_namespace_are_a_config_error(security: dict[str, Any]) -> None:
    paths = dataclasses.replace(PATHS, user_namespace=IDS)
    with pytest.raises(SecurityContextError, match=r"hostUsers is false: id .* is outside the pod's user namespace"):
        config_of(pod({"hostUsers": False}, securityContext=security), paths)
    with pytest.raises(SecurityContextError, match="outside the pod's user namespace"):
        config_of(pod({"hostUsers": False, "securityContext": {"supplementalGroups": [65536]}}), paths)
    ok = pod({"hostUsers": False}, securityContext={"runAsUser": 65535, "runAsGroup": 1000})
    assert config_of(ok, paths)["process"]["user"] == {"uid": 65535, "gid": 1000}

"""The cluster IP allocator's state beside the store (ambit.apiserver.service_ips rules 1-5): the store's write is
the arbiter, reservations keep concurrent creates apart, a freed address comes back only after the cursor went
round, and a restart rebuilds the same holders; random create/delete/restart sequences against a reference model."""

from __future__ import annotations

import ipaddress
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.apiserver.errors import ApiError
from ambit.apiserver.service_ips import RESERVATION_SECONDS, ServiceIpAllocator
from ambit.apiserver.store import Store

SERVICES = ("", "services")
SMALL = "10.0.0.0/28"
"""14 hosts: .1 is kept for the API server (the tenth is kept only in ranges of more than 16), so 13 to hand out."""


def service(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default"}, "spec": {"ports": [{"port": 80}], **spec}}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "ips.db")
    yield s
    s.close()


def create(allocator: ServiceIpAllocator, store: Store, name: str, **spec: Any) -> str:
    svc = service(name, **spec)
    allocator.allocate(svc)
    store.put("ADDED", SERVICES, "default", name, svc)
    return str(svc["spec"]["clusterIP"])


def delete(store: Store, name: str) -> None:
    item = store.get(SERVICES, "default", name)
    assert item is not None
    store.remove(SERVICES, "default", name, item.obj)


def test_two_creates_allocated_before_either_is_stored_get_different_addresses(store: Store) -> None:
    allocator = ServiceIpAllocator(store, SMALL)
    first, second = service("a"), service("b")
    allocator.allocate(first)
    allocator.allocate(second)  # the first is still in admission
    assert first["spec"]["clusterIP"] == "10.0.0.2" and second["spec"]["clusterIP"] == "10.0.0.3"
    asked = service("c", clusterIP="10.0.0.2")
    with pytest.raises(ApiError, match="already allocated"):
        allocator.allocate(asked)  # reserved for "a"


def test_the_store_refuses_a_service_whose_address_another_holds_and_stores_nothing(store: Store) -> None:
    allocator = ServiceIpAllocator(store, SMALL)
    create(allocator, store, "a")
    version = store.resource_version
    thief = service("thief", clusterIP="10.0.0.2", clusterIPs=["10.0.0.2"])
    with pytest.raises(ApiError) as caught:
        store.put("ADDED", SERVICES, "default", "thief", thief)  # past the allocator: the store is the arbiter
    assert caught.value.code == 422 and "10.0.0.2 is already allocated" in caught.value.message
    assert store.get(SERVICES, "default", "thief") is None and store.resource_version == version
    same = store.get(SERVICES, "default", "a")
    assert same is not None
    store.put("MODIFIED", SERVICES, "default", "a", same.obj)  # its own address is its own


def test_a_reservation_whose_create_never_stored_ends_after_its_time(store: Store) -> None:
    clock = Clock()
    allocator = ServiceIpAllocator(store, "10.0.0.0/30", clock=clock)  # one address to hand out: 10.0.0.2
    allocator.allocate(service("dry-run"))
    with pytest.raises(ApiError, match="is full"):
        allocator.allocate(service("b"))
    clock.now += RESERVATION_SECONDS
    assert create(allocator, store, "b") == "10.0.0.2"


def test_a_freed_address_is_handed_out_again_only_after_the_cursor_went_round(store: Store) -> None:
    allocator = ServiceIpAllocator(store, SMALL)
    handed = [create(allocator, store, f"s{i}") for i in range(4)]
    assert handed == ["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"]
    delete(store, "s0")
    assert create(allocator, store, "s4") == "10.0.0.6"  # not 10.0.0.2, free since just now
    rest = [create(allocator, store, f"t{i}") for i in range(8)]
    assert rest[-1] == "10.0.0.14" and "10.0.0.2" not in rest
    assert create(allocator, store, "last") == "10.0.0.2"  # the range is used up: the freed address comes back
    with pytest.raises(ApiError, match="is full"):
        create(allocator, store, "one-too-many")


def test_a_restart_rebuilds_the_holders_and_goes_on_after_the_highest(tmp_path: Path) -> None:
    store = Store(tmp_path / "ips.db")
    allocator = ServiceIpAllocator(store, SMALL)
    for i in range(5):
        create(allocator, store, f"s{i}")
    delete(store, "s1")
    store.close()
    store = Store(tmp_path / "ips.db")
    try:
        allocator = ServiceIpAllocator(store, SMALL)
        assert create(allocator, store, "after") == "10.0.0.7"
        with pytest.raises(ApiError, match="already allocated"):
            create(allocator, store, "taken", clusterIP="10.0.0.4")
        assert create(allocator, store, "freed", clusterIP="10.0.0.3") == "10.0.0.3"  # asked for: fine
    finally:
        store.close()


def test_dual_stack_holds_one_address_per_family_and_frees_both(store: Store) -> None:
    allocator = ServiceIpAllocator(store, "10.0.0.0/28,fd00::/124")
    svc = service("dual", ipFamilyPolicy="RequireDualStack")
    allocator.allocate(svc)
    store.put("ADDED", SERVICES, "default", "dual", svc)
    assert svc["spec"]["clusterIPs"] == ["10.0.0.2", "fd00::2"]
    with pytest.raises(ApiError, match="already allocated"):
        create(allocator, store, "six", ipFamilies=["IPv6"], clusterIPs=["fd00::2"])
    delete(store, "dual")
    assert create(allocator, store, "six", ipFamilies=["IPv6"], clusterIPs=["fd00::2"]) == "fd00::2"


# -- against a reference model ------------------------------------------------------------------------------------

HANDED = [str(ipaddress.ip_address("10.0.0.0") + n) for n in range(2, 15)]
"""What SMALL hands out, in order."""


class Model:
    """Rule 4 with plain lists: the next free address after the last one handed out, cyclically."""

    def __init__(self) -> None:
        self.held: dict[str, str] = {}  # name -> address
        self.cursor = 0  # index into HANDED of the next candidate

    def restart(self) -> None:
        indexes = [HANDED.index(a) for a in self.held.values() if a in HANDED]
        self.cursor = (max(indexes) + 1) % len(HANDED) if indexes else 0

    def allocate(self) -> str | None:
        used = set(self.held.values())
        for step in range(len(HANDED)):
            i = (self.cursor + step) % len(HANDED)
            if HANDED[i] not in used:
                self.cursor = (i + 1) % len(HANDED)
                return HANDED[i]
        return None


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("create"), st.integers(0, 20), st.none()),
        st.tuples(st.just("ask"), st.integers(0, 20), st.sampled_from(HANDED)),
        st.tuples(st.just("delete"), st.integers(0, 20), st.none()),
        st.tuples(st.just("restart"), st.just(0), st.none()),
    ),
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(OPS)
def test_random_creates_deletes_and_restarts_follow_the_reference_model(ops: list[tuple[str, int, str | None]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ips.db"
        store = Store(path)
        allocator = ServiceIpAllocator(store, SMALL)
        model = Model()
        try:
            for op, n, asked in ops:
                name = f"s{n}"
                if op == "restart":
                    store.close()
                    store = Store(path)
                    allocator = ServiceIpAllocator(store, SMALL)
                    model.restart()
                elif op == "delete":
                    if name in model.held:
                        delete(store, name)
                        del model.held[name]
                elif name in model.held:
                    continue
                elif op == "ask":
                    assert asked is not None
                    if asked in model.held.values():
                        with pytest.raises(ApiError, match="already allocated"):
                            create(allocator, store, name, clusterIP=asked)
                    else:
                        assert create(allocator, store, name, clusterIP=asked) == asked
                        model.held[name] = asked
                else:
                    expected = model.allocate()
                    if expected is None:
                        with pytest.raises(ApiError, match="is full"):
                            create(allocator, store, name)
                    else:
                        assert create(allocator, store, name) == expected
                        model.held[name] = expected
                stored = {item.obj["metadata"]["name"]: item.obj["spec"]["clusterIP"] for item in store.items(SERVICES)}
                assert stored == model.held
                assert len(set(stored.values())) == len(stored)
                assert allocator.index.holders == {a: ("default", s) for s, a in stored.items()}
        finally:
            store.close()

"""ServiceEntry CIDR addresses (spec §4.1 ``NetworkAddress.length``; upstream "resolution none CIDR"): the model's
range VIPs, their text forms, and the longest-prefix VIP lookup of the workload state (rule 11 of
:mod:`ambit.model.state`) that the node proxy and the waypoint both use; and the node proxy's choice of endpoints
by capacity (a WorkloadEntry's ``weight``)."""

from __future__ import annotations

import ipaddress
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.model.errors import AddressError
from ambit.model.state import WorkloadState, choose_by_capacity
from ambit.model.workload import NetworkAddress, Service, Visibility, Workload


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


def service(name: str, *vips: str, namespace: str = "echo", visibility: Visibility = Visibility.PUBLIC) -> Service:
    return Service(
        name=name,
        namespace=namespace,
        hostname=f"{name}.example.com",
        vips=tuple(NetworkAddress.of_cidr("", v) for v in vips),
        visibility=visibility,
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("198.19.0.77/24", NetworkAddress("", ip("198.19.0.0"), 24)),
        ("198.19.0.77/32", NetworkAddress("", ip("198.19.0.77"))),
        ("198.19.0.77", NetworkAddress("", ip("198.19.0.77"))),
        ("fd00:19::5/64", NetworkAddress("", ip("fd00:19::"), 64)),
        ("0.0.0.0/0", NetworkAddress("", ip("0.0.0.0"), 0)),
    ],
)
def test_a_cidr_is_masked_as_istiod_masks_it(text: str, expected: NetworkAddress) -> None:
    assert NetworkAddress.of_cidr("", text) == expected
    assert NetworkAddress.parse(str(expected)) == expected


@pytest.mark.parametrize("text", ["198.19.0.0/33", "198.19.0.0/-1", "bogus/24", "fe80::/64%eth0", "1.2.3.4/24/8", ""])
def test_a_bad_cidr_is_one_clear_error(text: str) -> None:
    with pytest.raises(AddressError):
        NetworkAddress.of_cidr("", text)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60) | st.from_regex(r"[0-9./:a-f]{1,40}/[0-9]{1,3}", fullmatch=True))
def test_any_text_is_an_address_or_an_address_error(text: str) -> None:
    for read in (lambda t: NetworkAddress.of_cidr("", t), NetworkAddress.parse):
        try:
            value = read(text)
        except AddressError:
            continue
        assert NetworkAddress.parse(str(value)) == value


def test_the_longest_prefix_holding_an_address_wins_and_an_exact_vip_wins_over_any() -> None:
    state = WorkloadState()
    state.replace_all(
        [],
        [
            service("wide", "198.19.0.0/16"),
            service("narrow", "198.19.0.0/24"),
            service("exact", "198.19.0.77"),
            service("v6", "fd00:19::/64"),
        ],
    )

    def name(address: str) -> str | None:
        found = state.find_service_by_vip("", ip(address))
        return found.name if found else None

    assert name("198.19.0.77") == "exact"
    assert name("198.19.0.78") == "narrow"
    assert name("198.19.1.1") == "wide"
    assert name("198.20.0.1") is None
    assert name("fd00:19::abcd") == "v6"
    assert name("fd00:20::1") is None
    assert state.find_service_by_vip("other-network", ip("198.19.0.78")) is None
    state.remove_service("echo/narrow.example.com")
    assert name("198.19.0.78") == "wide"


def test_a_range_another_namespace_cannot_see_is_skipped_for_a_wider_one() -> None:
    state = WorkloadState()
    state.replace_all(
        [],
        [
            service("wide", "198.19.0.0/16"),
            service("private", "198.19.0.0/24", namespace="team", visibility=Visibility.NAMESPACE),
        ],
    )
    assert state.find_service_by_vip("", ip("198.19.0.5"), "team").name == "private"  # type: ignore[union-attr]
    assert state.find_service_by_vip("", ip("198.19.0.5"), "apps").name == "wide"  # type: ignore[union-attr]


# --- capacity (a WorkloadEntry's weight) -------------------------------------------------------------------------


def _endpoint(name: str, capacity: int) -> Workload:
    return Workload(uid=f"u/{name}", name=name, namespace="echo", addresses=(), capacity=capacity)


def test_endpoints_are_chosen_in_proportion_to_their_capacity() -> None:
    a, b, never = _endpoint("a", 1), _endpoint("b", 3), _endpoint("never", 0)
    draws = [i / 400 for i in range(400)]
    picks = Counter(choose_by_capacity([a, never, b], d).name for d in draws)
    assert picks == {"a": 100, "b": 300}


@given(st.lists(st.integers(0, 5), min_size=1, max_size=6), st.floats(0, 1, exclude_max=True))
def test_a_choice_is_always_one_of_the_candidates_and_never_a_zero_while_others_have_some(
    capacities: list[int], draw: float
) -> None:
    candidates = [_endpoint(str(i), c) for i, c in enumerate(capacities)]
    chosen = choose_by_capacity(candidates, draw)
    assert chosen in candidates
    assert chosen.capacity > 0 or sum(capacities) == 0


def test_a_shared_vip_answers_the_clients_own_namespace_first_as_ztunnel_does() -> None:
    state = WorkloadState()
    state.replace_all([], [service("entry", "198.19.0.10", namespace="apps"), service("svc", "198.19.0.10")])
    assert state.find_service_by_vip("", ip("198.19.0.10"), "apps").name == "entry"  # type: ignore[union-attr]
    assert state.find_service_by_vip("", ip("198.19.0.10"), "other").name == "svc"  # type: ignore[union-attr]
    assert state.find_service_by_vip("", ip("198.19.0.10")).name == "svc"  # type: ignore[union-attr]  # the latest


def test_a_range_of_the_clients_namespace_beats_a_longer_one_elsewhere() -> None:
    state = WorkloadState()
    state.replace_all([], [service("mine", "198.19.0.0/16", namespace="apps"), service("theirs", "198.19.0.0/24")])
    assert state.find_service_by_vip("", ip("198.19.0.5"), "apps").name == "mine"  # type: ignore[union-attr]
    assert state.find_service_by_vip("", ip("198.19.0.5"), "other").name == "theirs"  # type: ignore[union-attr]

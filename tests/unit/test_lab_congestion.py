"""The lab's congestion control (ambit.lab.network.congestion): a pacing default is replaced, nothing else is."""

from __future__ import annotations

from pathlib import Path

import pytest

from ambit.lab.network.congestion import lab_congestion_sysctls, machine_congestion_sysctls

ALL = ["reno", "cubic", "bbr", "dctcp"]


@pytest.mark.parametrize("default", ["cubic", "reno", "dctcp", "htcp", ""])
def test_a_default_that_does_not_pace_is_left_as_it_is(default: str) -> None:
    assert lab_congestion_sysctls(default, ALL) == ()


@pytest.mark.parametrize(
    ("available", "expected"),
    [
        (ALL, ("net.ipv4.tcp_congestion_control=cubic",)),
        (["reno", "bbr"], ("net.ipv4.tcp_congestion_control=reno",)),
        (["bbr"], ()),
    ],
)
def test_bbr_is_replaced_by_the_first_non_pacing_algorithm_the_kernel_has(
    available: list[str], expected: tuple[str, ...]
) -> None:
    assert lab_congestion_sysctls("bbr", available) == expected
    assert lab_congestion_sysctls("bbr3", available) == expected


def test_the_machine_is_read_from_proc_and_an_unreadable_one_sets_nothing(tmp_path: Path) -> None:
    assert machine_congestion_sysctls(tmp_path) == ()
    (tmp_path / "tcp_congestion_control").write_text("bbr\n")
    (tmp_path / "tcp_available_congestion_control").write_text("reno cubic bbr\n")
    assert machine_congestion_sysctls(tmp_path) == ("net.ipv4.tcp_congestion_control=cubic",)
    (tmp_path / "tcp_congestion_control").write_text("cubic\n")
    assert machine_congestion_sysctls(tmp_path) == ()

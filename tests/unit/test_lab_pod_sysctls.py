"""Which of a pod's ``securityContext.sysctls`` the lab sets in its network namespace (lab runtime sandbox)."""

from __future__ import annotations

from typing import Any

import pytest

from ambit.lab.runtime.sandbox import pod_sysctls


def pod(*sysctls: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "spec": {"securityContext": {"sysctls": list(sysctls)}}}


def test_the_gateway_template_s_unprivileged_ports_sysctl_is_set() -> None:
    assert pod_sysctls(pod({"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"})) == [
        "net.ipv4.ip_unprivileged_port_start=0"
    ]
    assert pod_sysctls(pod({"name": "net.ipv4.ping_group_range", "value": "0 2147483647"})) == [
        "net.ipv4.ping_group_range=0 2147483647"
    ]


@pytest.mark.parametrize(
    "item",
    [
        {"name": "kernel.shm_rmid_forced", "value": "1"},  # safe, but not the network namespace's
        {"name": "net.core.somaxconn", "value": "1024"},  # not a safe sysctl
        {"name": "net.ipv4.ip_unprivileged_port_start", "value": "0; reboot"},
        {"name": "net.ipv4.ip_unprivileged_port_start", "value": "-w kernel.panic=1"},
        {"name": "net.ipv4.ip_unprivileged_port_start", "value": 0},
        {"name": "net.ipv4.ip_unprivileged_port_start"},
        "net.ipv4.ip_unprivileged_port_start=0",
    ],
)
def test_anything_else_is_left_out(item: Any) -> None:
    assert pod_sysctls(pod(item)) == []


@pytest.mark.parametrize("spec", [None, {}, {"securityContext": None}, {"securityContext": {"sysctls": "x"}}])
def test_a_pod_without_sysctls_sets_none(spec: Any) -> None:
    assert pod_sysctls({"spec": spec}) == []

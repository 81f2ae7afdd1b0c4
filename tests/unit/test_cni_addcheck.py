"""The ``/cmdadd`` checks (ambit.cni.addcheck): the pure rule as a table, and the kernel probe on real files."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from ambit.cni.addcheck import (
    AddEventRefusedError,
    KernelNetnsProbe,
    NetnsFacts,
    check_add_event,
    resolved_dirs,
)

NODE = "node-1"
DIRS = ("/run/netns",)
HOST = (4, 1)
SANDBOX = NetnsFacts("/run/netns/p-web", True, (4, 100))


def pod(node: str | None = NODE) -> dict[str, Any]:
    spec = {} if node is None else {"nodeName": node}
    return {"metadata": {"namespace": "apps", "name": "web"}, "spec": spec}


def check(
    the_pod: dict[str, Any] | None = None,
    facts: NetnsFacts | None = SANDBOX,
    sandbox: NetnsFacts | None = SANDBOX,
) -> None:
    check_add_event(
        pod() if the_pod is None else the_pod,
        "/run/netns/p-web",
        node_name=NODE,
        netns_dirs=DIRS,
        facts=facts,
        forbidden=frozenset({HOST}),
        sandbox=sandbox,
    )


def test_the_pods_own_sandbox_on_this_node_is_accepted() -> None:
    check()
    check(sandbox=None)  # a runtime whose sandbox paths the agent cannot name: rules 1-4 still hold


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"the_pod": pod("node-2")}, "is on node node-2, not on this node node-1"),
        ({"the_pod": pod(None)}, "is on node (none)"),
        ({"facts": None}, "does not exist"),
        ({"facts": NetnsFacts("/proc/1/ns/net", True, HOST)}, "not in a pod sandbox netns directory"),
        ({"facts": NetnsFacts("/proc/77/ns/net", True, (4, 5))}, "not in a pod sandbox netns directory"),
        ({"facts": NetnsFacts("/run/netns/sub/x", True, (4, 5))}, "not in a pod sandbox netns directory"),
        ({"facts": NetnsFacts("/tmp/netns", True, (4, 5))}, "not in a pod sandbox netns directory"),
        ({"facts": NetnsFacts("/run/netns/file", False, (65024, 5))}, "is not a network namespace"),
        ({"facts": NetnsFacts("/run/netns/host", True, HOST), "sandbox": None}, "the host's or the node agent's"),
        ({"facts": NetnsFacts("/run/netns/p-db", True, (4, 101))}, "not this pod's sandbox network namespace"),
    ],
    ids=[
        "another-node",
        "unscheduled",
        "missing",
        "host-proc",
        "other-process",
        "nested",
        "elsewhere",
        "not-nsfs",
        "host-bind-mounted",
        "another-sandbox",
    ],
)
def test_a_cmdadd_that_is_not_this_pods_sandbox_on_this_node_is_refused(kwargs: dict[str, Any], why: str) -> None:
    with pytest.raises(AddEventRefusedError, match=why.replace("(", r"\(").replace(")", r"\)")):
        check(**kwargs)


def test_the_kernel_probe_tells_namespaces_from_files(tmp_path: Path) -> None:
    probe = KernelNetnsProbe()
    plain = tmp_path / "plain"
    plain.write_text("")
    facts = probe.inspect(str(plain))
    assert facts is not None and not facts.is_nsfs and facts.real_path == str(plain)
    assert probe.inspect(str(tmp_path / "absent")) is None
    own = probe.inspect(f"/proc/{os.getpid()}/ns/net")
    if own is not None:  # realpath of a magic link: never under a sandbox directory
        assert os.path.dirname(own.real_path) not in resolved_dirs(("/run/netns",))
    link = tmp_path / "link"
    link.symlink_to(plain)
    linked = probe.inspect(str(link))
    assert linked is not None and linked.real_path == str(plain)


def test_the_agents_own_namespace_is_forbidden() -> None:
    st = os.stat("/proc/self/ns/net")
    assert (st.st_dev, st.st_ino) in KernelNetnsProbe().forbidden()


def test_netns_directories_are_resolved_and_deduplicated(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "var-run").symlink_to(tmp_path / "run")
    got = resolved_dirs((str(tmp_path / "run"), str(tmp_path / "var-run")))
    assert got == (str(tmp_path / "run"),)

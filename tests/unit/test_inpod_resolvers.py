"""Which resolvers a pod's forwarded queries go to (:mod:`ambit.inpod.resolvers`), over a /proc tree made of files:
a process is the pod's when its ``ns/net`` has the namespace's device and inode."""

from __future__ import annotations

import os
from pathlib import Path

from ambit.dns.settings import Upstream
from ambit.inpod.resolvers import PodResolvers, find_pod_resolv_conf

FALLBACK = Upstream(("198.19.0.53",))


def process(proc: Path, pid: int, resolv_conf: str | None, netns_file: Path | None = None) -> tuple[int, int]:
    """A fake ``/proc/<pid>`` whose ``ns/net`` is ``netns_file`` (hard-linked: same inode) or a file of its own."""
    (proc / str(pid) / "ns").mkdir(parents=True)
    net = proc / str(pid) / "ns" / "net"
    if netns_file is None:
        net.write_text("")
    else:
        os.link(netns_file, net)
    if resolv_conf is not None:
        etc = proc / str(pid) / "root" / "etc"
        etc.mkdir(parents=True)
        (etc / "resolv.conf").write_text(resolv_conf)
    stat = net.stat()
    return stat.st_dev, stat.st_ino


def test_the_resolv_conf_of_a_process_in_the_pods_netns_is_found(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    process(proc, 10, "nameserver 198.19.9.9\n")
    netns = process(proc, 20, "nameserver 198.19.0.10\nsearch apps.svc.cluster.local\n")
    (proc / "self").mkdir()
    conf = find_pod_resolv_conf(netns, proc)
    assert conf is not None and conf.nameservers == ("198.19.0.10",)
    assert find_pod_resolv_conf((1, 2), proc) is None
    assert find_pod_resolv_conf(netns, tmp_path / "missing") is None


def test_a_process_without_a_readable_file_is_passed_over(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    netns = process(proc, 30, None)
    assert find_pod_resolv_conf(netns, proc) is None
    process(proc, 31, "nameserver 198.19.0.11\n", netns_file=proc / "30" / "ns" / "net")
    conf = find_pod_resolv_conf(netns, proc)
    assert conf is not None and conf.nameservers == ("198.19.0.11",)


async def test_the_pods_resolvers_are_cached_and_looked_up_again_after_refresh(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    netns = process(proc, 40, "nameserver 198.19.0.12\noptions timeout:9 attempts:3\n")
    now = [0.0]
    resolvers = PodResolvers(netns, FALLBACK, refresh=30.0, proc=proc, clock=lambda: now[0])
    first = await resolvers.upstream()
    assert first == Upstream(("198.19.0.12",), timeout=2.5, attempts=3)  # a try is capped at 2.5 s
    (proc / "40" / "root" / "etc" / "resolv.conf").write_text("nameserver 198.19.0.13\n")
    now[0] = 29.0
    assert await resolvers.upstream() == first
    now[0] = 31.0
    assert (await resolvers.upstream()).nameservers == ("198.19.0.13",)


async def test_without_the_pods_process_the_fallback_answers_and_proc_is_not_scanned_at_once_again(
    tmp_path: Path,
) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    now = [0.0]
    netns = (7, 7)
    resolvers = PodResolvers(netns, FALLBACK, proc=proc, clock=lambda: now[0])
    assert await resolvers.upstream() == FALLBACK
    real = process(proc, 50, "nameserver 198.19.0.14\n")
    resolvers = PodResolvers(real, FALLBACK, proc=proc, clock=lambda: now[0])
    (proc / "50" / "root" / "etc" / "resolv.conf").unlink()
    assert await resolvers.upstream() == FALLBACK
    (proc / "50" / "root" / "etc" / "resolv.conf").write_text("nameserver 198.19.0.14\n")
    now[0] = 0.5
    assert await resolvers.upstream() == FALLBACK  # missed half a second ago: no new scan yet
    now[0] = 1.5
    assert (await resolvers.upstream()).nameservers == ("198.19.0.14",)


async def test_explicit_upstreams_win(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    netns = process(proc, 60, "nameserver 198.19.0.15\n")
    resolvers = PodResolvers(netns, FALLBACK, explicit=True, proc=proc)
    assert await resolvers.upstream() == FALLBACK

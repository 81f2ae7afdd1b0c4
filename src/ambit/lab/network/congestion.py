"""TCP congestion control in the lab's namespaces: no pacing on a network that never leaves the machine.

Every link of a lab is a veth pair or the lab's bridge on one machine, so nothing on it can be congested. A new
network namespace takes the machine's default algorithm (``net.ipv4.tcp_congestion_control`` of the initial
namespace). Where that default paces, as ``bbr`` does, and the device has no ``fq`` qdisc, as a veth or ``lo``
never has, TCP paces every send itself with a timer: on a 2-vCPU machine with ``bbr`` as its default, one bulk
stream between two lab pods through the mesh moved about 1.7x as much with the lab's namespaces on ``cubic``, for
about 0.55x the node proxies' CPU per byte (docs/native-data-path.md, session 47). So the lab gives each pod's
namespace a non-pacing algorithm in that case. Node namespaces keep the machine's default: a node's kubelet reads
the default there (:func:`machine_congestion_sysctls` reads the calling process's namespace), and only control
traffic runs in them.

Rules (:func:`lab_congestion_sysctls`, pure):

1. A default that does not pace (``cubic``, ``reno``, ``dctcp``...) is left as it is: nothing is set, and no
   process is spawned for it.
2. A pacing default (:data:`PACING`) is replaced by the first of :data:`NON_PACING` the kernel has; if it has none,
   the default stays.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

PACING = frozenset({"bbr", "bbr2", "bbr3"})
"""Algorithms that ask TCP to pace their sends (Linux's ``bbr``; the out-of-tree BBR versions)."""
NON_PACING = ("cubic", "reno")
SYSCTL = "net.ipv4.tcp_congestion_control"
_PROC = Path("/proc/sys/net/ipv4")


def lab_congestion_sysctls(default: str, available: Iterable[str]) -> tuple[str, ...]:
    """The ``name=value`` to set in each lab namespace, given the machine's ``default`` and the ``available``
    algorithms; empty when there is nothing to change (rules 1 and 2)."""
    if default not in PACING:
        return ()
    offered = set(available)
    chosen = next((name for name in NON_PACING if name in offered), None)
    return () if chosen is None else (f"{SYSCTL}={chosen}",)


def machine_congestion_sysctls(proc: Path = _PROC) -> tuple[str, ...]:
    """:func:`lab_congestion_sysctls` for this machine, read from ``proc`` in the calling process's namespace (the
    initial one, or a node's, or a test's own: each keeps the default new namespaces take); empty if unreadable."""
    try:
        default = (proc / "tcp_congestion_control").read_text().strip()
        available = (proc / "tcp_available_congestion_control").read_text().split()
    except OSError:
        return ()
    return lab_congestion_sysctls(default, available)

"""May the node agent enrol this pod in this network namespace? The checks on a ``/cmdadd`` event.

Theory of operation: the plugin event socket is reached by whoever can write to it, and what it asks for is
powerful: the agent enters the named network namespace, writes redirection rules there and hands the node proxy a
handle to it. So the agent believes the event only as far as it can check it, against the API server and the
kernel, and refuses it otherwise (HTTP 403 with one line, which the plugin reports: the pod's ADD fails, as it
should). Rules, checked in this order, the first failure is the answer:

Rule 1. The pod (read from the informer cache or the API server, with the event's uid) is scheduled on this node:
        ``spec.nodeName`` is the agent's node.
Rule 2. The netns path exists and, with every symbolic link resolved, lies directly in one of the directories
        where pod sandboxes' namespaces are mounted (``/run/netns``, ``/var/run/netns`` or the runtime's own):
        ``/proc/1/ns/net``, ``/proc/<pid>/ns/net`` or a file elsewhere is refused whatever it is.
Rule 3. It is a network namespace: ``stat`` says it lives on nsfs (its device is that of ``/proc/self/ns/net``).
Rule 4. It is neither the host's (``/proc/1/ns/net``) nor the agent's own (the node's) network namespace.
Rule 5. When the runtime's sandbox namespace of this pod is known (the agent's ``netns_for``), the path is that
        same namespace (same device and inode): another pod's sandbox, on this node or another, is refused.

:func:`check_add_event` is the rule, pure: the kernel's answers come in as :class:`NetnsFacts` from a
:class:`NetnsProbe`; :class:`KernelNetnsProbe` is the real one (``os.stat``), tests use a table.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ambit.cni.enrolment import EnrolmentError

DEFAULT_NETNS_DIRS = ("/run/netns", "/var/run/netns")
"""Where ``ip netns`` (and so the lab's runtime, and CRI runtimes by default) mount pod sandboxes' namespaces."""

Inode = tuple[int, int]
"""(st_dev, st_ino): the identity of a namespace."""


class AddEventRefusedError(EnrolmentError):
    """The ``/cmdadd`` event names a pod or namespace the agent may not act on (HTTP 403)."""

    reason = "CmdAddRefused"
    retryable = False


@dataclass(frozen=True, slots=True)
class NetnsFacts:
    """What the kernel says of a path."""

    real_path: str
    """The path with every symbolic link resolved."""
    is_nsfs: bool
    """Whether the file lives on nsfs (a namespace file)."""
    inode: Inode


class NetnsProbe(Protocol):
    def inspect(self, path: str) -> NetnsFacts | None:
        """The facts of ``path``, or None when it does not exist or cannot be inspected."""
        ...

    def forbidden(self) -> frozenset[Inode]:
        """The namespaces no pod may be enrolled in: the host's and the agent's own."""
        ...


def check_add_event(
    pod: Mapping[str, Any],
    netns_path: str,
    *,
    node_name: str,
    netns_dirs: Iterable[str],
    facts: NetnsFacts | None,
    forbidden: frozenset[Inode],
    sandbox: NetnsFacts | None,
) -> None:
    """Rules 1-5 of the module docstring; :class:`AddEventRefusedError` naming the first that fails."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    who = f"pod {meta.get('namespace')}/{meta.get('name')}"
    on = spec.get("nodeName") or ""
    if on != node_name:
        raise AddEventRefusedError(f"{who} is on node {on or '(none)'!s}, not on this node {node_name}")
    if facts is None:
        raise AddEventRefusedError(f"{who}: netns {netns_path} does not exist or cannot be inspected")
    directory = os.path.dirname(facts.real_path)
    if directory not in set(netns_dirs):
        raise AddEventRefusedError(f"{who}: netns {netns_path} is not in a pod sandbox netns directory")
    if not facts.is_nsfs:
        raise AddEventRefusedError(f"{who}: {netns_path} is not a network namespace")
    if facts.inode in forbidden:
        raise AddEventRefusedError(f"{who}: {netns_path} is the host's or the node agent's own network namespace")
    if sandbox is not None and sandbox.inode != facts.inode:
        raise AddEventRefusedError(f"{who}: {netns_path} is not this pod's sandbox network namespace")


class KernelNetnsProbe:
    """:class:`NetnsProbe` by ``os.stat``: nsfs files share the device of ``/proc/self/ns/net``."""

    def inspect(self, path: str) -> NetnsFacts | None:
        try:
            real = os.path.realpath(path, strict=True)
            st = os.stat(real)
            nsfs = os.stat("/proc/self/ns/net").st_dev
        except (OSError, ValueError):
            return None
        return NetnsFacts(real, st.st_dev == nsfs and stat.S_ISREG(st.st_mode), (st.st_dev, st.st_ino))

    def forbidden(self) -> frozenset[Inode]:
        found = set()
        for path in ("/proc/1/ns/net", "/proc/self/ns/net"):
            try:
                st = os.stat(path)
            except OSError:  # an unprivileged agent cannot stat pid 1's: rule 2 refuses that path anyway
                continue
            found.add((st.st_dev, st.st_ino))
        return frozenset(found)


def resolved_dirs(dirs: Iterable[str]) -> tuple[str, ...]:
    """The directories with their symbolic links resolved (``/var/run`` is usually ``/run``)."""
    return tuple(dict.fromkeys(os.path.realpath(d) for d in dirs))

"""Naming a pod's network namespace the way :mod:`ambit.redirect.apply` wants it.

The redirect procedures address a namespace by *name*: ``ip netns exec NAME ...`` and ``ip -n NAME ...``, which
only work for namespaces bind-mounted under ``/run/netns`` (``/var/run/netns`` is the same directory). The CNI
runtime and the lab give us a *path*. A path in that directory is used by its name; any other path
(``/proc/<pid>/ns/net``, a runtime's private directory) is reached through a
:class:`~ambit.commands.RewritingRunner` whose rewrite (:func:`nsenter_argv`) turns those two command shapes into
``nsenter --net=PATH ...`` and passes every other command through unchanged.
"""

from __future__ import annotations

import functools
import os.path
from collections.abc import Sequence

from ambit.commands import CommandRunner, RewritingRunner

NETNS_DIRS = ("/run/netns", "/var/run/netns")
PLACEHOLDER = "ambit-netns-by-path"
"""The name handed to the redirect procedures when the namespace is reached by path; never a real name."""


def netns_name(path: str) -> str | None:
    """The ``ip netns`` name of ``path``, or None when ``path`` is not directly under ``/run/netns``."""
    directory, name = os.path.split(os.path.normpath(path))
    return name if directory in NETNS_DIRS and name else None


def target(path: str, runner: CommandRunner) -> tuple[str, CommandRunner]:
    """``(name, runner)`` to pass to the redirect procedures for the namespace at ``path``."""
    name = netns_name(path)
    if name is not None:
        return name, runner
    return PLACEHOLDER, RewritingRunner(runner, functools.partial(nsenter_argv, path=path))


def nsenter_argv(argv: Sequence[str], path: str) -> tuple[str, ...]:
    """Rewrite ``ip netns exec PLACEHOLDER cmd`` and ``ip ... -n PLACEHOLDER ...`` to run in ``path`` by nsenter."""
    args = tuple(argv)
    enter = ("nsenter", f"--net={path}")
    if args[:4] == ("ip", "netns", "exec", PLACEHOLDER):
        return (*enter, *args[4:])
    if args[:1] == ("ip",):
        for i in range(1, len(args) - 1):
            if args[i] == "-n" and args[i + 1] == PLACEHOLDER:
                return (*enter, *args[:i], *args[i + 2 :])
    return args

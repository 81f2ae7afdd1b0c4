"""The node's tree made ready to show :mod:`ambit.lab.runtime.node_view`: mount points and links, made safely.

Theory of operation. :func:`prepare_node_view` reads which system directories the machine has (rule 2 of
:mod:`ambit.lab.runtime.node_view`), plans the view, and makes in the node's tree the directories the binds are
mounted on and the links that stand for the machine's. Pods may write in the tree (a hostPath volume is writable),
so a pod may have put a link where a directory is expected: every step goes through directory descriptors opened
with ``O_NOFOLLOW`` below the tree's own, so nothing is ever made outside the tree.

Rules:
1. A bind whose mount point cannot be made as a directory (something else, or a link, is in the way) is left out
   of the view and logged; the rest of the view stands.
2. A link is made only where nothing is; a link already there with the same target is kept; anything else there is
   left alone (the pod's tree is the pod's) and logged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Iterator

from ambit.lab.network.topology import HostPathLayout
from ambit.lab.runtime.node_view import SYSTEM_DIRS, NodeView, plan_node_view

log = logging.getLogger("ambit.lab.node_view")

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def system_entries(root: str = "/") -> dict[str, str | None]:
    """Which of :data:`SYSTEM_DIRS` the machine has: the link target of a link, None for a directory."""
    found: dict[str, str | None] = {}
    for path in SYSTEM_DIRS:
        machine = os.path.join(root, path.lstrip("/"))
        if os.path.islink(machine):
            found[path] = os.readlink(machine)
        elif os.path.isdir(machine):
            found[path] = None
    return found


def prepare_node_view(layout: HostPathLayout) -> NodeView:
    """Plan the view of ``layout``'s tree and make its mount points and links (rules 1 and 2)."""
    view = plan_node_view(layout, system_entries())
    layout.root.mkdir(parents=True, exist_ok=True)
    binds = tuple(b for b in view.binds if _make_directory(str(layout.root), b.node_path))
    for link in view.links:
        _make_link(str(layout.root), link.node_path, link.target)
    return dataclasses.replace(view, binds=binds)


@contextlib.contextmanager
def _opened(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


def _walk(root: str, parts: list[str]) -> int:
    """A descriptor of ``root/parts...``, each directory made (0755) when missing; OSError when one is not a
    directory (a link included)."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in parts:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=fd)
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _make_directory(root: str, node_path: str) -> bool:
    parts = [p for p in node_path.split("/") if p]
    try:
        with _opened(_walk(root, parts)):
            return True
    except OSError as exc:
        log.warning("node view: %s is not shown: its mount point cannot be made (%s)", node_path, exc.strerror)
        return False


def _make_link(root: str, node_path: str, target: str) -> None:
    *parents, name = [p for p in node_path.split("/") if p]
    try:
        with _opened(_walk(root, parents)) as fd:
            try:
                os.symlink(target, name, dir_fd=fd)
            except FileExistsError:
                try:
                    found = os.readlink(name, dir_fd=fd)
                except OSError:
                    found = None
                if found != target:
                    log.warning("node view: %s is left as the node's tree has it (not a link to %s)", node_path, target)
    except OSError as exc:
        log.warning("node view: link %s -> %s cannot be made (%s)", node_path, target, exc.strerror)

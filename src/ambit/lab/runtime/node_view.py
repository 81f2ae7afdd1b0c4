"""A node's root as a hostPath volume shows it: the node's own tree, with what a cluster node's root would hold.

Theory of operation. A hostPath volume names a path of the node; :class:`ambit.lab.network.topology.HostPathLayout`
maps it into the machine: most paths into the node's private tree ``<lab>/nodes/<node>/root``, a few (the CNI
directories, the netns directory) elsewhere. A volume of ``/`` (``kubectl debug node/N`` mounts one at ``/host``),
or of any directory above one of those few (``/etc``, ``/var/run``), would show the bare tree: no CNI configuration,
no network namespaces, no programs for ``chroot /host``. :func:`plan_node_view` says what else such a volume shows,
and :func:`view_mounts` turns one container's mounts of the tree into the extra bind mounts that show it; the shell
(:func:`ambit.lab.runtime.volumes_apply.prepare_node_view`) makes their mount points in the tree.

Rules:
1. The node's paths that the layout maps outside its tree (``/etc/cni/net.d``, ``/opt/cni/bin``, ``/run/netns``,
   ``/var/run/netns``) are bound where the tree has them, writable, as a hostPath volume of that very path would
   be. The machine's ``/proc``, ``/sys`` and ``/dev`` are not: a view of the node's root never reaches the
   machine's processes or devices (``chroot /host`` finds none; the container's own ``/proc`` is outside).
2. For ``chroot /host CMD``: each system directory of the machine (:data:`SYSTEM_DIRS`) that is a real directory is
   bound read-only, recursively (``rro``: a mount below it is read-only too). The containers' root is the
   machine's, read-only, so nothing new is shown. One that is a relative symbolic link without ``..`` (``/bin ->
   usr/bin`` on a merged-``/usr`` system) is made the same link in the tree. A system directory with a path the
   containers must not see (a mask) at or beneath it is left out.
3. A mount of the tree whose source is the tree's directory ``D`` gets rule 1's and 2's binds below ``D``, at the
   mount's destination joined with their path below ``D``, with the mount's propagation, read-only when either is.
   A mount of anything else is unchanged.
4. Everything else of a node's root is the tree itself: ``/var/run/istio-cni`` (the CNI plugin's kubeconfig),
   local-path volumes, the seccomp profiles. Pod logs are not in it (``/var/log/pods`` is empty): they live in the
   runtime's private pod directories, with the pods' tokens, and are read through ``kubectl logs``.
5. ``hostPID`` and ``hostIPC`` (which ``kubectl debug node`` sets) give the container its own PID and IPC
   namespaces, as every lab container has: a lab node is a network namespace and a tree, with no PID namespace of
   its own, and the machine's would show every process of the machine. ``hostNetwork`` is the node's network
   namespace.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ambit.lab.network.topology import NETNS_HOST_PATHS, HostPathLayout
from ambit.lab.runtime.oci_spec import VolumeMount

CNI_PATHS = ("/etc/cni/net.d", "/opt/cni/bin")
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""What ``chroot`` needs of a root to run the machine's programs."""


@dataclass(frozen=True, slots=True)
class ViewBind:
    """A machine directory shown at ``node_path`` of the node's root."""

    node_path: str
    machine_path: str
    read_only: bool


@dataclass(frozen=True, slots=True)
class ViewLink:
    """A symbolic link made at ``node_path`` of the node's tree (rule 2)."""

    node_path: str
    target: str


@dataclass(frozen=True, slots=True)
class NodeView:
    """What the tree at ``root`` (a machine path) shows besides itself."""

    root: str
    binds: tuple[ViewBind, ...] = ()
    links: tuple[ViewLink, ...] = ()


def plan_node_view(layout: HostPathLayout, system: Mapping[str, str | None]) -> NodeView:
    """Rules 1 and 2; ``system`` maps each of :data:`SYSTEM_DIRS` the machine has to its link target (None: a real
    directory)."""
    binds = [ViewBind(path, str(layout.map(path).machine_path), False) for path in (*CNI_PATHS, *NETNS_HOST_PATHS)]
    links: list[ViewLink] = []
    for path in SYSTEM_DIRS:
        if path not in system:
            continue
        target = system[path]
        if target is None:
            binds.append(ViewBind(path, path, True))
        elif not target.startswith("/") and ".." not in target.split("/"):
            links.append(ViewLink(path, target))
    return NodeView(str(layout.root), tuple(binds), tuple(links))


def view_mounts(
    mounts: tuple[VolumeMount, ...], view: NodeView | None, masked: Iterable[str] = ()
) -> tuple[VolumeMount, ...]:
    """Rule 3: ``mounts`` and, after them, the binds that show ``view`` in those that mount its tree; a read-only
    machine directory with one of ``masked`` at or beneath it is left out (rule 2)."""
    if view is None or not view.binds:
        return mounts
    hidden = tuple(masked)
    extra: list[VolumeMount] = []
    for mount in mounts:
        source = mount.source.rstrip("/")
        if not _within(source, view.root):
            continue
        below = source[len(view.root.rstrip("/")) :]  # "" for the root, "/etc" for the tree's /etc
        for bind in view.binds:
            if not _within(bind.node_path, below or "/") or bind.node_path == below:
                continue
            if bind.read_only and any(_within(m, bind.machine_path) for m in hidden):
                continue
            rest = bind.node_path[len(below) :] if below else bind.node_path
            destination = mount.destination.rstrip("/") + rest
            read_only = mount.read_only or bind.read_only
            extra.append(VolumeMount(bind.machine_path, destination, read_only, mount.propagation, bind.read_only))
    return (*mounts, *extra)


def _within(path: str, directory: str) -> bool:
    """Whether ``path`` is ``directory`` or below it."""
    base = directory.rstrip("/")
    return path in (directory, base) or path.startswith(base + "/")

"""The OCI runtime configuration (runc's ``config.json``) of one lab container, computed from its pod (pure).

There are no images: a container's root is this machine's ``/``, seen read-only, with the lab's secrets hidden. The
shell (:mod:`ambit.lab.runtime.oci_apply`) writes what :func:`container_config` returns into the container's bundle
and runs ``runc run`` on it.

Rule 1. Namespaces: the pod's network namespace joined by path (none named: the runtime's own, for
        ``hostNetwork``), and a mount, PID, IPC and UTS namespace of the container's own; the hostname is the
        pod's name.
Rule 2. Root: the bundle's empty ``rootfs`` directory with the host's ``/`` bind-mounted on it recursively
        read-only (``rbind`` + ``rro``); ``root.readonly`` is always true: every container has a read-only root.
        Then runc's usual ``/proc``, ``/dev``, ``/dev/pts``, ``/dev/shm`` (writable), ``/dev/mqueue`` and
        ``/sys`` (read-only; the runtime's own, bound, when the pod shares the runtime's network namespace, as a
        new sysfs needs its own), a private writable ``/tmp`` and ``/run`` (tmpfs; ``/var/run`` is a link to
        ``/run``), and ``/root`` empty: a read-only 0755 directory of the bundle holding only mount points
        (``paths.root_view``), else a tmpfs. They stand for an image's own writable directories, so with the
        container's ``readOnlyRootFilesystem: true`` the ``/tmp``, ``/run`` and ``/root`` tmpfs are read-only as
        an image's root would be (runc makes them read-only after the mounts below them are made), except one a
        volume is mounted on (rule 10): runc's late remount would make the volume read-only instead, and the
        volume is writable as under kube. ``/dev/shm`` stays writable, as under containerd (the
        pod's shared memory is not the root filesystem).
Rule 3. Masks: each of ``paths.masked`` (the lab's directory with the API server's data, every pod's token, the
        lab CA and node proxy credentials; the checkout's git metadata; ...) is covered by an empty read-only
        tmpfs (a directory) or ``/dev/null`` (a file). Masks under ``/tmp``, ``/run`` or ``/root`` are already
        hidden and are left out. ``paths.revealed`` (the interpreter's installation when it lives under
        ``/root``, or under a directory other users cannot enter, itself masked) are bound back read-only after
        the masks, and again after a volume mounted over them (an emptyDir at ``/tmp`` over a checkout under
        ``/tmp``). A mask with a revealed path beneath it is a read-only view (``paths.views``) holding only the
        mount points of what is revealed, 0755 whatever the mode of the directory it covers.
Rule 4. Service account: unless the pod's ``automountServiceAccountToken`` is false, the pod's
        ``serviceaccount`` directory (``token``, ``ca.crt``, ``namespace``) is bound read-only at
        ``/var/run/secrets/kubernetes.io/serviceaccount``. It is a directory, not the files, so a refreshed token
        (written by rename) is seen at once.
Rule 5. Identity: ``runAsUser``/``runAsGroup``/``runAsNonRoot`` come from the container's ``securityContext``,
        else the pod's; without an image the user is 0 and the group 0. ``runAsNonRoot`` with user 0 is a
        :class:`SecurityContextError` with the kubelet's messages. ``supplementalGroups`` and ``fsGroup`` of
        the pod are additional groups.
Rule 6. Capabilities: containerd's default set (:data:`DEFAULT_CAPABILITIES`), minus ``drop`` (``ALL`` drops
        every one), plus ``add`` (``ALL`` adds every one); bounding, effective and permitted are that set,
        inheritable and ambient are empty (a non-root user keeps none after exec, as under containerd). An
        unknown capability is a :class:`SecurityContextError`.
Rule 7. ``privileged``: every capability the runtime holds (as containerd grants its own set), no masked or
        read-only paths of runc's defaults, ``/sys`` writable.
        The lab's own masks (rule 3) stay, but a privileged container may unmount them: privileged is host root.
        ``noNewPrivileges`` is set exactly when ``allowPrivilegeEscalation`` is false (and not privileged).
Rule 8. Limits: ``resources.limits.memory`` is the memory limit (bytes), ``limits.cpu`` a CFS quota over a
        100 ms period, ``requests.cpu`` the CPU shares (kubelet's ``milli * 1024 / 1000``, at least 2), and every
        container gets ``paths.pids_limit``. The cgroup is ``<paths.cgroup_parent>/<container id>``; resources
        of ``paths.unavailable`` controllers are left out (the shell logs which). A malformed quantity is a
        :class:`SecurityContextError` (kube's validation would have refused it).
Rule 9. The process: ``argv``, ``env`` and ``cwd`` as given (``workingDir``, else ``/``); no terminal.
Rule 10. Volumes (``paths.volume_mounts``, from :mod:`ambit.lab.runtime.volumes`) are bind mounts made after the
        masks, so a volume whose directory is under a masked path (the lab's) is still reachable at its
        ``mountPath``; parents before children (by depth of the destination). ``ro`` when read-only; their
        propagation is ``rprivate``, ``rslave`` or ``rshared``, and the root's propagation becomes ``rshared``
        or ``rslave`` when a mount needs it. A volume mounted at the service-account path replaces rule 4's.
Rule 11. Mount points: a ``mountPath`` the host's read-only root lacks (``/host/opt/cni/bin``) cannot be made in
        it. Each directory of ``paths.mount_point_dirs`` (the deepest existing ancestor of such a path, found by
        the shell) becomes a container-private tmpfs with each of the host's entries of that directory bound back
        read-only (following links: ``/bin`` is then the host's ``/usr/bin``), so runc can make the mount point
        there. For ``/`` the tmpfs is the root itself (read-only once runc is done) and the entries rule 2 mounts
        anyway (``proc``, ``dev``, ``sys``, ``tmp``, ``run``, ``root``) are left out; parents come before children,
        all before the masks.
Rule 12. seccomp (:mod:`ambit.lab.runtime.seccomp`): the container's ``seccompProfile``, else the pod's, else
        ``RuntimeDefault`` (the lab's kubelet runs with ``--seccomp-default``); none for a privileged container.
        ``RuntimeDefault`` allows the calls of the capabilities in the bounding set of rule 6/7. A ``Localhost``
        profile's file comes in ``paths.seccomp_localhost``; a bad field is a :class:`SecurityContextError`, a bad
        file a :class:`~ambit.lab.runtime.seccomp.SeccompProfileError` (``CreateContainerError``).
Rule 13. User namespace (``paths.user_namespace``, :mod:`ambit.lab.runtime.userns`): a ``user`` namespace with the
        pod's block as uid and gid maps, so the user of rule 5 is an id inside it (0 to 65535, else a
        :class:`SecurityContextError`) and capabilities count in it only. The pod's own user namespace, the one
        owning its network namespace, is joined by path (``paths.user_namespace_path``, with the same maps
        stated), so every container of the pod shares it and ``runc exec`` can enter the pod; without a path
        (a network namespace the host owns) each container makes its own with the same maps. The host's files
        keep their owners: root's show as ``nobody`` and are read through their "other" bits, never written.
        runc 1.1 has no idmapped mounts, so two things change: runc, which then makes the mounts from inside
        the namespace, needs a root it can reach (``paths.shared_rootfs``, an empty directory with every parent
        searchable: the bundle's is in the lab's 0700 tree; each container binds it privately, so one serves
        all), and ``/sys`` is the runtime's, bound read-only (a new sysfs needs a network namespace owned by the
        user namespace, which a sandbox made by the host does not have).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from ambit.errors import AmbitError
from ambit.lab.runtime.seccomp import Machine, SeccompFieldError, seccomp_choice, seccomp_config
from ambit.lab.runtime.userns import IdRange, UsernsError
from ambit.model import quantity
from ambit.model.errors import QuantityError

OCI_VERSION = "1.0.2"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
CPU_PERIOD = 100_000
"""Microseconds per CFS period (the kubelet's)."""
PRIVATE_DIRS = ("/tmp", "/run", "/root")
"""Replaced by tmpfs in every container (rule 2): masks under them are redundant."""

DEFAULT_CAPABILITIES = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
)
"""containerd's default capabilities, in its order."""

ALL_CAPABILITIES = (
    *DEFAULT_CAPABILITIES,
    "CAP_DAC_READ_SEARCH",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_LEASE",
    "CAP_AUDIT_CONTROL",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
)

RUNC_MASKED_PATHS = (
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/sys/firmware",
    "/proc/scsi",
)
RUNC_READONLY_PATHS = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")


class SecurityContextError(AmbitError):
    """The container cannot run as its pod asks (the kubelet's CreateContainerConfigError)."""


@dataclass(frozen=True, slots=True)
class VolumeMount:
    """A volume bound into a container (rule 10)."""

    source: str
    """The machine path (the volume's directory, or a sub-path of it)."""
    destination: str
    read_only: bool = False
    propagation: str = "rprivate"
    """``rprivate``, ``rslave`` or ``rshared``."""
    recursive_read_only: bool = False
    """Read-only down to the mounts below the source too (``rro``), for a machine directory shown to a pod."""


@dataclass(frozen=True, slots=True)
class MountPointDir:
    """A host directory rebuilt as a tmpfs for mount points (rule 11): its entries, and which are directories."""

    path: str
    entries: tuple[tuple[str, bool], ...]


@dataclass(frozen=True, slots=True)
class BundlePaths:
    """Where things are on this machine, for one container."""

    container_id: str
    netns_path: str
    """``/run/netns/<name>`` of the pod; empty: the runtime's own network namespace (``hostNetwork``)."""
    service_account_dir: str
    """The pod's directory holding ``token``, ``ca.crt`` and ``namespace`` (rule 4)."""
    cgroup_parent: str
    """The lab's cgroup, e.g. ``/ab12cd``: containers are ``<parent>/<container id>`` in every controller."""
    masked: tuple[str, ...] = ()
    masked_files: frozenset[str] = frozenset()
    """Those of ``masked`` that are files (covered with ``/dev/null``, not a tmpfs)."""
    revealed: tuple[str, ...] = ()
    pids_limit: int = 4096
    unavailable: frozenset[str] = field(default_factory=frozenset)
    """cgroup controllers this machine lacks (``memory``, ``cpu``, ``pids``)."""
    volume_mounts: tuple[VolumeMount, ...] = ()
    """The container's volumes (rule 10)."""
    mount_point_dirs: tuple[MountPointDir, ...] = ()
    """Host directories rebuilt so that volumes' mount points can be made (rule 11)."""
    held_capabilities: frozenset[str] | None = None
    """The capabilities the runtime itself holds (None: all); a privileged container gets these (rule 7)."""
    machine: Machine = field(default_factory=Machine)
    """The architecture and kernel a seccomp filter is built for (rule 12)."""
    seccomp_localhost: bytes | None = None
    """The file a ``Localhost`` seccomp profile names, read by the shell from the node's seccomp directory."""
    user_namespace: IdRange | None = None
    """The pod's host ids when it has a user namespace (``hostUsers: false``, rule 13)."""
    user_namespace_path: str = ""
    """The pod's user namespace to join (the one owning its network namespace, rule 13); empty: a new one."""
    shared_rootfs: str = ""
    """An empty directory, 0755 up to ``/``, used as the root of containers in a user namespace (rule 13)."""
    root_view: str = ""
    """A host directory (0755, holding only the mount points of what is revealed under ``/root``) bound read-only
    over ``/root``; empty: a tmpfs. runc gives a tmpfs the mode of the directory it covers, and the machine's
    ``/root`` is 0700, so only the bound directory lets a non-root container reach an interpreter revealed there."""
    views: str = ""
    """A host directory holding, for each masked directory with something revealed beneath it, a view of it like
    :attr:`root_view` (:func:`view_source`), bound read-only over it: a checkout in a 0700 directory other than
    ``/root``. Empty: such a mask is a writable tmpfs, which a non-root container cannot enter when the directory it
    covers is 0700."""


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str = ""


@dataclass(frozen=True, slots=True)
class SecurityView:
    """The security context in effect (rules 5 to 7), from the pod's and the container's."""

    uid: int
    gid: int
    additional_gids: tuple[int, ...]
    privileged: bool
    capabilities: tuple[str, ...]
    no_new_privileges: bool
    read_only_root: bool = False
    """``readOnlyRootFilesystem`` (a container-level field only): the private tmpfs of rule 2 are read-only."""


def container_id(pod_uid: str, name: str) -> str:
    """The runc id of a pod's container: derived from the pod alone, so anyone can find it again."""
    return f"{pod_uid.replace('-', '')}-{name}"


# -- rule 5 to 7 --------------------------------------------------------------------------------------------------
def security_view(pod: Mapping[str, Any], container: Mapping[str, Any]) -> SecurityView:
    """The effective security context; raises :class:`SecurityContextError`."""
    spec = _mapping(pod.get("spec"))
    pod_sc, sc = _mapping(spec.get("securityContext")), _mapping(container.get("securityContext"))
    name = str(container.get("name") or "")

    def pick(key: str) -> Any:
        return sc[key] if sc.get(key) is not None else pod_sc.get(key)

    uid, gid = _id(pick("runAsUser"), "runAsUser"), _id(pick("runAsGroup"), "runAsGroup")
    if pick("runAsNonRoot") is True and uid in (None, 0):
        meta = _mapping(pod.get("metadata"))
        ref = f"{meta.get('name', '')}_{meta.get('namespace', '')}({meta.get('uid', '')})"
        if uid is None:
            message = "container has runAsNonRoot and image will run as root"
        else:
            message = "container's runAsUser breaks non-root policy"
        raise SecurityContextError(f'{message} (pod: "{ref}", container: {name})')
    extra: list[int] = []
    for value in [*(pod_sc.get("supplementalGroups") or ()), pod_sc.get("fsGroup")]:
        group = _id(value, "supplementalGroups/fsGroup")
        if group is not None and group not in extra:
            extra.append(group)
    privileged = sc.get("privileged") is True
    caps = ALL_CAPABILITIES if privileged else _capabilities(_mapping(sc.get("capabilities")))
    escalation = sc.get("allowPrivilegeEscalation")
    return SecurityView(
        uid=uid or 0,
        gid=gid or 0,
        additional_gids=tuple(extra),
        privileged=privileged,
        capabilities=caps,
        no_new_privileges=escalation is False and not privileged,
        read_only_root=sc.get("readOnlyRootFilesystem") is True,
    )


def _id(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31:
        raise SecurityContextError(f"{what} must be an integer from 0 to 2147483647, not {value!r}")
    return value


def _capability(name: Any) -> str:
    text = str(name).upper()
    text = text if text.startswith("CAP_") else f"CAP_{text}"
    if text not in ALL_CAPABILITIES:
        raise SecurityContextError(f"unknown capability {name!r}")
    return text


def _capabilities(spec: Mapping[str, Any]) -> tuple[str, ...]:
    add = [str(c) for c in spec.get("add") or ()]
    drop = [str(c) for c in spec.get("drop") or ()]
    if any(c.upper() == "ALL" for c in add):
        return ALL_CAPABILITIES
    dropped = set(ALL_CAPABILITIES) if any(c.upper() == "ALL" for c in drop) else {_capability(c) for c in drop}
    caps = [c for c in DEFAULT_CAPABILITIES if c not in dropped]
    for name in add:
        cap = _capability(name)
        if cap not in caps:
            caps.append(cap)
    return tuple(caps)


# -- rule 8 -------------------------------------------------------------------------------------------------------
def parse_quantity(text: Any) -> Decimal:
    """A Kubernetes resource quantity (:mod:`ambit.model.quantity`); raises :class:`SecurityContextError`."""
    try:
        return quantity.parse_quantity(text)
    except QuantityError as exc:
        raise SecurityContextError(str(exc)) from None


def linux_resources(container: Mapping[str, Any], paths: BundlePaths) -> dict[str, Any]:
    resources = _mapping(container.get("resources"))
    limits, requests = _mapping(resources.get("limits")), _mapping(resources.get("requests"))
    out: dict[str, Any] = {}
    if limits.get("memory") is not None and "memory" not in paths.unavailable:
        out["memory"] = {"limit": int(parse_quantity(limits["memory"]).to_integral_value(rounding="ROUND_CEILING"))}
    cpu: dict[str, Any] = {}
    if requests.get("cpu") is not None:
        milli = int((parse_quantity(requests["cpu"]) * 1000).to_integral_value(rounding="ROUND_CEILING"))
        cpu["shares"] = max(2, milli * 1024 // 1000)
    if limits.get("cpu") is not None:
        milli = int((parse_quantity(limits["cpu"]) * 1000).to_integral_value(rounding="ROUND_CEILING"))
        cpu["quota"], cpu["period"] = max(1000, milli * CPU_PERIOD // 1000), CPU_PERIOD
    if cpu and "cpu" not in paths.unavailable:
        out["cpu"] = cpu
    if "pids" not in paths.unavailable:
        out["pids"] = {"limit": paths.pids_limit}
    return out


# -- the whole configuration --------------------------------------------------------------------------------------
def automounts_token(pod: Mapping[str, Any]) -> bool:
    return _mapping(pod.get("spec")).get("automountServiceAccountToken") is not False


def container_config(
    pod: Mapping[str, Any], container: Mapping[str, Any], process: ProcessSpec, paths: BundlePaths
) -> dict[str, Any]:
    """``config.json`` for one container (rules 1 to 13); raises :class:`SecurityContextError` and
    :class:`~ambit.lab.runtime.seccomp.SeccompProfileError`."""
    view = security_view(pod, container)
    if paths.user_namespace is not None:
        if not paths.shared_rootfs:
            raise ValueError("a container in a user namespace needs paths.shared_rootfs (rule 13)")
        for value in (view.uid, view.gid, *view.additional_gids):
            try:
                paths.user_namespace.host_id(value)
            except UsernsError as exc:
                raise SecurityContextError(f"hostUsers is false: {exc}") from None
    resources = linux_resources(container, paths)
    caps = list(view.capabilities)
    if view.privileged and paths.held_capabilities is not None:
        caps = [c for c in caps if c in paths.held_capabilities]
    user: dict[str, Any] = {"uid": view.uid, "gid": view.gid}
    if view.additional_gids:
        user["additionalGids"] = list(view.additional_gids)
    namespaces: list[dict[str, str]] = [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}]
    if paths.netns_path:
        namespaces.insert(0, {"type": "network", "path": paths.netns_path})
    if paths.user_namespace is not None:
        namespaces.append(
            {"type": "user", **({"path": paths.user_namespace_path} if paths.user_namespace_path else {})}
        )
    linux: dict[str, Any] = {
        "namespaces": namespaces,
        "cgroupsPath": f"{paths.cgroup_parent.rstrip('/')}/{paths.container_id}",
        "resources": {"devices": [{"allow": view.privileged, "access": "rwm"}], **resources},
    }
    try:
        choice = seccomp_choice(pod, container, privileged=view.privileged)
    except SeccompFieldError as exc:
        raise SecurityContextError(str(exc)) from None
    seccomp = seccomp_config(choice, caps, paths.machine, paths.seccomp_localhost)
    if seccomp is not None:
        linux["seccomp"] = seccomp
    if paths.user_namespace is not None:
        linux["uidMappings"] = paths.user_namespace.oci_mappings()
        linux["gidMappings"] = paths.user_namespace.oci_mappings()
    if not view.privileged:
        linux["maskedPaths"] = list(RUNC_MASKED_PATHS)
        linux["readonlyPaths"] = list(RUNC_READONLY_PATHS)
    propagations = {m.propagation for m in paths.volume_mounts}
    for needed in ("rshared", "rslave"):
        if needed in propagations:
            linux["rootfsPropagation"] = needed
            break
    return {
        "ociVersion": OCI_VERSION,
        "process": {
            "terminal": False,
            "user": user,
            "args": list(process.argv),
            "env": [f"{key}={value}" for key, value in process.env.items()],
            "cwd": process.cwd or "/",
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps, "inheritable": [], "ambient": []},
            "noNewPrivileges": view.no_new_privileges,
        },
        "root": {"path": paths.shared_rootfs if paths.user_namespace else "rootfs", "readonly": True},
        "hostname": str(_mapping(pod.get("metadata")).get("name") or ""),
        "mounts": _mounts(pod, paths, view.privileged, read_only_root=view.read_only_root),
        "linux": linux,
    }


def _mounts(
    pod: Mapping[str, Any], paths: BundlePaths, privileged: bool, *, read_only_root: bool = False
) -> list[dict[str, Any]]:
    sys_options = ["nosuid", "noexec", "nodev"] + ([] if privileged else ["ro"])
    sys_mount = {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": sys_options}
    if not paths.netns_path or paths.user_namespace:  # a new sysfs needs a network namespace of its own (rule 1, 13)
        options = ["rbind", "nosuid", "noexec", "nodev"] + ([] if privileged else ["rro"])
        sys_mount = {"destination": "/sys", "type": "bind", "source": "/sys", "options": options}
    # runc makes a read-only tmpfs read-only at the end, by remounting its path: a volume mounted on that very path
    # would be the mount remounted, so a tmpfs a volume covers stays writable (it is hidden anyway).
    volume_paths = {_RUN_ALIASES.get(d, d) for d in (m.destination.rstrip("/") or "/" for m in paths.volume_mounts)}
    mounts: list[dict[str, Any]] = [
        {"destination": "/", "type": "bind", "source": "/", "options": ["rbind", "rro"]},
        *_mount_point_mounts(paths.mount_point_dirs),
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
        },
        {
            "destination": "/dev/pts",
            "type": "devpts",
            "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"],
        },
        {
            "destination": "/dev/shm",
            "type": "tmpfs",
            "source": "shm",
            "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        },
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
        sys_mount,
        _tmpfs("/tmp", "mode=1777", readonly=read_only_root and "/tmp" not in volume_paths),
        _tmpfs("/run", "mode=755", readonly=read_only_root and "/run" not in volume_paths),
        _tmpfs("/root", "mode=755", size="1m", readonly=read_only_root and "/root" not in volume_paths)
        if not paths.root_view
        else {
            "destination": "/root",
            "type": "bind",
            "source": paths.root_view,
            "options": ["rbind", "ro", "nosuid", "nodev"],
        },
    ]
    for path in _effective_masks(paths.masked):
        if path in paths.masked_files:
            mounts.append({"destination": path, "type": "bind", "source": "/dev/null", "options": ["bind", "ro"]})
        else:
            # runc makes the mount points of the paths revealed beneath a mask in its tmpfs, so that one stays
            # writable (4 KiB, the container's own, empty but for those directories).
            beneath = any(_under(revealed, path) and revealed != path for revealed in paths.revealed)
            if beneath and paths.views:
                view = {"source": view_source(paths.views, path), "options": ["rbind", "ro", "nosuid", "nodev"]}
                mounts.append({"destination": path, "type": "bind", **view})
            else:
                mounts.append(_tmpfs(path, "mode=755", size="4k", readonly=not beneath))
    for path in paths.revealed:
        mounts.append({"destination": path, "type": "bind", "source": path, "options": ["rbind", "rro"]})
    covered = any(m.destination == SERVICE_ACCOUNT_DIR for m in paths.volume_mounts)
    if automounts_token(pod) and not covered:
        mounts.append(
            {
                "destination": SERVICE_ACCOUNT_DIR,
                "type": "bind",
                "source": paths.service_account_dir,
                "options": ["rbind", "ro", "nosuid", "nodev", "noexec"],
            }
        )
    if any(d.path == "/" for d in paths.mount_point_dirs):
        mounts.pop(0)  # rule 11: the root is a tmpfs with the host's entries bound back
    for volume in sorted(paths.volume_mounts, key=lambda m: m.destination.count("/")):
        writable = "rro" if volume.recursive_read_only else "ro" if volume.read_only else "rw"
        options = ["rbind", writable, volume.propagation]
        mounts.append({"destination": volume.destination, "type": "bind", "source": volume.source, "options": options})
    for path in paths.revealed:  # a volume over /tmp must not hide an interpreter or checkout that lives there
        if any(_under(path, v.destination) for v in paths.volume_mounts):
            mounts.append({"destination": path, "type": "bind", "source": path, "options": ["rbind", "rro"]})
    return mounts


_RUN_ALIASES = {"/var/run": "/run"}
"""Mount destinations that resolve to a private directory of rule 2 through the host's links."""


def _under(path: str, directory: str) -> bool:
    base = directory.rstrip("/")
    return path == base or path.startswith(base + "/")


ROOT_MOUNTED = frozenset({"proc", "dev", "sys", "tmp", "run", "root"})
"""Entries of ``/`` that rule 2 mounts itself (rule 11 leaves them out)."""


def _mount_point_mounts(dirs: Sequence[MountPointDir]) -> list[dict[str, Any]]:
    """Rule 11."""
    mounts: list[dict[str, Any]] = []
    for rebuilt in sorted(dirs, key=lambda d: (d.path != "/", d.path.count("/"), d.path)):
        base = rebuilt.path.rstrip("/")
        if base:
            mounts.append(_tmpfs(rebuilt.path, "mode=755", size="1m"))
        else:  # the root itself: replaces the plain bind of "/"
            mounts = [{"destination": "/", "type": "tmpfs", "source": "tmpfs", "options": ["mode=755", "size=1m"]}]
        for name, is_dir in rebuilt.entries:
            if not base and name in ROOT_MOUNTED:
                continue
            options = ["rbind", "rro"] if is_dir else ["bind", "ro"]
            path = f"{base}/{name}"
            mounts.append({"destination": path, "type": "bind", "source": path, "options": options})
    return mounts


def _root_mount(root_view: str) -> dict[str, Any]:
    if not root_view:
        return _tmpfs("/root", "mode=755", size="1m")
    return {"destination": "/root", "type": "bind", "source": root_view, "options": ["rbind", "ro", "nosuid", "nodev"]}


def view_source(views: str, masked: str) -> str:
    """Where the view of the masked directory ``masked`` is made under ``views`` (a name per path)."""
    return f"{views}/{hashlib.sha256(masked.encode()).hexdigest()[:16]}"


def _tmpfs(path: str, mode: str, *, size: str = "65536k", readonly: bool = False) -> dict[str, Any]:
    options = ["nosuid", "nodev", mode, f"size={size}"] + (["ro"] if readonly else [])
    return {"destination": path, "type": "tmpfs", "source": "tmpfs", "options": options}


def _effective_masks(masked: Sequence[str]) -> list[str]:
    """Rule 3: absolute, normalised, without duplicates or paths inside another mask or a private directory."""
    clean = sorted({"/" + "/".join(p for p in path.split("/") if p and p != ".") for path in masked if path})
    kept: list[str] = []
    for path in clean:
        if path == "/" or ".." in path.split("/"):
            continue
        covering = (*PRIVATE_DIRS, *kept)
        if any(path == d or path.startswith(d + "/") for d in covering):
            continue
        kept.append(path)
    return kept


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


CAPABILITY_NUMBERS = {
    "CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_DAC_READ_SEARCH": 2, "CAP_FOWNER": 3, "CAP_FSETID": 4,
    "CAP_KILL": 5, "CAP_SETGID": 6, "CAP_SETUID": 7, "CAP_SETPCAP": 8, "CAP_LINUX_IMMUTABLE": 9,
    "CAP_NET_BIND_SERVICE": 10, "CAP_NET_BROADCAST": 11, "CAP_NET_ADMIN": 12, "CAP_NET_RAW": 13,
    "CAP_IPC_LOCK": 14, "CAP_IPC_OWNER": 15, "CAP_SYS_MODULE": 16, "CAP_SYS_RAWIO": 17, "CAP_SYS_CHROOT": 18,
    "CAP_SYS_PTRACE": 19, "CAP_SYS_PACCT": 20, "CAP_SYS_ADMIN": 21, "CAP_SYS_BOOT": 22, "CAP_SYS_NICE": 23,
    "CAP_SYS_RESOURCE": 24, "CAP_SYS_TIME": 25, "CAP_SYS_TTY_CONFIG": 26, "CAP_MKNOD": 27, "CAP_LEASE": 28,
    "CAP_AUDIT_WRITE": 29, "CAP_AUDIT_CONTROL": 30, "CAP_SETFCAP": 31, "CAP_MAC_OVERRIDE": 32,
    "CAP_MAC_ADMIN": 33, "CAP_SYSLOG": 34, "CAP_WAKE_ALARM": 35, "CAP_BLOCK_SUSPEND": 36, "CAP_AUDIT_READ": 37,
    "CAP_PERFMON": 38, "CAP_BPF": 39, "CAP_CHECKPOINT_RESTORE": 40,
}  # fmt: skip
"""Linux's capability numbers (linux/capability.h)."""


def capabilities_in(status_text: str) -> frozenset[str] | None:
    """The names of the capabilities in the ``CapBnd`` line of a ``/proc/<pid>/status`` text; None without one."""
    for line in status_text.splitlines():
        key, _, value = line.partition(":")
        if key == "CapBnd":
            try:
                mask = int(value.strip(), 16)
            except ValueError:
                return None
            return frozenset(name for name, bit in CAPABILITY_NUMBERS.items() if mask >> bit & 1)
    return None

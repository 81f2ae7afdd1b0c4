"""Containers run by runc: the I/O that carries out :mod:`ambit.lab.runtime.oci_spec`.

Theory of operation. Each container instance is ``runc --root <root> run --bundle <bundle> <id>`` run in the
foreground, in a session of its own, with the container's stdout and stderr appended to its log file and runc's own
messages to ``<bundle>/runc.log`` (JSON lines). The foreground form is chosen over ``create``/``start`` because
runc then stays the parent of the container's init: it reaps it, its exit status *is* the container's (128+n
after signal n), and it forwards the signals it gets (SIGTERM) to the init, so the runtime keeps supervising one
process of its own, through a pidfd, exactly as it supervised plain processes (and adopts it after a restart by
pid and start time, :mod:`ambit.lab.runtime.processes`). No subreaper is needed.

Rules:

1. The container id is ``<pod uid without dashes>-<container name>``
   (:func:`ambit.lab.runtime.oci_spec.container_id`): a restarted runtime,
   the pod worker and ``ambit lab exec`` derive it from the pod alone. Its cgroup is ``<cgroup parent>/<id>``.
2. SIGTERM goes to runc's process group (runc forwards it to the container's init); SIGKILL goes through
   ``runc kill <id> KILL``, since killing runc itself would leave the container running without it. When the
   container's PID namespace loses its init, the kernel kills everything else in it.
3. After every instance, ``runc delete --force <id>`` (idempotent) removes what is left of it, and a leftover of
   an earlier instance is deleted before a new one starts. :meth:`RuncRuntime.remove_pod` does the same for every
   container of a pod (also ones no record names), and the lab's sweep for every container under the lab's root.
4. An instance that runc could not create or start leaves an ``error`` line in ``runc.log``: it is reported as
   :class:`ContainerRuntimeError` (``CreateContainerError``, or ``RunContainerError`` when the container was
   created but its process could not be started), never as the container's own exit.
5. runc missing is :class:`RuncMissingError` at start-up, naming the Debian package. A cgroup controller this
   machine lacks is logged once and its limits are left out, never a crash.
6. A ``Localhost`` seccomp profile is read by :func:`read_seccomp_profile`: a regular file inside the node's
   seccomp directory after symbolic links are resolved, opened without following a last link, at most
   :data:`~ambit.lab.runtime.seccomp.MAX_PROFILE_BYTES` read; anything else is a
   :class:`~ambit.lab.runtime.seccomp.SeccompProfileError` that names the path, never its content.
7. Containers in a user namespace get ``/run/<lab cgroup name>-rootfs`` as their root (rule 13 of
   :mod:`ambit.lab.runtime.oci_spec`): made empty, root's, 0755 before each start; removed with the lab's containers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import platform
import shutil
import signal
import stat
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ambit.errors import AmbitError
from ambit.lab.runtime.containers_apply import LaunchSpec
from ambit.lab.runtime.oci_spec import BundlePaths, capabilities_in
from ambit.lab.runtime.processes import ProcessHandle, process_start_ticks, signal_group
from ambit.lab.runtime.seccomp import MAX_PROFILE_BYTES, Machine, SeccompProfileError, kernel_version

log = logging.getLogger("ambit.lab.runtime.oci")

RUNC = "runc"
RUNC_PACKAGE = "runc"
CGROUP_ROOT = Path("/sys/fs/cgroup")
LIMITED_CONTROLLERS = ("memory", "cpu", "pids")
RUNC_TIMEOUT = 30.0
SHARED_ROOTFS_PARENT = Path("/run")


ROOT_VIEW = "rootview"
"""In a bundle: the directory bound read-only over the container's ``/root`` (:class:`BundlePaths.root_view`)."""


VIEWS = "views"
"""In a bundle: the views bound read-only over masked directories with something revealed beneath them
(:attr:`BundlePaths.views`)."""


def prepare_root_view(view: Path, config: Mapping[str, Any], covers: str = "/root") -> None:
    """Make ``view`` (0755) hold a mount point for each mount of ``config`` under ``covers`` (the directory it is
    bound over), so that runc, which cannot create them in a read-only bind, finds them: a directory, or an empty
    file where the source is a file."""
    view.mkdir(mode=0o755, parents=True, exist_ok=True)
    view.chmod(0o755)
    base = covers.rstrip("/") + "/"
    for mount in config.get("mounts") or ():
        destination = str(mount.get("destination", ""))
        if not destination.startswith(base) or ".." in destination.split("/"):
            continue
        target = view / destination.removeprefix(base)
        if os.path.isfile(str(mount.get("source", ""))):
            target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            target.touch(mode=0o644, exist_ok=True)
        else:
            target.mkdir(mode=0o755, parents=True, exist_ok=True)


class RuncMissingError(AmbitError):
    """runc is not installed: the lab cannot run containers."""


class ContainerRuntimeError(AmbitError):
    """runc could not create or start a container (rule 4); ``reason`` is the kubelet's waiting reason."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def find_runc() -> str:
    """runc's path; :class:`RuncMissingError` when it is not installed (rule 5)."""
    found = shutil.which(RUNC)
    if found is None:
        raise RuncMissingError(
            f"runc is not installed: the lab runs every container through it (apt-get install {RUNC_PACKAGE})"
        )
    return found


def unavailable_controllers(root: Path = CGROUP_ROOT) -> frozenset[str]:
    """Rule 5: the limited controllers without a v1 hierarchy here."""
    return frozenset(name for name in LIMITED_CONTROLLERS if not (root / name / "cgroup.procs").exists())


@dataclass(frozen=True, slots=True)
class RuncSettings:
    root: Path
    """runc's state directory for this lab (``--root``)."""
    bundles: Path
    """Bundles, one directory per container id: ``config.json``, the empty ``rootfs``, ``runc.log``."""
    cgroup_parent: str
    """``/<lab prefix>``: every container's cgroup is under it, in every controller."""
    masked: tuple[str, ...] = ()
    revealed: tuple[str, ...] = ()
    pids_limit: int = 4096


def shared_rootfs_dir(cgroup_parent: str) -> Path:
    """Rule 7: the empty root of the lab's containers in a user namespace (``BundlePaths.shared_rootfs``)."""
    name = cgroup_parent.strip("/").replace("/", "-") or "ambit"
    return SHARED_ROOTFS_PARENT / f"{name}-rootfs"


def runc_argv(root: Path, *args: str) -> list[str]:
    return [RUNC, "--root", str(root), *args]


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=RUNC_TIMEOUT, check=False)


def runc_error(log_path: Path) -> str:
    """The last error runc wrote to its log (rule 4), or empty."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("level") in ("error", "fatal"):
            return str(entry.get("msg") or "")
    return ""


def error_reason(message: str) -> str:
    return "RunContainerError" if "unable to start container process" in message else "CreateContainerError"


def list_containers(root: Path) -> list[str]:
    """Ids of the containers runc knows under ``root``."""
    if not root.is_dir():
        return []
    return sorted(entry.name for entry in root.iterdir() if (entry / "state.json").exists())


def delete_container(root: Path, cid: str) -> bool:
    """``runc delete --force``; True when runc no longer knows it."""
    done = _run(runc_argv(root, "delete", "--force", cid))
    return done.returncode == 0 or not (root / cid).exists()


class RuncRuntime:
    """The lab's container runtime (rules 1 to 5): one per node runtime."""

    sandboxed = True

    def __init__(self, settings: RuncSettings) -> None:
        self.settings = settings
        self.runc = find_runc()
        self.unavailable = unavailable_controllers()
        try:
            self.held_capabilities = capabilities_in(Path("/proc/self/status").read_text())
        except OSError:
            self.held_capabilities = None
        if self.unavailable:
            log.warning(
                "cgroup controller(s) %s unavailable on this machine: their container limits are not enforced",
                ", ".join(sorted(self.unavailable)),
            )

    def bundle_paths(self, cid: str, netns_path: str, service_account_dir: Path) -> BundlePaths:
        """What :func:`ambit.lab.runtime.oci_spec.container_config` needs to know of this machine."""
        s = self.settings
        return BundlePaths(
            container_id=cid,
            netns_path=netns_path,
            service_account_dir=str(service_account_dir),
            cgroup_parent=s.cgroup_parent,
            masked=s.masked,
            masked_files=frozenset(path for path in s.masked if os.path.isfile(path)),
            revealed=s.revealed,
            pids_limit=s.pids_limit,
            unavailable=self.unavailable,
            held_capabilities=self.held_capabilities,
            machine=Machine(platform.machine(), kernel_version(platform.release())),
            shared_rootfs=str(shared_rootfs_dir(s.cgroup_parent)),
            root_view=str(self.settings.bundles / cid / ROOT_VIEW),
            views=str(self.settings.bundles / cid / VIEWS),
        )

    def spawn(self, launch: LaunchSpec) -> ProcessHandle:
        """Write the bundle and start runc on it (rule 3: a leftover of the same id is deleted first); OSError
        (a start error) when the command is not found in the container's PATH."""
        cid, config, root = launch.container_id, launch.config, self.settings.root
        if not cid or config is None:
            raise ValueError("a runc container needs an id and a configuration")
        _find_executable(launch.argv[0], launch.env.get("PATH", os.defpath))
        bundle = self.settings.bundles / cid
        log_path = launch.log_path
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        if (root / cid).exists():
            delete_container(root, cid)
        # The configuration holds the container's environment (values from Secrets too): the runtime's eyes only.
        self.settings.bundles.mkdir(parents=True, exist_ok=True, mode=0o700)
        bundle.mkdir(exist_ok=True, mode=0o700)
        (bundle / "rootfs").mkdir(exist_ok=True)
        shared = Path(str((config.get("root") or {}).get("path") or ""))
        if shared.is_absolute():  # rule 7
            shared.mkdir(mode=0o755, parents=True, exist_ok=True)
            shared.chmod(0o755)
        prepare_root_view(bundle / ROOT_VIEW, config)
        views = str(bundle / VIEWS) + "/"
        for mount in config.get("mounts") or ():
            if str(mount.get("source", "")).startswith(views):
                prepare_root_view(Path(mount["source"]), config, str(mount.get("destination", "")))
        tmp = bundle / "config.json.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(config, indent=1) + "\n")
        tmp.replace(bundle / "config.json")
        runc_log = bundle / "runc.log"
        with contextlib.suppress(FileNotFoundError):
            runc_log.unlink()
        argv = [self.runc, "--root", str(root), "--log", str(runc_log), "--log-format", "json"]
        argv += ["run", "--bundle", str(bundle), cid]
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
        try:
            pid = os.posix_spawn(
                self.runc,
                argv,
                {"PATH": os.defpath},
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_DUP2, fd, 1),
                    (os.POSIX_SPAWN_DUP2, fd, 2),
                ],
                setsid=True,
                setsigmask=(),
                setsigdef=(signal.SIGPIPE, signal.SIGTERM, signal.SIGINT, signal.SIGHUP),
            )
        finally:
            os.close(fd)
        return ProcessHandle(pid, process_start_ticks(pid) or 0)

    async def signal(self, handle: ProcessHandle, cid: str, sig: int) -> None:
        """Rule 2."""
        if sig != signal.SIGKILL:
            signal_group(handle.pid, sig)
            return
        await asyncio.to_thread(_run, runc_argv(self.settings.root, "kill", cid, "KILL"))

    async def finished(self, cid: str) -> ContainerRuntimeError | None:
        """Rule 3 and 4: clean up after an instance; runc's own failure, if that is why it ended."""
        message = runc_error(self.settings.bundles / cid / "runc.log")
        await asyncio.to_thread(delete_container, self.settings.root, cid)
        return ContainerRuntimeError(message, error_reason(message)) if message else None

    async def remove_pod(self, pod_uid: str) -> None:
        """Rule 3: delete every container of the pod that runc still knows."""
        prefix = pod_uid.replace("-", "") + "-"
        for cid in list_containers(self.settings.root):
            if cid.startswith(prefix):
                await asyncio.to_thread(delete_container, self.settings.root, cid)
        if self.settings.bundles.is_dir():
            for bundle in self.settings.bundles.iterdir():
                if bundle.name.startswith(prefix):
                    await asyncio.to_thread(shutil.rmtree, bundle, True)

    def exec_prefix(self, cid: str) -> tuple[str, ...]:
        """The command prefix that runs a command inside a running container (exec probes)."""
        return (self.runc, "--root", str(self.settings.root), "exec", cid)

    def members(self, cid: str, handle: ProcessHandle) -> set[int]:
        """Pids in the container's cgroup (to tell its processes from strays in the pod's namespace)."""
        for controller in ("pids", "memory", "cpu", "systemd"):
            procs = CGROUP_ROOT / controller / self.settings.cgroup_parent.strip("/") / cid / "cgroup.procs"
            try:
                return {int(word) for word in procs.read_text().split()}
            except (OSError, ValueError):
                continue
        return set()


def read_seccomp_profile(directory: Path, relative: str) -> bytes:
    """Rule 6: the profile ``relative`` (already checked: relative, no ``..``) names under ``directory``."""

    def fail(why: str) -> SeccompProfileError:
        return SeccompProfileError(f"cannot load seccomp profile {str(directory / relative)!r}: {why}")

    try:
        base = directory.resolve(strict=True)
        path = (base / relative).resolve(strict=True)
    except (OSError, RuntimeError):
        raise fail("no such file") from None
    if base not in path.parents:
        raise fail("it leads out of the seccomp profile directory")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise fail(exc.strerror or "cannot be opened") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise fail("not a regular file")
        chunks: list[bytes] = []
        left = MAX_PROFILE_BYTES + 1
        while left > 0 and (chunk := os.read(fd, min(left, 65536))):
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise fail(exc.strerror or "cannot be read") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > MAX_PROFILE_BYTES:
        raise fail(f"larger than {MAX_PROFILE_BYTES} bytes")
    return data


def _find_executable(command: str, path: str) -> None:
    """The root is this machine's ``/``: a command missing here is missing in the container (a start error)."""
    found = shutil.which(command, path=path) if "/" not in command else command
    if found is None or not os.access(found, os.X_OK):
        raise FileNotFoundError(2, "executable file not found in $PATH", command)


def remove_lab_containers(root: Path, cgroup_parent: str) -> tuple[list[str], list[str]]:
    """The sweep's part (rule 3): delete every container under ``root``, remove ``root`` and the lab's cgroups.

    Returns what was removed and what could not be.
    """
    removed: list[str] = []
    left: list[str] = []
    if root.is_dir() and shutil.which(RUNC) is not None:
        for cid in list_containers(root):
            if delete_container(root, cid):
                removed.append(f"container {cid}")
            else:
                left.append(f"container {cid}")
    if root.is_dir():
        shutil.rmtree(root, ignore_errors=True)
        if root.exists():
            left.append(f"runc state {root}")
        else:
            removed.append(f"runc state {root}")
    shared = shared_rootfs_dir(cgroup_parent)
    if cgroup_parent.strip("/") and shared.is_dir():
        try:
            shared.rmdir()
            removed.append(f"container root {shared}")
        except OSError as exc:
            left.append(f"container root {shared} ({exc.strerror})")
    name = cgroup_parent.strip("/")
    if not name:
        return removed, left
    with contextlib.suppress(OSError):
        for hierarchy in sorted(CGROUP_ROOT.iterdir()):
            parent = hierarchy / name
            if not parent.is_dir():
                continue
            for child in sorted((p for p in parent.iterdir() if p.is_dir()), reverse=True):
                with contextlib.suppress(OSError):
                    child.rmdir()
            try:
                parent.rmdir()
                removed.append(f"cgroup {parent}")
            except OSError as exc:
                left.append(f"cgroup {parent} ({exc.strerror})")
    return removed, left

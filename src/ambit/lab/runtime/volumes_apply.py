"""A pod's volumes on this machine: the I/O that carries out :mod:`ambit.lab.runtime.volumes`.

Theory of operation. A :class:`PodVolumes` belongs to one pod worker. :meth:`PodVolumes.set_up` makes every
volume before any container starts, and :meth:`PodVolumes.resync` is called again periodically while the pod
runs: it refetches the ConfigMaps and Secrets, recomputes the downward API files from the latest pod, renews
service-account tokens at ``token_refresh_fraction`` of their life, and rewrites a volume only when its payload
changed. Failures are :class:`~ambit.lab.runtime.volumes.VolumeError` with the kubelet's text
(``MountVolume.SetUp failed for volume "<name>" : ...``); the worker turns them into FailedMount Events.

Rules:

1. Volumes live under ``<pod dir>/volumes/<plugin>/<name>`` (the pod's directory is 0700: only the runtime and,
   through their bind mounts, the pod's containers see them). An emptyDir is a 0777 directory, as the kubelet
   makes it. Deleting the pod removes them; the removal never descends into a mount point.
2. configMap, secret, downwardAPI and projected volumes are written as the kubelet's AtomicWriter writes: the
   files go to a fresh ``..<timestamp>`` directory, then a ``..data_tmp`` symbolic link to it is renamed over
   ``..data`` (one atomic step: a reader sees the old files or the new ones), each top-level name is a link
   ``<name> -> ..data/<name>``, links of names no longer in the payload are removed, then the old directory.
   A payload equal to what ``..data`` holds (bytes and modes) is not written again.
3. hostPath: the node's path is mapped to a machine path (:class:`ambit.lab.network.topology.HostPathLayout`);
   the mapped path, with its symbolic links resolved, must stay under the mapping's base, else the volume is
   refused: a link a pod planted cannot lead another pod to the lab's state, keys or tokens. The ``type`` check
   runs on the resolved path; the resolved path is what is mounted.
4. Mount points (rule 11 of :mod:`ambit.lab.runtime.oci_spec`): for a ``mountPath`` that the machine's root
   lacks, outside the containers' private directories, the deepest existing ancestor is listed so it can be
   rebuilt in the container. Entries that are dangling links, or links into a private directory (``/var/run``),
   are left out: binding them would show the machine's ``/run`` instead of the container's own.
5. persistentVolumeClaim (rule 10 of :mod:`ambit.lab.runtime.volumes`): the claim and its volume are read (the
   node authorizer lets a node read exactly those of its pods); the volume's ``hostPath`` or ``local`` path is
   mapped as in rule 3 but must land in the node's private tree (``nodes/<node>/root``): a volume that names
   ``/proc``, the CNI directories or the netns directory, or whose path (or a link in it) leads out of the tree,
   is refused. A missing directory is made (0777, as local-path makes it).
6. A hostPath volume in the node's tree makes the tree ready to show the node's root as a cluster node's would
   (:mod:`ambit.lab.runtime.node_view_apply`); :attr:`PodVolumes.node_view` is what the container mounts add.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ambit.k8s import KubeClient, kinds
from ambit.k8s.errors import KubeClientError, KubeNotFoundError
from ambit.lab.network.topology import HostPathError, HostPathLayout
from ambit.lab.runtime.containers import parse_rfc3339
from ambit.lab.runtime.node_view import NodeView
from ambit.lab.runtime.node_view_apply import prepare_node_view
from ambit.lab.runtime.oci_spec import PRIVATE_DIRS, MountPointDir, VolumeMount
from ambit.lab.runtime.volumes import (
    PLUGIN_DIRS,
    ClaimVolume,
    EmptyDirVolume,
    FileData,
    HostPathVolume,
    MountPlan,
    Payload,
    ProjectedVolume,
    TokenSource,
    Volume,
    VolumeError,
    VolumeInputs,
    VolumeSource,
    claimed_path,
    file_kind,
    host_path_action,
    nested_mount_points,
    object_data,
    object_refs,
    parse_volumes,
    token_sources,
    volume_payload,
)

log = logging.getLogger("ambit.lab.runtime.volumes")

DATA_LINK = "..data"
VOLUMES_DIR = "volumes"


@dataclass(frozen=True, slots=True)
class IssuedToken:
    token: str
    refresh_at: float


class PodVolumes:
    """The volumes of one pod (rules 1 to 3)."""

    def __init__(
        self,
        client: KubeClient,
        pod: Mapping[str, Any],
        directory: Path,
        layout: HostPathLayout,
        *,
        allocatable: Mapping[str, str],
        token_refresh_fraction: float = 0.8,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.pod = pod
        self.directory = directory
        self.layout = layout
        self.allocatable = allocatable
        self.token_refresh_fraction = token_refresh_fraction
        self.clock = clock
        self.sources: dict[str, VolumeSource] = {}
        """Set-up volumes by name: what container mounts bind."""
        self.node_view: NodeView | None = None
        """What a hostPath volume of the node's tree shows besides it (rule 6), once one is set up."""
        self._tokens: dict[TokenSource, IssuedToken] = {}
        meta = pod.get("metadata") or {}
        self.namespace = str(meta.get("namespace") or "")

    @property
    def volumes(self) -> tuple[Volume, ...]:
        return parse_volumes(self.pod)

    def update(self, pod: Mapping[str, Any]) -> None:
        """The latest pod (labels and annotations for the downward API)."""
        self.pod = pod

    def next_refresh(self) -> float | None:
        """When the earliest token is due (clock time), if the pod has token volumes."""
        return min((t.refresh_at for t in self._tokens.values()), default=None)

    async def set_up(self) -> None:
        """Make every volume not made yet, and refresh the projected ones; :class:`VolumeError` names the volume."""
        volumes = self.volumes
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        inputs = await self._inputs(volumes)
        claimed: dict[str, str | VolumeError] = {}
        for volume in volumes:
            if isinstance(volume, ClaimVolume):
                claimed[volume.name] = await self._claimed_path(volume)
        for volume in volumes:
            try:
                if isinstance(volume, ClaimVolume):
                    found = claimed[volume.name]
                    if isinstance(found, VolumeError):
                        raise found
                    self.sources[volume.name] = self._claim_source(volume, found)
                    continue
                self.sources[volume.name] = self._set_up_one(volume, inputs)
            except VolumeError as exc:
                raise VolumeError(
                    f'MountVolume.SetUp failed for volume "{volume.name}" : {exc}', retry=exc.retry
                ) from None
            except OSError as exc:
                raise VolumeError(f'MountVolume.SetUp failed for volume "{volume.name}" : {exc}', retry=True) from None

    async def resync(self) -> None:
        await self.set_up()

    # -- inputs -----------------------------------------------------------------------------------------------
    async def _inputs(self, volumes: tuple[Volume, ...]) -> VolumeInputs:
        config_maps: dict[str, Mapping[str, bytes] | None] = {}
        secrets: dict[str, Mapping[str, bytes] | None] = {}
        for kind, name in sorted(object_refs(volumes)):
            resource = kinds.CONFIG_MAPS if kind == "configmap" else kinds.SECRETS
            try:
                found: Mapping[str, bytes] | None = object_data(
                    kind, await self.client.get(resource, name, self.namespace)
                )
            except KubeNotFoundError:
                found = None
            except KubeClientError as exc:
                raise VolumeError(f'reading {kind} "{name}": {exc}', retry=True) from None
            (config_maps if kind == "configmap" else secrets)[name] = found
        tokens: dict[TokenSource, str] = {}
        for source in token_sources(volumes):
            tokens[source] = await self._token(source)
        return VolumeInputs(self.pod, config_maps, secrets, tokens, self.allocatable)

    async def _token(self, source: TokenSource) -> str:
        """Rule 6 of :mod:`ambit.lab.runtime.volumes`: a TokenRequest bound to the pod, renewed when due."""
        now = self.clock()
        issued = self._tokens.get(source)
        if issued is not None and now < issued.refresh_at:
            return issued.token
        account = str((self.pod.get("spec") or {}).get("serviceAccountName") or "default")
        audiences = (source.audience,) if source.audience else ()
        try:
            answer = await self.client.create_token(
                self.namespace, account, audiences, expiration_seconds=source.expiration_seconds, bound_pod=self.pod
            )
            status = answer["status"]
            token = str(status["token"])
        except (KubeClientError, KeyError, TypeError) as exc:
            if issued is not None:  # the old token is still valid for a while: keep serving it
                log.warning("pod %s: renewing a token failed: %s", self.namespace, exc)
                return issued.token
            raise VolumeError(f"failed to fetch token: {exc}", retry=True) from None
        expires = parse_rfc3339(status.get("expirationTimestamp"))
        lifetime = expires - now if expires is not None and expires > now else float(source.expiration_seconds)
        self._tokens[source] = IssuedToken(token, now + max(1.0, lifetime * self.token_refresh_fraction))
        return token

    async def _claimed_path(self, volume: ClaimVolume) -> str | VolumeError:
        """Rule 5: the claim's bound volume's path (as the node sees it), or why there is none yet."""
        try:
            claim: Mapping[str, Any] | None = await self.client.get(
                kinds.PERSISTENT_VOLUME_CLAIMS, volume.claim, self.namespace
            )
        except KubeNotFoundError:
            claim = None
        except KubeClientError as exc:
            return VolumeError(f'reading persistentvolumeclaim "{volume.claim}": {exc}', retry=True)
        pv: Mapping[str, Any] | None = None
        bound = str(((claim or {}).get("spec") or {}).get("volumeName") or "")
        if bound:
            try:
                pv = await self.client.get(kinds.PERSISTENT_VOLUMES, bound)
            except KubeNotFoundError:
                pv = None
            except KubeClientError as exc:
                return VolumeError(f'reading persistentvolume "{bound}": {exc}', retry=True)
        try:
            return claimed_path(self.namespace, volume, claim, pv)
        except VolumeError as exc:
            return exc

    def _claim_source(self, volume: ClaimVolume, path: str) -> VolumeSource:
        """Rule 5: the volume's directory, confined to the node's own tree (made when missing)."""
        try:
            mapping = self.layout.map(path)
        except HostPathError as exc:
            raise VolumeError(str(exc), retry=False) from None
        if mapping.base != self.layout.root:
            raise VolumeError(f"persistent volume path {path} is not in the node's own filesystem", retry=False)
        mapping.base.mkdir(parents=True, exist_ok=True)
        resolved = self._confined(path, mapping.base, mapping.machine_path)
        if not resolved.exists():
            resolved.mkdir(mode=0o777, parents=True, exist_ok=True)
        elif not resolved.is_dir():
            raise VolumeError(f"persistent volume path {path} is not a directory", retry=True)
        if Path(os.path.realpath(resolved)) != resolved:
            raise VolumeError(f"persistent volume path {path} changed while it was set up", retry=True)
        return VolumeSource(str(resolved), read_only=volume.read_only)

    @staticmethod
    def _confined(shown: str, base: Path, machine_path: Path) -> Path:
        """``machine_path`` with its links resolved, refused unless it stays under ``base`` (rule 3)."""
        try:
            real_base = Path(os.path.realpath(base))
            resolved = Path(os.path.realpath(machine_path))
        except OSError as exc:  # a link the runtime may not follow is refused like one that leads out
            raise VolumeError(f"hostPath {shown} cannot be resolved: {exc.strerror}", retry=False) from None
        if resolved != real_base and real_base not in resolved.parents:
            raise VolumeError(f"hostPath {shown} leads outside the node's filesystem", retry=False)
        return resolved

    # -- each volume ------------------------------------------------------------------------------------------
    def _set_up_one(self, volume: Volume, inputs: VolumeInputs) -> VolumeSource:
        if isinstance(volume, HostPathVolume):
            return VolumeSource(str(self._host_path(volume)), read_only=False)
        if isinstance(volume, ClaimVolume):  # set up by set_up(), which fetched the claim first
            raise VolumeError("a claim volume needs its claim", retry=True)
        kind = "emptyDir" if isinstance(volume, EmptyDirVolume) else volume.plugin
        target = self.directory / VOLUMES_DIR / PLUGIN_DIRS[kind] / volume.name
        if isinstance(volume, EmptyDirVolume):
            if not target.is_dir():
                target.mkdir(parents=True)
                os.chmod(target, 0o777)
            return VolumeSource(str(target), read_only=False)
        assert isinstance(volume, ProjectedVolume)
        payload = volume_payload(volume, inputs)
        target.mkdir(parents=True, exist_ok=True)
        if write_atomically(target, payload, self.clock()):
            log.info("pod %s: volume %s written", self.namespace, volume.name)
        make_nested_mount_points(target, nested_mount_points(self.pod, volume.name))
        return VolumeSource(str(target), read_only=True)

    def _host_path(self, volume: HostPathVolume) -> Path:
        """Rule 3."""
        try:
            mapping = self.layout.map(volume.path)
        except HostPathError as exc:
            raise VolumeError(str(exc), retry=False) from None
        if mapping.base == self.layout.root:
            mapping.base.mkdir(parents=True, exist_ok=True)
            if self.node_view is None:
                self.node_view = prepare_node_view(self.layout)
        resolved = self._confined(volume.path, mapping.base, mapping.machine_path)
        try:
            found = file_kind(os.stat(resolved).st_mode)
        except FileNotFoundError:
            found = None
        action = host_path_action(volume.type, found, volume.path)
        if action == "mkdir":
            resolved.mkdir(mode=0o755, parents=True, exist_ok=True)
        elif action == "create-file":
            os.close(os.open(resolved, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644))
        again = Path(os.path.realpath(resolved))
        if again != resolved:
            raise VolumeError(f"hostPath {volume.path} changed while it was set up", retry=True)
        return resolved


def resolve_mounts(plans: tuple[MountPlan, ...]) -> tuple[VolumeMount, ...]:
    """Sub-paths resolved (rule 3's check, for a sub-path): a link inside a volume cannot lead a mount out of it;
    the resolved path is what is mounted."""
    mounts: list[VolumeMount] = []
    for plan in plans:
        if not plan.sub_path:
            mounts.append(plan.mount)
            continue
        root = Path(os.path.realpath(plan.volume_root))
        source = Path(os.path.realpath(plan.mount.source))
        if source != root and root not in source.parents:
            raise VolumeError(f"subPath {plan.sub_path!r} leads outside its volume", retry=False)
        if not source.exists():
            if not plan.creatable:
                raise VolumeError(f"subPath {plan.sub_path!r} does not exist in its volume", retry=True)
            source.mkdir(mode=0o755, parents=True, exist_ok=True)
        m = plan.mount
        mounts.append(VolumeMount(str(source), m.destination, m.read_only, m.propagation))
    return tuple(mounts)


def mount_point_dirs(destinations: list[str], private: tuple[str, ...] = PRIVATE_DIRS) -> tuple[MountPointDir, ...]:
    """Rule 4."""

    def is_private(path: str) -> bool:
        return any(path == p or path.startswith(p + "/") for p in private)

    found: dict[str, MountPointDir] = {}
    for destination in destinations:
        real = os.path.realpath(destination)
        if is_private(real) or os.path.lexists(real):
            continue
        ancestor = Path(real).parent
        while not ancestor.is_dir():
            ancestor = ancestor.parent
        if is_private(str(ancestor)) or str(ancestor) in found:
            continue
        entries: list[tuple[str, bool]] = []
        with os.scandir(ancestor) as listing:
            for entry in listing:
                target = os.path.realpath(entry.path)
                if not os.path.exists(target) or (entry.is_symlink() and is_private(target)):
                    continue
                entries.append((entry.name, os.path.isdir(target)))
        found[str(ancestor)] = MountPointDir(str(ancestor), tuple(sorted(entries)))
    return tuple(found.values())


# -- the AtomicWriter (rule 2) ------------------------------------------------------------------------------------
def current_payload(target: Path) -> dict[str, FileData] | None:
    """What ``..data`` holds now, or None when there is nothing (or something unreadable)."""
    data = target / DATA_LINK
    if not data.is_symlink():
        return None
    found: dict[str, FileData] = {}
    try:
        for root, _dirs, files in os.walk(data, followlinks=False):
            for name in files:
                path = Path(root) / name
                info = path.lstat()
                if not stat.S_ISREG(info.st_mode):
                    return None
                found[str(path.relative_to(data))] = FileData(path.read_bytes(), stat.S_IMODE(info.st_mode))
    except OSError:
        return None
    return found


def write_atomically(target: Path, payload: Payload, now: float) -> bool:
    """Rule 2; True when the files changed."""
    if current_payload(target) == dict(payload):
        return False
    stamp = time.strftime("..%Y_%m_%d_%H_%M_%S.", time.gmtime(now))
    fresh = Path(tempfile.mkdtemp(prefix=stamp, dir=target))
    for relative, content in payload.items():
        path = fresh / relative
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(content.data)
        os.chmod(path, content.mode)
    os.chmod(fresh, 0o755)
    old = target / DATA_LINK
    previous = os.readlink(old) if old.is_symlink() else None
    tmp_link = target / f"{DATA_LINK}_tmp"
    with contextlib.suppress(FileNotFoundError):
        tmp_link.unlink()
    tmp_link.symlink_to(fresh.name)
    tmp_link.replace(old)
    names = {relative.split("/", 1)[0] for relative in payload}
    for name in names:
        link = target / name
        if not link.is_symlink():
            link.symlink_to(f"{DATA_LINK}/{name}")
    for entry in target.iterdir():
        if entry.name.startswith("..") or entry.name in names:
            continue
        if entry.is_symlink() and os.readlink(entry).startswith(f"{DATA_LINK}/"):
            entry.unlink()
    if previous is not None and previous != fresh.name and "/" not in previous:
        remove_tree(target / previous)
    return True


def make_nested_mount_points(target: Path, relatives: tuple[str, ...]) -> None:
    """Rule 9 of :mod:`ambit.lab.runtime.volumes`: each mount point a directory inside the volume, made without
    following a link (a name the payload holds is a link into ``..data`` and is left alone)."""
    for relative in relatives:
        path = target
        for element in relative.split("/"):
            path = path / element
            if path.is_symlink() or (path.exists() and not path.is_dir()):
                break
            if not path.exists():
                path.mkdir(mode=0o755)


def remove_tree(path: Path) -> None:
    """Remove ``path`` and what it holds, never descending into a mount point (nor following links)."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        path.unlink()
        return
    if os.path.ismount(path):
        log.warning("not removing %s: something is mounted there", path)
        return
    for entry in list(path.iterdir()):
        remove_tree(entry)
    path.rmdir()


def remove_volumes(pod_dir: Path) -> None:
    """Rule 1: the pod is gone; so are its volumes."""
    with contextlib.suppress(OSError):
        remove_tree(pod_dir / VOLUMES_DIR)

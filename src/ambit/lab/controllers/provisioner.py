"""The local-path provisioner: the I/O that carries out :mod:`local_path` (rancher's provisioner, as kind runs it).

Keys: a claim is ``(namespace, name)``, a volume ``("", name)``, as in :mod:`persistentvolume`.

1. A claim :func:`local_path.provisioning` says to provision: the directory is made in the chosen node's private
   tree (mode 0777, as rancher's helper makes it), through :class:`HostPathLayout`, and only when the mapped
   path, with its links resolved, stays under the node's root: a link planted in a node's tree cannot lead the
   provisioner out of it. Then the PersistentVolume is created, pre-bound to the claim (the PV controller
   completes the binding), and a Normal ``ProvisioningSucceeded`` Event says so; a refusal is a Warning
   ``ProvisioningFailed`` Event and no retry until the claim or its class changes.
2. A volume :func:`local_path.reclaimable` says to reclaim: the directory is removed (the same confinement; a
   directory that is already gone is fine), then the volume is deleted; its ``pv-protection`` finalizer is the PV
   controller's to remove, which it does since the volume is no longer Bound.
3. The lab installs the default class at start (:func:`install_default_storage_class`), where it prepares its
   system namespaces, as kind applies the provisioner's manifest.

The directory work is synchronous file-system calls on the controller's loop: a few ``mkdir``/``rmtree`` calls on
a local disk, as the kubelet's volume set-up does.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from pathlib import Path

from ambit.errors import AmbitError
from ambit.k8s import EventRecorder, Informer, KubeAlreadyExistsError, KubeClient, KubeNotFoundError, kinds
from ambit.lab.controllers import local_path
from ambit.lab.controllers import volume_binding as binding
from ambit.lab.controllers.controller import Controller
from ambit.lab.controllers.ownership import Object, key_of, name_of
from ambit.lab.controllers.settings import ControllerSettings, Informers
from ambit.lab.controllers.workqueue import Key
from ambit.lab.network.topology import HostPathError, HostPathLayout

log = logging.getLogger("ambit.lab.controllers.provisioner")


class LocalPathError(AmbitError):
    """A local-path directory cannot be made or removed where it must be (outside the node's tree, or an OS
    error); the message says which."""


def confined(layout: HostPathLayout, path: str) -> Path:
    """``path`` (as the node sees it) in the node's private tree, links resolved; :class:`LocalPathError` when it
    maps anywhere else."""
    try:
        mapping = layout.map(path)
    except HostPathError as exc:
        raise LocalPathError(str(exc)) from None
    if mapping.base != layout.root:
        raise LocalPathError(f"{path} is not in the node's own filesystem")
    layout.root.mkdir(parents=True, exist_ok=True)
    root = Path(os.path.realpath(layout.root))
    resolved = Path(os.path.realpath(mapping.machine_path))
    if resolved == root or root not in resolved.parents:
        raise LocalPathError(f"{path} leads outside the node's filesystem")
    return resolved


def make_directory(layout: HostPathLayout, path: str) -> Path:
    """Rule 1's directory."""
    target = confined(layout, path)
    try:
        target.mkdir(parents=True, exist_ok=True)
        os.chmod(target, 0o777)
    except OSError as exc:
        raise LocalPathError(f"making {path}: {exc.strerror}") from None
    if Path(os.path.realpath(target)) != target:
        raise LocalPathError(f"{path} changed while it was made")
    return target


def remove_directory(layout: HostPathLayout, path: str) -> None:
    """Rule 2's removal."""
    target = confined(layout, path)
    if not target.exists():
        return
    try:
        shutil.rmtree(target)
    except OSError as exc:
        raise LocalPathError(f"removing {path}: {exc.strerror}") from None


async def install_default_storage_class(client: KubeClient) -> None:
    """Rule 1 of :mod:`local_path`: kind's ``standard`` class, made once (an existing one is left as it is)."""
    with contextlib.suppress(KubeAlreadyExistsError):
        await client.create(kinds.STORAGE_CLASSES, local_path.default_storage_class())


class LocalPathProvisioner(Controller):
    name = local_path.PROVISIONER

    def __init__(
        self,
        client: KubeClient,
        informers: Informers,
        recorder: EventRecorder,
        settings: ControllerSettings,
        *,
        lab_dir: Path,
    ) -> None:
        self.lab_dir = lab_dir
        super().__init__(client, informers, recorder, settings)

    def setup(self) -> None:
        self.informers.persistentvolumeclaims.add_handler(
            on_add=self.enqueue, on_update=lambda old, new: self.enqueue(new)
        )
        self.informers.persistentvolumes.add_handler(
            on_add=self._volume_changed, on_update=lambda old, new: self._volume_changed(new)
        )

    @property
    def objects(self) -> Informer:
        return self.informers.persistentvolumeclaims

    def all_keys(self) -> list[Key]:
        i = self.informers
        return binding.claim_and_volume_keys(i.persistentvolumeclaims.items(), i.persistentvolumes.items())

    def _volume_changed(self, volume: Object) -> None:
        if local_path.provisioned_here(volume):
            self.queue.add(("", name_of(volume)))

    def layout(self, node: str) -> HostPathLayout:
        return HostPathLayout(self.lab_dir, node)

    async def reconcile(self, key: Key) -> float | None:
        if key[0] == "":
            volume = self.informers.persistentvolumes.find(key[1])
            if volume is not None and local_path.reclaimable(volume):
                await self._reclaim(volume)
            return None
        claim = self.find(key)
        if claim is None:
            return None
        class_name = binding.class_of(claim)
        storage_class = self.informers.storageclasses.find(class_name) if class_name else None
        nodes = {name_of(n) for n in self.informers.nodes.items()}
        decision = local_path.provisioning(claim, storage_class, nodes)
        if isinstance(decision, local_path.Refuse):
            self.recorder.record(claim, "Warning", "ProvisioningFailed", decision.message, "Provision")
        elif isinstance(decision, local_path.Provision) and storage_class is not None:
            await self._provision(claim, storage_class, decision.node)
        return None

    async def _provision(self, claim: Object, storage_class: Object, node: str) -> None:
        name = local_path.volume_name(claim)
        if self.informers.persistentvolumes.find(name) is not None:
            return
        path = local_path.directory(claim)
        try:
            make_directory(self.layout(node), path)
        except LocalPathError as exc:
            log.warning("claim %s/%s: %s", *key_of(claim), exc)
            self.recorder.record(claim, "Warning", "ProvisioningFailed", str(exc), "Provision")
            return
        try:
            await self.client.create(
                kinds.PERSISTENT_VOLUMES, local_path.provisioned_volume(claim, storage_class, node)
            )
        except KubeAlreadyExistsError:
            return
        namespace, claim_name = key_of(claim)
        note = f"Successfully provisioned volume {name}"
        self.recorder.record(claim, "Normal", "ProvisioningSucceeded", note, "Provision")
        log.info("provisioned %s for claim %s/%s on %s at %s", name, namespace, claim_name, node, path)

    async def _reclaim(self, volume: Object) -> None:
        node, path = local_path.volume_node(volume), local_path.volume_path(volume)
        if node is not None and self.informers.nodes.find(node) is None:
            node = None  # a node name is a path element: only a real node's tree is touched
        if node is not None and path is not None:
            try:
                remove_directory(self.layout(node), path)
            except LocalPathError as exc:
                log.warning("volume %s: %s", name_of(volume), exc)
                self.recorder.record(volume, "Warning", "VolumeFailedDelete", str(exc), "Delete")
                return
        with contextlib.suppress(KubeNotFoundError):
            await self.client.delete(kinds.PERSISTENT_VOLUMES, name_of(volume))
        log.info("deleted volume %s and its directory %s", name_of(volume), path)

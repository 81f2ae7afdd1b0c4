"""The PersistentVolume controller: kube-controller-manager's persistent-volume-binder, pvc-protection and
pv-protection controllers in one loop. Decisions are :mod:`volume_binding`'s; this is the I/O.

Keys: a claim is ``(namespace, name)``; a volume, cluster-scoped, is ``("", name)`` (claims always have a
namespace, so the two never collide). Claim, volume, pod and class events queue the keys they concern.

A claim's reconcile:

1. Being deleted: its ``kubernetes.io/pvc-protection`` finalizer goes once no pod that is not finished uses it.
2. Unbound (no ``volumeName``): the best available volume (:func:`volume_binding.best_volume`; for a
   WaitForFirstConsumer class only one the scheduler pre-bound) gets the claim as its ``claimRef``, then the claim
   gets ``volumeName`` and ``pv.kubernetes.io/bind-completed``. With no volume and a class whose provisioner is
   someone else's, the claim is annotated ``volume.kubernetes.io/storage-provisioner`` (and the beta key) and an
   ``ExternalProvisioning`` Event says it waits; a WaitForFirstConsumer claim no pod has chosen a node for gets
   ``WaitForFirstConsumer``; a claim no volume can bind gets ``FailedBinding`` (kube's words).
3. Its status follows :func:`volume_binding.claim_phase`: Bound with the volume's capacity and access modes, Lost
   (with a Warning ``ClaimLost``) when its volume is gone, Pending otherwise.

A volume's reconcile:

4. Its phase follows :func:`volume_binding.volume_phase` (Available, Bound, Released), written through the status
   subresource with ``lastPhaseTransitionTime``; a Released volume with reclaim policy Retain stays so.
5. Being deleted: its ``kubernetes.io/pv-protection`` finalizer goes once it is not Bound.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from ambit.k8s import Informer, KubeConflictError, KubeNotFoundError, kinds
from ambit.lab.controllers import pods as podstate
from ambit.lab.controllers import volume_binding as binding
from ambit.lab.controllers.controller import Controller
from ambit.lab.controllers.ownership import Object, is_deleting, key_of, name_of
from ambit.lab.controllers.volume_scheduling import pod_claims
from ambit.lab.controllers.workqueue import Key

log = logging.getLogger("ambit.lab.controllers.persistentvolume")

CLAIM_PROTECTION = "kubernetes.io/pvc-protection"
VOLUME_PROTECTION = "kubernetes.io/pv-protection"


class PersistentVolumeController(Controller):
    name = "persistentvolume-controller"

    def setup(self) -> None:
        self.informers.persistentvolumeclaims.add_handler(
            on_add=self._claim_changed,
            on_update=lambda old, new: self._claim_changed(new),
            on_delete=self._claim_changed,
        )
        self.informers.persistentvolumes.add_handler(
            on_add=self._volume_changed,
            on_update=lambda old, new: self._volume_changed(new),
            on_delete=self._volume_changed,
        )
        self.informers.pods.add_handler(on_update=lambda old, new: self._pod_changed(new), on_delete=self._pod_changed)
        self.informers.storageclasses.add_handler(
            on_add=self._class_changed, on_update=lambda o, n: self._class_changed(n)
        )

    @property
    def objects(self) -> Informer:
        return self.informers.persistentvolumeclaims

    def all_keys(self) -> list[Key]:
        i = self.informers
        return binding.claim_and_volume_keys(i.persistentvolumeclaims.items(), i.persistentvolumes.items())

    # -- events ---------------------------------------------------------------------------------------------
    def _claim_changed(self, claim: Object) -> None:
        self.queue.add(key_of(claim))
        for volume in self.informers.persistentvolumes.items():
            if binding.claim_ref(volume).get("name") == name_of(claim):
                self.queue.add(("", name_of(volume)))

    def _volume_changed(self, volume: Object) -> None:
        self.queue.add(("", name_of(volume)))
        ref = binding.claim_ref(volume)
        if ref.get("namespace") and ref.get("name"):
            self.queue.add((str(ref["namespace"]), str(ref["name"])))
        for claim in self.informers.persistentvolumeclaims.items():
            if not binding.spec_of(claim).get("volumeName"):
                self.queue.add(key_of(claim))

    def _pod_changed(self, pod: Object) -> None:
        namespace = key_of(pod)[0]
        for name in pod_claims(pod):
            self.queue.add((namespace, name))

    def _class_changed(self, storage_class: Object) -> None:
        for claim in self.informers.persistentvolumeclaims.items():
            if binding.class_of(claim) == name_of(storage_class):
                self.queue.add(key_of(claim))

    # -- reconcile ------------------------------------------------------------------------------------------
    async def reconcile(self, key: Key) -> float | None:
        if key[0] == "":
            volume = self.informers.persistentvolumes.find(key[1])
            if volume is not None:
                await self._sync_volume(volume)
            return None
        claim = self.find(key)
        if claim is None:
            return None
        if is_deleting(claim):
            await self._release_claim(claim)
            return None
        if not binding.spec_of(claim).get("volumeName"):
            await self._bind(claim)
        claim = self.find(key) or claim
        await self._sync_claim_status(claim)
        return None

    def _in_use(self, claim: Object) -> bool:
        namespace, name = key_of(claim)
        return any(
            key_of(pod)[0] == namespace and name in pod_claims(pod) and not podstate.is_terminal(pod)
            for pod in self.informers.pods.items()
        )

    async def _release_claim(self, claim: Object) -> None:
        """Rule 1."""
        if not self._in_use(claim):
            await self._drop_finalizer(kinds.PERSISTENT_VOLUME_CLAIMS, claim, CLAIM_PROTECTION)

    async def _drop_finalizer(self, kind: kinds.ResourceKind, obj: Object, finalizer: str) -> None:
        meta = obj.get("metadata") or {}
        finalizers = list(meta.get("finalizers") or [])
        if finalizer not in finalizers:
            return
        body = {
            "metadata": {
                "finalizers": [f for f in finalizers if f != finalizer],
                "resourceVersion": meta.get("resourceVersion"),
            }
        }
        namespace = key_of(obj)[0] if kind.namespaced else None
        with contextlib.suppress(KubeNotFoundError):
            await self.client.patch(kind, name_of(obj), body, namespace)

    async def _bind(self, claim: Object) -> None:
        """Rule 2."""
        class_name = binding.class_of(claim)
        storage_class = self.informers.storageclasses.find(class_name) if class_name else None
        late = storage_class is not None and storage_class.get("volumeBindingMode") == binding.WAIT_FOR_FIRST_CONSUMER
        volumes = self.informers.persistentvolumes.items()
        if late:
            volumes = [v for v in volumes if binding.refers_to(v, claim)]
        volume = binding.best_volume(claim, volumes)
        if volume is not None:
            await self._bind_pair(claim, volume)
            return
        if storage_class is not None and storage_class.get("provisioner"):
            if late and not binding.annotations_of(claim).get(binding.SELECTED_NODE):
                self.recorder.record(
                    claim,
                    "Normal",
                    "WaitForFirstConsumer",
                    "waiting for first consumer to be created before binding",
                    "Binding",
                )
                return
            provisioner = str(storage_class["provisioner"])
            if binding.annotations_of(claim).get(binding.STORAGE_PROVISIONER) != provisioner:
                annotations = {binding.STORAGE_PROVISIONER: provisioner, binding.BETA_STORAGE_PROVISIONER: provisioner}
                await self.client.patch(
                    kinds.PERSISTENT_VOLUME_CLAIMS,
                    name_of(claim),
                    {"metadata": {"annotations": annotations}},
                    key_of(claim)[0],
                )
                note = (
                    f"Waiting for a volume to be created either by the external provisioner '{provisioner}' or "
                    "manually by the system administrator. If volume creation is delayed, please verify that the "
                    "provisioner is running and correctly registered."
                )
                self.recorder.record(claim, "Normal", "ExternalProvisioning", note, "Provisioning")
            return
        message = (
            f'storageclass.storage.k8s.io "{class_name}" not found'
            if class_name and storage_class is None
            else "no persistent volumes available for this claim and no storage class is set"
        )
        self.recorder.record(claim, "Warning" if class_name else "Normal", "FailedBinding", message, "Binding")

    async def _bind_pair(self, claim: Object, volume: Mapping[str, Any]) -> None:
        namespace, name = key_of(claim)
        if not binding.refers_to(volume, claim):
            meta = volume.get("metadata") or {}
            body: dict[str, Any] = {
                "metadata": {
                    "resourceVersion": meta.get("resourceVersion"),
                    "annotations": {binding.BOUND_BY_CONTROLLER: "yes"},
                },
                "spec": {"claimRef": binding.claim_ref_for(claim)},
            }
            try:
                await self.client.patch(kinds.PERSISTENT_VOLUMES, name_of(volume), body)
            except KubeConflictError:
                self.queue.add(key_of(claim))
                return
        claim_meta = claim.get("metadata") or {}
        patch = {
            "metadata": {
                "resourceVersion": claim_meta.get("resourceVersion"),
                "annotations": {binding.BIND_COMPLETED: "yes", binding.BOUND_BY_CONTROLLER: "yes"},
            },
            "spec": {"volumeName": name_of(volume)},
        }
        await self.client.patch(kinds.PERSISTENT_VOLUME_CLAIMS, name, patch, namespace)
        log.info("bound claim %s/%s to volume %s", namespace, name, name_of(volume))

    async def _sync_claim_status(self, claim: Object) -> None:
        """Rule 3."""
        volume_name = binding.spec_of(claim).get("volumeName")
        volume = self.informers.persistentvolumes.find(str(volume_name)) if volume_name else None
        phase = binding.claim_phase(claim, volume)
        status: dict[str, Any] = binding.bound_status(volume) if phase == "Bound" and volume else {"phase": phase}
        before = claim.get("status") or {}
        if all(before.get(k) == v for k, v in status.items()):
            return
        if phase == "Lost" and before.get("phase") != "Lost":
            note = "Bound claim has lost its PersistentVolume. Data on the volume is lost!"
            self.recorder.record(claim, "Warning", "ClaimLost", note, "Binding")
        if phase != "Bound":
            status.update({"accessModes": None, "capacity": None})
        await self.client.patch_status(
            kinds.PERSISTENT_VOLUME_CLAIMS, name_of(claim), {"status": status}, key_of(claim)[0]
        )

    async def _sync_volume(self, volume: Object) -> None:
        """Rules 4 and 5."""
        ref = binding.claim_ref(volume)
        claim = (
            self.informers.persistentvolumeclaims.find(str(ref.get("name")), str(ref.get("namespace")))
            if ref.get("name") and ref.get("namespace")
            else None
        )
        phase = binding.volume_phase(volume, claim)
        if is_deleting(volume) and phase != "Bound":
            await self._drop_finalizer(kinds.PERSISTENT_VOLUMES, volume, VOLUME_PROTECTION)
            return
        before = volume.get("status") or {}
        if before.get("phase") == phase or (before.get("phase") == "Failed" and phase == "Released"):
            return
        status = {"phase": phase, "lastPhaseTransitionTime": podstate.rfc3339(self.clock())}
        with contextlib.suppress(KubeNotFoundError):
            await self.client.patch_status(kinds.PERSISTENT_VOLUMES, name_of(volume), {"status": status})

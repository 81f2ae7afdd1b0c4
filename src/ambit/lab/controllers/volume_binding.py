"""How claims and PersistentVolumes pair up (pure): kube's PV controller's matching and phases.

Rules:

1. A volume is *available to* a claim when it is not being deleted, its phase is not Released or Failed, its
   ``claimRef`` is empty or names this claim (namespace, name, and uid when the ref has one), its
   ``storageClassName`` equals the claim's (both may be empty), its ``volumeMode`` equals the claim's (Filesystem
   when absent), it offers every access mode the claim asks for, its capacity is at least the claim's request, the
   claim's ``selector`` selects its labels, and a claim that names a ``volumeName`` names it.
2. :func:`best_volume`: a volume pre-bound to the claim (its ``claimRef`` names it) wins; otherwise the smallest
   available volume, then the first name (kube's ``findBestMatchForClaim``). A claim of a class in
   WaitForFirstConsumer mode only binds volumes whose node affinity admits its selected node.
3. A volume's phase (:func:`volume_phase`): no ``claimRef`` is Available; a ``claimRef`` to a claim that exists
   (and has the ref's uid, when it has one) is Bound; a ``claimRef`` with a uid whose claim is gone (or is another
   claim of that name) is Released.
4. A claim's phase (:func:`claim_phase`): no ``volumeName`` is Pending; a ``volumeName`` whose volume exists and
   points back at the claim is Bound; one whose volume is gone is Lost; one whose volume points elsewhere stays
   Pending (the binder has not finished).
5. A bound claim's status carries the volume's capacity and access modes.
6. Quantities that do not parse make a volume unavailable and a claim's request unknown (it matches nothing): a
   hostile object is never an exception.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from ambit.lab.controllers.ownership import is_deleting, key_of, name_of
from ambit.lab.controllers.placement import term_matches
from ambit.lab.controllers.selectors import labels_of
from ambit.lab.controllers.workqueue import Key
from ambit.model.errors import QuantityError
from ambit.model.labels import selector_matches
from ambit.model.quantity import parse_quantity

SELECTED_NODE = "volume.kubernetes.io/selected-node"
STORAGE_PROVISIONER = "volume.kubernetes.io/storage-provisioner"
BETA_STORAGE_PROVISIONER = "volume.beta.kubernetes.io/storage-provisioner"
BIND_COMPLETED = "pv.kubernetes.io/bind-completed"
BOUND_BY_CONTROLLER = "pv.kubernetes.io/bound-by-controller"
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
WAIT_FOR_FIRST_CONSUMER = "WaitForFirstConsumer"


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def spec_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return _mapping(obj.get("spec"))


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return _mapping(_mapping(obj.get("metadata")).get("annotations"))


def uid_of(obj: Mapping[str, Any]) -> str:
    return str(_mapping(obj.get("metadata")).get("uid") or "")


def class_of(obj: Mapping[str, Any]) -> str:
    """A claim's or volume's ``storageClassName`` (``""`` when none)."""
    value = spec_of(obj).get("storageClassName")
    return value if isinstance(value, str) else ""


def access_modes(obj: Mapping[str, Any]) -> set[str]:
    modes = spec_of(obj).get("accessModes")
    return {m for m in modes if isinstance(m, str)} if isinstance(modes, list) else set()


def volume_mode(obj: Mapping[str, Any]) -> str:
    value = spec_of(obj).get("volumeMode")
    return value if isinstance(value, str) and value else "Filesystem"


def requested(claim: Mapping[str, Any]) -> Decimal | None:
    """The claim's ``resources.requests.storage`` (rule 6: None when it does not parse)."""
    raw = _mapping(_mapping(spec_of(claim).get("resources")).get("requests")).get("storage")
    try:
        return parse_quantity(raw)
    except QuantityError:
        return None


def capacity(volume: Mapping[str, Any]) -> Decimal | None:
    try:
        return parse_quantity(_mapping(spec_of(volume).get("capacity")).get("storage"))
    except QuantityError:
        return None


def claim_ref(volume: Mapping[str, Any]) -> Mapping[str, Any]:
    return _mapping(spec_of(volume).get("claimRef"))


def refers_to(volume: Mapping[str, Any], claim: Mapping[str, Any]) -> bool:
    """The volume's ``claimRef`` names ``claim`` (and its uid, when the ref has one)."""
    ref = claim_ref(volume)
    namespace, name = key_of(claim)
    if not ref or ref.get("namespace") != namespace or ref.get("name") != name:
        return False
    return not ref.get("uid") or ref.get("uid") == uid_of(claim)


def node_admits(volume: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """The volume's required node affinity (when it has one) admits ``node``."""
    required = _mapping(_mapping(spec_of(volume).get("nodeAffinity")).get("required"))
    if not required:
        return True
    terms = required.get("nodeSelectorTerms")
    return isinstance(terms, list) and any(isinstance(t, Mapping) and term_matches(t, node) for t in terms)


def available_to(volume: Mapping[str, Any], claim: Mapping[str, Any]) -> bool:
    """Rule 1."""
    if is_deleting(volume) or _mapping(volume.get("status")).get("phase") in ("Released", "Failed"):
        return False
    if claim_ref(volume) and not refers_to(volume, claim):
        return False
    spec = spec_of(claim)
    wanted = spec.get("volumeName")
    if wanted and wanted != name_of(volume):
        return False
    if class_of(volume) != class_of(claim) or volume_mode(volume) != volume_mode(claim):
        return False
    if not access_modes(claim) <= access_modes(volume):
        return False
    size, need = capacity(volume), requested(claim)
    if size is None or need is None or size < need:
        return False
    selector = spec.get("selector")
    return selector is None or selector_matches(selector, labels_of(volume))


def best_volume(
    claim: Mapping[str, Any], volumes: Iterable[Mapping[str, Any]], node: Mapping[str, Any] | None = None
) -> Mapping[str, Any] | None:
    """Rule 2; ``node``, when given, must be admitted by the volume's node affinity."""
    fits = [v for v in volumes if available_to(v, claim) and (node is None or node_admits(v, node))]
    for volume in fits:
        if claim_ref(volume):
            return volume
    if not fits:
        return None
    return min(fits, key=lambda v: (capacity(v) or Decimal(0), name_of(v)))


def volume_phase(volume: Mapping[str, Any], claim: Mapping[str, Any] | None) -> str:
    """Rule 3; ``claim`` is the claim its ``claimRef`` names, as found (None: none of that name)."""
    ref = claim_ref(volume)
    if not ref:
        return "Available"
    if claim is not None and refers_to(volume, claim):
        return "Bound"
    return "Released" if ref.get("uid") else "Available"


def claim_phase(claim: Mapping[str, Any], volume: Mapping[str, Any] | None) -> str:
    """Rule 4; ``volume`` is the one its ``volumeName`` names, as found."""
    if not spec_of(claim).get("volumeName"):
        return "Pending"
    if volume is None:
        return "Lost"
    return "Bound" if refers_to(volume, claim) else "Pending"


def bound_status(volume: Mapping[str, Any]) -> dict[str, Any]:
    """Rule 5: the status of a claim bound to ``volume``."""
    spec = spec_of(volume)
    modes = spec.get("accessModes")
    cap = spec.get("capacity")
    return {
        "phase": "Bound",
        "accessModes": list(modes) if isinstance(modes, list) else [],
        "capacity": dict(cap) if isinstance(cap, Mapping) else {},
    }


def claim_ref_for(claim: Mapping[str, Any]) -> dict[str, Any]:
    """The ``claimRef`` a volume bound to ``claim`` carries."""
    namespace, name = key_of(claim)
    meta = _mapping(claim.get("metadata"))
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "namespace": namespace,
        "name": name,
        "uid": uid_of(claim),
        "resourceVersion": str(meta.get("resourceVersion") or ""),
    }


def claim_and_volume_keys(claims: Iterable[Mapping[str, Any]], volumes: Iterable[Mapping[str, Any]]) -> list[Key]:
    """The work-queue keys of every claim (namespace, name) and every volume ("", name): what a controller of both
    kinds resyncs."""
    return [key_of(c) for c in claims] + [("", name_of(v)) for v in volumes]

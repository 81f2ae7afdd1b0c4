"""A pod's volumes as the kubelet sets them up, computed without I/O: what each volume is, what files it holds, and
how a container's ``volumeMounts`` bind them.

Theory of operation. :func:`parse_volumes` turns ``spec.volumes`` into :data:`Volume` values once per pod (a bad
or unsupported volume is a :class:`VolumeError` without ``retry``). ``configMap``, ``secret``, ``downwardAPI`` and
``projected`` volumes are all :class:`ProjectedVolume`: a list of sources whose files :func:`volume_payload`
computes from :class:`VolumeInputs` (the objects and tokens the shell, :mod:`ambit.lab.runtime.volumes_apply`,
fetched). The shell writes a payload as the kubelet's AtomicWriter does and compares payloads to decide whether a
resync changes anything. :func:`host_path_action` is kube's hostPath ``type`` check on what the shell found at the
path. :func:`container_mounts` turns one container's ``volumeMounts`` into bind mounts.

Rules:

1. Supported volume types: ``emptyDir`` (a directory of the pod; ``medium: Memory`` is a plain directory too and
   ``sizeLimit`` is not enforced), ``hostPath``, ``persistentVolumeClaim`` (rule 10), ``configMap``, ``secret``,
   ``downwardAPI`` and ``projected`` (sources ``configMap``, ``secret``, ``downwardAPI``,
   ``serviceAccountToken``). Any other type is refused.
2. File modes: an item's ``mode``, else the volume's ``defaultMode``, else 0644 (kube's default, for Secrets
   too: the volume's directory is what isolates the pod). Modes are 0 to 0777.
3. Item paths are relative, hold no ``..`` element and do not start with ``..`` (the writer's own names).
4. A missing ConfigMap or Secret is ``configmap "<name>" not found`` (``secret ...``), retried, unless
   ``optional``; then it contributes nothing. A missing key named by ``items`` is
   ``configmap references non-existent config key: <key>`` (``references non-existent secret key``), unless
   ``optional``.
5. downwardAPI files: ``metadata.name``, ``namespace``, ``uid``, ``labels`` and ``annotations`` (all of them as
   sorted ``key="value"`` lines, or one with ``['key']``), and ``resourceFieldRef`` of a named container: its
   limit or request divided by ``divisor`` (default 1) and rounded up; an unset limit is the node's allocatable.
6. serviceAccountToken: ``expirationSeconds`` at least 600 (default 3600), ``audience`` empty for the API
   server's own; the token comes from a TokenRequest bound to the pod (the shell refreshes it at 80% of its life).
7. hostPath ``type``: ``""`` checks nothing (a missing directory is created, as containerd does);
   ``DirectoryOrCreate`` and ``FileOrCreate`` create what is missing (0755 directory, empty 0644 file);
   ``Directory``, ``File``, ``Socket``, ``CharDevice``, ``BlockDevice`` must find that kind of file, else
   ``hostPath type check failed: <path> is not a ...``, kube's text, retried.
8. volumeMounts: the volume must exist; ``mountPath`` is absolute; ``subPath`` (or ``subPathExpr`` expanded
   with the container's environment) is relative without ``..``; configMap, secret, downwardAPI and projected
   volumes are always read-only; ``mountPropagation`` None (default) is ``rprivate``, HostToContainer ``rslave``,
   Bidirectional ``rshared`` and only for privileged containers.
9. Nested mount points (kube's ``MakeNestedMountpoints``): a container mount whose ``mountPath`` lies under the
   ``mountPath`` of a configMap, secret, downwardAPI or projected volume in the same container gets its mount
   point made inside that read-only volume when the volume is set up (the runtime cannot make it there), unless
   its first element starts with ``..`` (the writer's own names) or a file of the volume already has that name.
10. persistentVolumeClaim (:func:`claimed_path`): the claim must exist (else ``persistentvolumeclaim "<name>" not
    found``, retried) and be bound (phase Bound with a ``volumeName``, else kube's ``PVC <ns>/<name> has
    non-bound phase ("Pending") or empty pvc.Spec.VolumeName ("")``, retried); its volume must exist, point back
    at the claim, and have a ``hostPath`` or ``local`` source, whose path the shell confines to the node's own
    tree as it does a hostPath volume (more strictly: the CNI, netns and ``/proc``-like mappings are refused too).
    The claim volume's ``readOnly`` makes every mount of it read-only.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

from ambit.errors import AmbitError
from ambit.lab.runtime.oci_spec import SecurityContextError, VolumeMount, parse_quantity

DEFAULT_MODE = 0o644
MIN_TOKEN_SECONDS = 600
DEFAULT_TOKEN_SECONDS = 3600
PLUGIN_DIRS = {
    "emptyDir": "kubernetes.io~empty-dir",
    "configMap": "kubernetes.io~configmap",
    "secret": "kubernetes.io~secret",
    "downwardAPI": "kubernetes.io~downward-api",
    "projected": "kubernetes.io~projected",
}
"""Where each kind of volume lives under ``<pod dir>/volumes/`` (the kubelet's names)."""
UNSUPPORTED = (
    "ephemeral",
    "csi",
    "nfs",
    "iscsi",
    "gitRepo",
    "image",
    "awsElasticBlockStore",
    "gcePersistentDisk",
    "azureDisk",
    "azureFile",
    "cephfs",
    "rbd",
    "fc",
    "flexVolume",
    "glusterfs",
)
PROPAGATION = {"None": "rprivate", "HostToContainer": "rslave", "Bidirectional": "rshared"}
HOST_PATH_TYPES = ("", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket", "CharDevice", "BlockDevice")
_DOWNWARD_FIELDS = ("metadata.name", "metadata.namespace", "metadata.uid", "metadata.labels", "metadata.annotations")
_RESOURCES = tuple(
    f"{group}.{name}" for group in ("limits", "requests") for name in ("cpu", "memory", "ephemeral-storage")
)


class VolumeError(AmbitError):
    """A volume cannot be set up (the kubelet's FailedMount); ``retry`` when a later attempt may succeed."""

    def __init__(self, message: str, *, retry: bool) -> None:
        super().__init__(message)
        self.retry = retry


# -- what a pod's volumes are -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class KeyToPath:
    key: str
    path: str
    mode: int | None = None


@dataclass(frozen=True, slots=True)
class ObjectSource:
    """A ConfigMap's or a Secret's keys as files."""

    kind: Literal["configmap", "secret"]
    name: str
    items: tuple[KeyToPath, ...] = ()
    optional: bool = False


@dataclass(frozen=True, slots=True)
class DownwardItem:
    path: str
    field_path: str = ""
    container: str = ""
    resource: str = ""
    divisor: str = "1"
    mode: int | None = None


@dataclass(frozen=True, slots=True)
class DownwardSource:
    items: tuple[DownwardItem, ...]


@dataclass(frozen=True, slots=True)
class TokenSource:
    path: str
    audience: str = ""
    expiration_seconds: int = DEFAULT_TOKEN_SECONDS


Source = ObjectSource | DownwardSource | TokenSource


@dataclass(frozen=True, slots=True)
class EmptyDirVolume:
    name: str
    medium: str = ""


@dataclass(frozen=True, slots=True)
class HostPathVolume:
    name: str
    path: str
    type: str = ""


@dataclass(frozen=True, slots=True)
class ProjectedVolume:
    name: str
    plugin: str
    """``configMap``, ``secret``, ``downwardAPI`` or ``projected``: only where the files live."""
    sources: tuple[Source, ...]
    default_mode: int = DEFAULT_MODE


@dataclass(frozen=True, slots=True)
class ClaimVolume:
    """A ``persistentVolumeClaim`` volume: the claim's bound volume, looked up when the pod starts (rule 10)."""

    name: str
    claim: str
    read_only: bool = False


Volume = EmptyDirVolume | HostPathVolume | ProjectedVolume | ClaimVolume


def parse_volumes(pod: Mapping[str, Any]) -> tuple[Volume, ...]:
    """Rule 1; :class:`VolumeError` (no retry) for what the lab cannot set up or kube would not accept."""
    volumes: list[Volume] = []
    seen: set[str] = set()
    listed = _mapping(pod.get("spec")).get("volumes") or ()
    if not isinstance(listed, list | tuple):
        raise VolumeError("spec.volumes must be a list", retry=False)
    for raw in listed:
        spec = _mapping(raw)
        name = str(spec.get("name") or "")
        if not name or name in seen:
            raise VolumeError(f"volume name {name!r} is empty or used twice", retry=False)
        seen.add(name)
        volumes.append(_volume(name, spec))
    return tuple(volumes)


def _volume(name: str, spec: Mapping[str, Any]) -> Volume:
    types = [key for key in spec if key != "name" and spec[key] is not None]
    if len(types) != 1:
        raise VolumeError(f'volume "{name}": exactly one volume type is needed, not {sorted(types)}', retry=False)
    kind, body = types[0], _mapping(spec[types[0]])
    if kind == "emptyDir":
        return EmptyDirVolume(name, str(body.get("medium") or ""))
    if kind == "hostPath":
        path, host_type = str(body.get("path") or ""), str(body.get("type") or "")
        if host_type not in HOST_PATH_TYPES:
            raise VolumeError(f"{host_type} is an invalid volume type", retry=False)
        return HostPathVolume(name, path, host_type)
    if kind in ("configMap", "secret"):
        object_kind: Literal["configmap", "secret"] = "configmap" if kind == "configMap" else "secret"
        ref = str(body.get("name") if kind == "configMap" else body.get("secretName") or "")
        source = ObjectSource(object_kind, ref, _key_items(name, body), body.get("optional") is True)
        return ProjectedVolume(name, kind, (source,), _default_mode(name, body))
    if kind == "downwardAPI":
        mode = _default_mode(name, body)
        return ProjectedVolume(name, kind, (DownwardSource(_downward_items(name, body)),), mode)
    if kind == "projected":
        listed = body.get("sources") or ()
        if not isinstance(listed, list | tuple):
            raise VolumeError(f'volume "{name}": projected sources must be a list', retry=False)
        sources = tuple(_projection(name, _mapping(s)) for s in listed)
        return ProjectedVolume(name, kind, sources, _default_mode(name, body))
    if kind == "persistentVolumeClaim":
        claim = body.get("claimName")
        if not isinstance(claim, str) or not claim:
            raise VolumeError(f'volume "{name}": persistentVolumeClaim.claimName is required', retry=False)
        return ClaimVolume(name, claim, body.get("readOnly") is True)
    if kind in UNSUPPORTED:
        raise VolumeError(f'volume "{name}": {kind} volumes are not supported by the lab', retry=False)
    raise VolumeError(f'volume "{name}": unknown volume type {kind!r}', retry=False)


def _projection(volume: str, spec: Mapping[str, Any]) -> Source:
    kinds = [key for key in spec if spec[key] is not None]
    if len(kinds) != 1:
        raise VolumeError(f'volume "{volume}": each projected source needs exactly one type', retry=False)
    kind, body = kinds[0], _mapping(spec[kinds[0]])
    if kind in ("configMap", "secret"):
        object_kind: Literal["configmap", "secret"] = "configmap" if kind == "configMap" else "secret"
        items = _key_items(volume, body)
        return ObjectSource(object_kind, str(body.get("name") or ""), items, body.get("optional") is True)
    if kind == "downwardAPI":
        return DownwardSource(_downward_items(volume, body))
    if kind == "serviceAccountToken":
        seconds = body.get("expirationSeconds", DEFAULT_TOKEN_SECONDS)
        if isinstance(seconds, bool) or not isinstance(seconds, int) or not MIN_TOKEN_SECONDS <= seconds < 2**32:
            raise VolumeError(
                f'volume "{volume}": expirationSeconds may not specify a duration less than 10 minutes', retry=False
            )
        return TokenSource(_item_path(volume, body.get("path")), str(body.get("audience") or ""), seconds)
    raise VolumeError(f'volume "{volume}": projected source {kind!r} is not supported by the lab', retry=False)


def _key_items(volume: str, body: Mapping[str, Any]) -> tuple[KeyToPath, ...]:
    items = []
    for raw in _list(volume, body.get("items")):
        item = _mapping(raw)
        key = str(item.get("key") or "")
        if not key:
            raise VolumeError(f'volume "{volume}": an item has no key', retry=False)
        items.append(KeyToPath(key, _item_path(volume, item.get("path")), _mode(volume, item.get("mode"), None)))
    return tuple(items)


def _downward_items(volume: str, body: Mapping[str, Any]) -> tuple[DownwardItem, ...]:
    items = []
    for raw in _list(volume, body.get("items")):
        item = _mapping(raw)
        path, mode = _item_path(volume, item.get("path")), _mode(volume, item.get("mode"), None)
        field, resource = _mapping(item.get("fieldRef")), _mapping(item.get("resourceFieldRef"))
        if field:
            field_path = str(field.get("fieldPath") or "")
            if field_path not in _DOWNWARD_FIELDS and _selected_key(field_path) is None:
                raise VolumeError(f'volume "{volume}": unsupported fieldRef {field_path!r}', retry=False)
            items.append(DownwardItem(path, field_path=field_path, mode=mode))
        elif resource:
            name, container = str(resource.get("resource") or ""), str(resource.get("containerName") or "")
            if name not in _RESOURCES or not container:
                raise VolumeError(
                    f'volume "{volume}": resourceFieldRef needs a containerName and one of {", ".join(_RESOURCES)}',
                    retry=False,
                )
            divisor = str(resource.get("divisor") or "1")
            items.append(DownwardItem(path, container=container, resource=name, divisor=divisor, mode=mode))
        else:
            raise VolumeError(f'volume "{volume}": item {path!r} needs a fieldRef or a resourceFieldRef', retry=False)
    return tuple(items)


def _selected_key(field_path: str) -> tuple[str, str] | None:
    for source in ("labels", "annotations"):
        prefix = f"metadata.{source}['"
        if field_path.startswith(prefix) and field_path.endswith("']") and len(field_path) > len(prefix) + 2:
            return source, field_path[len(prefix) : -2]
    return None


def _item_path(volume: str, value: Any) -> str:
    """Rule 3."""
    path = str(value or "")
    parts = path.split("/")
    if not path or path.startswith("/") or ".." in parts or path.startswith(".."):
        raise VolumeError(
            f"volume \"{volume}\": path {path!r} must be relative, without '..' and not start with '..'", retry=False
        )
    return "/".join(p for p in parts if p and p != ".")


def _default_mode(volume: str, body: Mapping[str, Any]) -> int:
    mode = _mode(volume, body.get("defaultMode"), DEFAULT_MODE)
    return DEFAULT_MODE if mode is None else mode


def _mode(volume: str, value: Any, default: int | None) -> int | None:
    """Rule 2."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0o777:
        raise VolumeError(f'volume "{volume}": mode {value!r} must be a number from 0 to 0777 (octal)', retry=False)
    return value


# -- what a volume's files are ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class FileData:
    data: bytes
    mode: int


Payload = Mapping[str, FileData]
"""Relative path → content and mode."""


@dataclass(frozen=True, slots=True)
class VolumeInputs:
    """What the shell fetched for the payloads: objects by name (None: not found), tokens by source."""

    pod: Mapping[str, Any]
    config_maps: Mapping[str, Mapping[str, bytes] | None]
    secrets: Mapping[str, Mapping[str, bytes] | None]
    tokens: Mapping[TokenSource, str]
    allocatable: Mapping[str, str]
    """The node's allocatable resources (``cpu``, ``memory``, ``ephemeral-storage``), for unset limits."""


def object_refs(volumes: tuple[Volume, ...]) -> set[tuple[str, str]]:
    """``("configmap" | "secret", name)`` of every object the volumes read."""
    return {
        (s.kind, s.name)
        for v in volumes
        if isinstance(v, ProjectedVolume)
        for s in v.sources
        if isinstance(s, ObjectSource)
    }


def token_sources(volumes: tuple[Volume, ...]) -> set[TokenSource]:
    return {s for v in volumes if isinstance(v, ProjectedVolume) for s in v.sources if isinstance(s, TokenSource)}


def object_data(kind: str, obj: Mapping[str, Any]) -> dict[str, bytes]:
    """A ConfigMap's ``data`` and ``binaryData`` or a Secret's ``data``, as bytes (undecodable values dropped)."""
    out: dict[str, bytes] = {}
    encoded = dict(_mapping(obj.get("binaryData"))) if kind == "configmap" else dict(_mapping(obj.get("data")))
    for key, value in encoded.items():
        try:
            out[str(key)] = base64.b64decode(str(value), validate=True)
        except (binascii.Error, ValueError):
            continue
    if kind == "configmap":
        out.update({str(k): str(v).encode() for k, v in _mapping(obj.get("data")).items()})
    return out


def volume_payload(volume: ProjectedVolume, inputs: VolumeInputs) -> dict[str, FileData]:
    """Rules 2 to 6: the files of a configMap, secret, downwardAPI or projected volume."""
    files: dict[str, FileData] = {}
    for source in volume.sources:
        if isinstance(source, ObjectSource):
            files.update(_object_files(source, inputs, volume.default_mode))
        elif isinstance(source, DownwardSource):
            for item in source.items:
                text = _downward_value(item, inputs)
                files[item.path] = FileData(text.encode(), _pick_mode(item.mode, volume.default_mode))
        else:
            token = inputs.tokens.get(source)
            if token is None:
                raise VolumeError(f"no token for audience {source.audience!r} yet", retry=True)
            files[source.path] = FileData(token.encode(), volume.default_mode)
    return files


def _pick_mode(mode: int | None, default: int) -> int:
    return default if mode is None else mode


def _object_files(source: ObjectSource, inputs: VolumeInputs, default_mode: int) -> dict[str, FileData]:
    data = (inputs.config_maps if source.kind == "configmap" else inputs.secrets).get(source.name)
    if data is None:
        if source.optional:
            return {}
        raise VolumeError(f'{source.kind} "{source.name}" not found', retry=True)
    if not source.items:
        return {key: FileData(value, default_mode) for key, value in data.items() if _valid_key(key)}
    files: dict[str, FileData] = {}
    for item in source.items:
        if item.key not in data:
            if source.optional:
                continue
            what = "configmap references non-existent config key" if source.kind == "configmap" else None
            raise VolumeError(f"{what or 'references non-existent secret key'}: {item.key}", retry=True)
        files[item.path] = FileData(data[item.key], _pick_mode(item.mode, default_mode))
    return files


def _valid_key(key: str) -> bool:
    """Keys become file names: kube's key syntax never allows ``/`` or a ``..`` prefix."""
    return bool(key) and "/" not in key and not key.startswith("..")


def _downward_value(item: DownwardItem, inputs: VolumeInputs) -> str:
    """Rule 5."""
    meta = _mapping(inputs.pod.get("metadata"))
    if item.field_path:
        selected = _selected_key(item.field_path)
        if selected is not None:
            return str(_mapping(meta.get(selected[0])).get(selected[1], ""))
        if item.field_path in ("metadata.labels", "metadata.annotations"):
            entries = _mapping(meta.get(item.field_path.split(".", 1)[1]))
            return "\n".join(f"{k}={json.dumps(str(entries[k]), ensure_ascii=False)}" for k in sorted(entries))
        return str(meta.get(item.field_path.split(".", 1)[1]) or "")
    containers = _mapping(inputs.pod.get("spec")).get("containers") or ()
    container = next((_mapping(c) for c in containers if _mapping(c).get("name") == item.container), None)
    if container is None:
        raise VolumeError(f"resourceFieldRef: no container {item.container!r} in the pod", retry=False)
    group, resource = item.resource.split(".", 1)
    values = _mapping(_mapping(container.get("resources")).get(group))
    raw = values.get(resource)
    if raw is None and group == "limits":
        raw = inputs.allocatable.get(resource)
    try:
        value = parse_quantity(raw if raw is not None else "0")
        divisor = parse_quantity(item.divisor)
    except SecurityContextError as exc:
        raise VolumeError(f"resourceFieldRef {item.resource}: {exc}", retry=False) from None
    if divisor <= 0:
        raise VolumeError(f"resourceFieldRef {item.resource}: divisor must be positive", retry=False)
    return str(math.ceil(value / divisor))


# -- persistentVolumeClaim ----------------------------------------------------------------------------------------
def claimed_path(
    namespace: str, volume: ClaimVolume, claim: Mapping[str, Any] | None, pv: Mapping[str, Any] | None
) -> str:
    """Rule 10: the path, as the node sees it, of the volume bound to ``volume.claim`` (``claim`` and ``pv`` as
    fetched; None when not found)."""
    if claim is None:
        raise VolumeError(f'persistentvolumeclaim "{volume.claim}" not found', retry=True)
    spec, status = _mapping(claim.get("spec")), _mapping(claim.get("status"))
    phase, bound = str(status.get("phase") or ""), str(spec.get("volumeName") or "")
    if phase != "Bound" or not bound:
        raise VolumeError(
            f'PVC {namespace}/{volume.claim} has non-bound phase ("{phase}") or empty pvc.Spec.VolumeName ("{bound}")',
            retry=True,
        )
    if pv is None:
        raise VolumeError(f'persistentvolume "{bound}" not found', retry=True)
    ref = _mapping(_mapping(pv.get("spec")).get("claimRef"))
    if ref.get("namespace") != namespace or ref.get("name") != volume.claim:
        raise VolumeError(f"persistentvolume {bound!r} is not bound to claim {namespace}/{volume.claim}", retry=True)
    pv_spec = _mapping(pv.get("spec"))
    for source in ("hostPath", "local"):
        path = _mapping(pv_spec.get(source)).get("path")
        if isinstance(path, str) and path:
            return path
    raise VolumeError(
        f"persistentvolume {bound!r}: only hostPath and local volumes are supported by the lab", retry=False
    )


# -- hostPath -----------------------------------------------------------------------------------------------------
class FileKind(Enum):
    DIRECTORY = "directory"
    FILE = "file"
    SOCKET = "socket"
    CHAR_DEVICE = "character device"
    BLOCK_DEVICE = "block device"
    OTHER = "other"


def file_kind(mode: int) -> FileKind:
    """The kind of a file from its ``st_mode``."""
    for test, kind in (
        (stat.S_ISDIR, FileKind.DIRECTORY),
        (stat.S_ISREG, FileKind.FILE),
        (stat.S_ISSOCK, FileKind.SOCKET),
        (stat.S_ISCHR, FileKind.CHAR_DEVICE),
        (stat.S_ISBLK, FileKind.BLOCK_DEVICE),
    ):
        if test(mode):
            return kind
    return FileKind.OTHER


HostPathAction = Literal["none", "mkdir", "create-file"]

_REQUIRED = {
    "Directory": (FileKind.DIRECTORY, "a directory"),
    "DirectoryOrCreate": (FileKind.DIRECTORY, "a directory"),
    "File": (FileKind.FILE, "a file"),
    "FileOrCreate": (FileKind.FILE, "a file"),
    "Socket": (FileKind.SOCKET, "a socket file"),
    "CharDevice": (FileKind.CHAR_DEVICE, "a character device"),
    "BlockDevice": (FileKind.BLOCK_DEVICE, "a block device"),
}


def host_path_action(host_type: str, found: FileKind | None, shown: str) -> HostPathAction:
    """Rule 7: what to do about ``found`` (None: nothing there) at the pod's hostPath ``shown``."""
    if host_type == "":
        return "mkdir" if found is None else "none"
    if found is None and host_type == "DirectoryOrCreate":
        return "mkdir"
    if found is None and host_type == "FileOrCreate":
        return "create-file"
    if host_type not in _REQUIRED:
        raise VolumeError(f"{host_type} is an invalid volume type", retry=False)
    kind, text = _REQUIRED[host_type]
    if found is not kind:
        raise VolumeError(f"hostPath type check failed: {shown} is not {text}", retry=True)
    return "none"


# -- volumeMounts -------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class VolumeSource:
    """A set-up volume, as the machine has it."""

    path: str
    read_only: bool
    """Always mounted read-only (configMap, secret, downwardAPI, projected)."""


@dataclass(frozen=True, slots=True)
class MountPlan:
    """One volumeMount: ``mount.source`` is ``volume_root`` joined with ``sub_path``; the shell checks that it
    stays inside ``volume_root`` once symbolic links are resolved (and creates a missing sub-path directory when
    ``creatable``: a volume the pod may write)."""

    mount: VolumeMount
    volume_root: str
    sub_path: str
    creatable: bool


def container_mounts(
    container: Mapping[str, Any],
    sources: Mapping[str, VolumeSource],
    *,
    privileged: bool,
    expand: Callable[[str], str],
) -> tuple[MountPlan, ...]:
    """Rule 8 for one container; :class:`VolumeError` (no retry) for a mount kube would refuse."""
    plans: list[MountPlan] = []
    cname = str(container.get("name") or "")
    for raw in container.get("volumeMounts") or ():
        spec = _mapping(raw)
        name, destination = str(spec.get("name") or ""), str(spec.get("mountPath") or "")
        source = sources.get(name)
        if source is None:
            raise VolumeError(f'container "{cname}": volumeMount "{name}" names no volume of the pod', retry=False)
        if not destination.startswith("/") or ".." in destination.split("/"):
            raise VolumeError(
                f"container \"{cname}\": mountPath {destination!r} must be absolute, without '..'", retry=False
            )
        sub_path = str(spec.get("subPath") or "")
        if spec.get("subPathExpr"):
            if sub_path:
                raise VolumeError(f'container "{cname}": subPath and subPathExpr are mutually exclusive', retry=False)
            sub_path = expand(str(spec["subPathExpr"]))
        if sub_path.startswith("/") or ".." in sub_path.split("/"):
            raise VolumeError(
                f"container \"{cname}\": subPath {sub_path!r} must be a relative path without '..'", retry=False
            )
        sub_path = "/".join(p for p in sub_path.split("/") if p and p != ".")
        mode = str(spec.get("mountPropagation") or "None")
        if mode not in PROPAGATION:
            raise VolumeError(f'container "{cname}": unknown mountPropagation {mode!r}', retry=False)
        if mode == "Bidirectional" and not privileged:
            raise VolumeError("Bidirectional mount propagation is available only to privileged containers", retry=False)
        path = f"{source.path.rstrip('/')}/{sub_path}" if sub_path else source.path
        read_only = source.read_only or spec.get("readOnly") is True
        mount = VolumeMount(path, "/" + "/".join(p for p in destination.split("/") if p), read_only, PROPAGATION[mode])
        plans.append(MountPlan(mount, source.path, sub_path, not source.read_only))
    return tuple(plans)


def nested_mount_points(pod: Mapping[str, Any], volume: str) -> tuple[str, ...]:
    """Rule 9: the mount points (relative paths) to make inside ``volume`` for mounts nested under it."""
    spec = _mapping(pod.get("spec"))
    found: set[str] = set()
    for container in (*(spec.get("initContainers") or ()), *(spec.get("containers") or ())):
        mounts = [_mapping(m) for m in _mapping(container).get("volumeMounts") or ()]
        paths = [(str(m.get("name") or ""), _elements(str(m.get("mountPath") or ""))) for m in mounts]
        for name, parent in paths:
            if name != volume or not parent:
                continue
            for _, child in paths:
                if len(child) > len(parent) and child[: len(parent)] == parent:
                    relative = child[len(parent) :]
                    if not relative[0].startswith("..") and ".." not in relative:
                        found.add("/".join(relative))
    return tuple(sorted(found))


def _elements(path: str) -> tuple[str, ...]:
    return tuple(p for p in path.split("/") if p and p != ".")


def _list(volume: str, value: Any) -> list[Any] | tuple[Any, ...]:
    if not value:
        return ()
    if not isinstance(value, list | tuple):
        raise VolumeError(f'volume "{volume}": items must be a list', retry=False)
    return value


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}

"""The checks of the Pod Security Standards (baseline and restricted), evaluated on a pod's metadata and spec.

Theory of operation: each check is a pure function of (metadata, spec) that returns a :class:`Violation` (a
short reason and a detail naming the offending containers, volumes or values) or None. :func:`violations` runs the
checks of a level and version in kube's order and wording, so that a refusal reads as kube-apiserver's does.

Rules:

1. Levels are ordered privileged < baseline < restricted. Privileged runs no check; baseline runs the baseline
   checks; restricted runs the baseline checks and the restricted ones.
2. A restricted check may replace a baseline check it covers (kube's ``OverrideCheckIDs``): at restricted,
   ``unrestricted capabilities`` replaces ``non-default capabilities``, ``restricted volume types`` replaces
   ``hostPath volumes``, and the restricted ``seccompProfile`` replaces the baseline one.
3. Order: baseline checks sorted by id, then restricted checks sorted by id (kube's registry order); the
   violation list keeps that order.
4. A check applies from the policy version it appeared in (``since``); a newer variant of a check (more allowed
   sysctls or SELinux types) applies from its version. Versions are minor numbers of v1; ``latest`` is
   :data:`LATEST_MINOR`, the version this API server reports.
5. Containers are visited in the order containers, initContainers, ephemeralContainers, as kube's visitor does.
6. Malformed fields (a string where an object is expected) are read as absent: validation, not this module, is
   where a malformed pod is refused.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

LATEST_MINOR = 32
"""The Kubernetes minor version this API server reports (discovery), which ``latest`` means."""


class Level(enum.IntEnum):
    PRIVILEGED = 0
    BASELINE = 1
    RESTRICTED = 2

    def __str__(self) -> str:
        return self.name.lower()


@dataclass(frozen=True, slots=True)
class Violation:
    reason: str
    detail: str

    def __str__(self) -> str:
        return f"{self.reason} ({self.detail})" if self.detail else self.reason


Pod = tuple[Mapping[str, Any], Mapping[str, Any]]
CheckFn = Callable[[Mapping[str, Any], Mapping[str, Any], int], Violation | None]


def _obj(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _containers(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for key in ("containers", "initContainers", "ephemeralContainers"):
        for container in _list(spec.get(key)):
            if isinstance(container, Mapping):
                yield container


def _name(container: Mapping[str, Any]) -> str:
    return str(container.get("name", ""))


def _sc(container: Mapping[str, Any]) -> Mapping[str, Any]:
    return _obj(container.get("securityContext"))


def _plural(singular: str, plural: str, count: int) -> str:
    return singular if count == 1 else plural


def _quoted(items: list[str]) -> str:
    return ", ".join(f'"{item}"' for item in items)


def _containers_phrase(names: list[str]) -> str:
    return f"{_plural('container', 'containers', len(names))} {_quoted(names)}"


# -- baseline -------------------------------------------------------------------------------------------------
APPARMOR_ANNOTATION_PREFIX = "container.apparmor.security.beta.kubernetes.io/"


def _app_armor(meta: Mapping[str, Any], spec: Mapping[str, Any], minor: int) -> Violation | None:
    setters: list[str] = []
    values: set[str] = set()

    def bad(sc: Mapping[str, Any]) -> bool:
        profile = sc.get("appArmorProfile")
        if not isinstance(profile, Mapping):
            return False
        kind = str(profile.get("type", ""))
        if kind in ("RuntimeDefault", "Localhost"):
            return False
        values.add(kind)
        return True

    if bad(_obj(spec.get("securityContext"))):
        setters.append("pod")
    containers = [_name(c) for c in _containers(spec) if bad(_sc(c))]
    if containers:
        setters.append(_containers_phrase(containers))
    value_list = sorted(values)
    annotations = sorted(
        f"{key}={value}"
        for key, value in _obj(meta.get("annotations")).items()
        if str(key).startswith(APPARMOR_ANNOTATION_PREFIX)
        and value
        and value != "runtime/default"
        and not str(value).startswith("localhost/")
    )
    if annotations:
        value_list += annotations
        setters.append(_plural("annotation", "annotations", len(annotations)))
    if not setters:
        return None
    return Violation(
        _plural("forbidden AppArmor profile", "forbidden AppArmor profiles", len(value_list)),
        f"{' and '.join(setters)} must not set AppArmor profile type to {_quoted(value_list)}",
    )


BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
        "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
    }
)  # fmt: skip


def _added(container: Mapping[str, Any]) -> list[str]:
    return [str(c) for c in _list(_obj(_sc(container).get("capabilities")).get("add"))]


def _capabilities_baseline(meta: Mapping[str, Any], spec: Mapping[str, Any], minor: int) -> Violation | None:
    names: list[str] = []
    caps: set[str] = set()
    for container in _containers(spec):
        extra = [c for c in _added(container) if c not in BASELINE_CAPABILITIES]
        if extra:
            names.append(_name(container))
            caps.update(extra)
    if not names:
        return None
    return Violation(
        "non-default capabilities",
        f"{_containers_phrase(names)} must not include {_quoted(sorted(caps))} in securityContext.capabilities.add",
    )


def _host_namespaces(meta: Mapping[str, Any], spec: Mapping[str, Any], minor: int) -> Violation | None:
    shared = [f"{key}=true" for key in ("hostIPC", "hostNetwork", "hostPID") if spec.get(key) is True]
    return Violation("host namespaces", ", ".join(shared)) if shared else None


def _host_path_volumes(meta: Mapping[str, Any], spec: Mapping[str, Any], minor: int) -> Violation | None:
    names = [str(_obj(v).get("name", "")) for v in _list(spec.get("volumes")) if _obj(v).get("hostPath") is not None]
    if not names:
        return None
    return Violation("hostPath volumes", f"{_plural('volume', 'volumes', len(names))} {_quoted(names)}")


def _host_ports(meta: Mapping[str, Any], spec: Mapping[str, Any], minor: int) -> Violation | None:
    names: list[str] = []
    ports: set[int] = set()
    for container in _containers(spec):
        used = [p["hostPort"] for p in map(_obj, _list(container.get("ports"))) if p.get("hostPort") not in (None, 0)]
        if used:
            names.append(_name(container))
            ports.update(int(p) for p in used if isinstance(p, int))
    if not names:
        return None
    shown = ", ".join(str(p) for p in sorted(ports, key=str))
    return Violation(
        "hostPort",
        f"{_containers_phrase(names)} {_plural('uses', 'use', len(names))} "
        f"{_plural('hostPort', 'hostPorts', len(ports))} {shown}",
    )


def _privileged(meta: Mapping[str, Any], spec: Mapping[str, Any], minor: int) -> Violation | None:
    names = [_name(c) for c in _containers(spec) if _sc(c).get("privileged") is True]
    if not names:
        return None
    return Violation("privileged", f"{_containers_phrase(names)} must not set securityContext.privileged=true")


def _proc_mount(meta: Mapping[str, Any], spec: Mapping[str, Any], minor: int) -> Violation | None:
    names: list[str] = []
    kinds: set[str] = set()
    for container in _containers(spec):
        mount = _sc(container).get("procMount")
        if mount is not None and mount != "Default":
            names.append(_name(container))
            kinds.add(str(mount))
    if not names:
        return None
    return Violation(
        "procMount", f"{_containers_phrase(names)} must not set securityContext.procMount to {_quoted(sorted(kinds))}"
    )


def _se_linux(meta: Mapping[str, Any], spec: Mapping[str, Any], minor: int) -> Violation | None:
    allowed = {"", "container_t", "container_init_t", "container_kvm_t"}
    if minor >= 31:
        allowed.add("container_engine_t")
    bad_types: set[str] = set()
    flags = {"user": False, "role": False}

    def bad(sc: Mapping[str, Any]) -> bool:
        options = sc.get("seLinuxOptions")
        if not isinstance(options, Mapping):
            return False
        ok = True
        kind = str(options.get("type") or "")
        if kind not in allowed:
            bad_types.add(kind)
            ok = False
        for key in ("user", "role"):
            if options.get(key):
                flags[key] = True
                ok = False
        return not ok

    setters = ["pod"] if bad(_obj(spec.get("securityContext"))) else []
    names = [_name(c) for c in _containers(spec) if bad(_sc(c))]
    if names:
        setters.append(_containers_phrase(names))
    if not setters:
        return None
    data: list[str] = []
    if bad_types:
        data.append(f"{_plural('type', 'types', len(bad_types))} {_quoted(sorted(bad_types))}")
    data += [f"{key} may not be set" for key in ("user", "role") if flags[key]]
    return Violation(
        "seLinuxOptions", f"{' and '.join(setters)} set forbidden securityContext.seLinuxOptions: {'; '.join(data)}"
    )


def _seccomp_type(sc: Mapping[str, Any]) -> str | None:
    profile = sc.get("seccompProfile")
    return str(profile.get("type", "")) if isinstance(profile, Mapping) else None


def _seccomp(spec: Mapping[str, Any], *, required: bool) -> Violation | None:
    setters: list[str] = []
    values: set[str] = set()
    pod_type = _seccomp_type(_obj(spec.get("securityContext")))
    pod_ok = pod_type in ("RuntimeDefault", "Localhost")
    if pod_type is not None and not pod_ok:
        setters.append("pod")
        values.add(pod_type)
    explicit: list[str] = []
    implicit: list[str] = []
    for container in _containers(spec):
        kind = _seccomp_type(_sc(container))
        if kind is None:
            if not pod_ok:
                implicit.append(_name(container))
        elif kind not in ("RuntimeDefault", "Localhost"):
            explicit.append(_name(container))
            values.add(kind)
    if explicit:
        setters.append(_containers_phrase(explicit))
    if setters:
        return Violation(
            "seccompProfile",
            f"{' and '.join(setters)} must not set securityContext.seccompProfile.type to {_quoted(sorted(values))}",
        )
    if required and implicit:
        return Violation(
            "seccompProfile",
            f"pod or {_containers_phrase(implicit)} must set securityContext.seccompProfile.type to "
            '"RuntimeDefault" or "Localhost"',
        )
    return None


def _seccomp_baseline(meta: Mapping[str, Any], spec: Mapping[str, Any], minor: int) -> Violation | None:
    return _seccomp(spec, required=False)


SAFE_SYSCTLS = (
    (0, ("kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies",
         "net.ipv4.ping_group_range", "net.ipv4.ip_unprivileged_port_start")),
    (27, ("net.ipv4.ip_local_reserved_ports",)),
    (29, ("net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
          "net.ipv4.tcp_keepalive_probes")),
    (32, ("net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem")),
)  # fmt: skip
"""The sysctls baseline allows, by the policy version that allowed them."""


def _sysctls(meta: Mapping[str, Any], spec: Mapping[str, Any], minor: int) -> Violation | None:
    allowed = {name for since, names in SAFE_SYSCTLS if minor >= since for name in names}
    sysctls = _list(_obj(spec.get("securityContext")).get("sysctls"))
    bad = [str(_obj(s).get("name", "")) for s in sysctls if str(_obj(s).get("name", "")) not in allowed]
    return Violation("forbidden sysctls", ", ".join(bad)) if bad else None


# -- restricted -----------------------------------------------------------------------------------------------
def _privilege_escalation(meta: Mapping[str, Any], spec: Mapping[str, Any], minor: int) -> Violation | None:
    names = [_name(c) for c in _containers(spec) if _sc(c).get("allowPrivilegeEscalation") is not False]
    if not names:
        return None
    return Violation(
        "allowPrivilegeEscalation != false",
        f"{_containers_phrase(names)} must set securityContext.allowPrivilegeEscalation=false",
    )


def _capabilities_restricted(meta: Mapping[str, Any], spec: Mapping[str, Any], minor: int) -> Violation | None:
    no_drop: list[str] = []
    adding: list[str] = []
    caps: set[str] = set()
    for container in _containers(spec):
        capabilities = _sc(container).get("capabilities")
        if not isinstance(capabilities, Mapping):
            no_drop.append(_name(container))
            continue
        if "ALL" not in [str(c) for c in _list(capabilities.get("drop"))]:
            no_drop.append(_name(container))
        extra = [c for c in _added(container) if c != "NET_BIND_SERVICE"]
        if extra:
            adding.append(_name(container))
            caps.update(extra)
    details: list[str] = []
    if no_drop:
        details.append(f'{_containers_phrase(no_drop)} must set securityContext.capabilities.drop=["ALL"]')
    if adding:
        details.append(
            f"{_containers_phrase(adding)} must not include {_quoted(sorted(caps))} in securityContext.capabilities.add"
        )
    return Violation("unrestricted capabilities", "; ".join(details)) if details else None


ALLOWED_VOLUME_SOURCES = (
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
)  # fmt: skip


def _restricted_volumes(meta: Mapping[str, Any], spec: Mapping[str, Any], minor: int) -> Violation | None:
    names: list[str] = []
    kinds: set[str] = set()
    for volume in map(_obj, _list(spec.get("volumes"))):
        sources = [key for key in volume if key != "name" and volume[key] is not None]
        if any(key in ALLOWED_VOLUME_SOURCES for key in sources):
            continue
        names.append(str(volume.get("name", "")))
        kinds.update(sources or ["unknown"])
    if not names:
        return None
    return Violation(
        "restricted volume types",
        f"{_plural('volume', 'volumes', len(names))} {_quoted(names)} {_plural('uses', 'use', len(names))} "
        f"{_plural('restricted volume type', 'restricted volume types', len(kinds))} {_quoted(sorted(kinds))}",
    )


def _run_as_non_root(meta: Mapping[str, Any], spec: Mapping[str, Any], minor: int) -> Violation | None:
    setters: list[str] = []
    pod_value = _obj(spec.get("securityContext")).get("runAsNonRoot")
    if pod_value is False:
        setters.append("pod")
    explicit: list[str] = []
    implicit: list[str] = []
    for container in _containers(spec):
        value = _sc(container).get("runAsNonRoot")
        if value is None:
            if pod_value is not True:
                implicit.append(_name(container))
        elif value is not True:
            explicit.append(_name(container))
    if explicit:
        setters.append(_containers_phrase(explicit))
    if setters:
        return Violation(
            "runAsNonRoot != true", f"{' and '.join(setters)} must not set securityContext.runAsNonRoot=false"
        )
    if implicit:
        return Violation(
            "runAsNonRoot != true", f"pod or {_containers_phrase(implicit)} must set securityContext.runAsNonRoot=true"
        )
    return None


def _run_as_user(meta: Mapping[str, Any], spec: Mapping[str, Any], minor: int) -> Violation | None:
    setters = ["pod"] if _obj(spec.get("securityContext")).get("runAsUser") == 0 else []
    names = [_name(c) for c in _containers(spec) if _sc(c).get("runAsUser") == 0]
    if names:
        setters.append(_containers_phrase(names))
    if not setters:
        return None
    return Violation("runAsUser=0", f"{' and '.join(setters)} must not set runAsUser=0")


def _seccomp_restricted(meta: Mapping[str, Any], spec: Mapping[str, Any], minor: int) -> Violation | None:
    return _seccomp(spec, required=True)


@dataclass(frozen=True, slots=True)
class Check:
    id: str
    level: Level
    since: int
    run: CheckFn
    overrides: str = ""
    """The id of the baseline check this restricted check replaces (rule 2)."""


CHECKS = (
    Check("appArmorProfile", Level.BASELINE, 0, _app_armor),
    Check("capabilities_baseline", Level.BASELINE, 0, _capabilities_baseline),
    Check("hostNamespaces", Level.BASELINE, 0, _host_namespaces),
    Check("hostPathVolumes", Level.BASELINE, 0, _host_path_volumes),
    Check("hostPorts", Level.BASELINE, 0, _host_ports),
    Check("privileged", Level.BASELINE, 0, _privileged),
    Check("procMount", Level.BASELINE, 0, _proc_mount),
    Check("seLinuxOptions", Level.BASELINE, 0, _se_linux),
    Check("seccompProfile_baseline", Level.BASELINE, 19, _seccomp_baseline),
    Check("sysctls", Level.BASELINE, 0, _sysctls),
    Check("allowPrivilegeEscalation", Level.RESTRICTED, 8, _privilege_escalation),
    Check("capabilities_restricted", Level.RESTRICTED, 22, _capabilities_restricted, "capabilities_baseline"),
    Check("restrictedVolumes", Level.RESTRICTED, 0, _restricted_volumes, "hostPathVolumes"),
    Check("runAsNonRoot", Level.RESTRICTED, 0, _run_as_non_root),
    Check("runAsUser", Level.RESTRICTED, 23, _run_as_user),
    Check("seccompProfile_restricted", Level.RESTRICTED, 19, _seccomp_restricted, "seccompProfile_baseline"),
)
"""Every check, in kube's order (rule 3)."""


def checks_for(level: Level, minor: int) -> list[Check]:
    """The checks a policy runs (rules 1, 2 and 4)."""
    chosen = [c for c in CHECKS if c.level <= level and c.since <= minor]
    replaced = {c.overrides for c in chosen if c.overrides}
    return [c for c in chosen if c.id not in replaced]


def violations(level: Level, minor: int, meta: Mapping[str, Any], spec: Mapping[str, Any]) -> list[Violation]:
    """What a pod with this metadata and spec violates at ``level`` and policy version ``v1.<minor>``."""
    found: list[Violation] = []
    for check in checks_for(level, minor):
        violation = check.run(_obj(meta), _obj(spec), minor)
        if violation is not None:
            found.append(violation)
    return found

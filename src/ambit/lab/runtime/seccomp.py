"""The seccomp filter of a lab container (``linux.seccomp`` of its OCI configuration), from its pod (pure).

Rules, in order:

Rule 1. A privileged container has no filter, whatever its profile says (as containerd and CRI-O: privileged is
        unconfined).
Rule 2. The profile is the container's ``securityContext.seccompProfile``, else the pod's, else ``RuntimeDefault``:
        the lab's kubelet runs with ``--seccomp-default``, so an unset profile is never unconfined.
Rule 3. ``RuntimeDefault`` is :mod:`ambit.lab.runtime.seccomp_default`: its allow-list, the calls of the
        machine's architecture, the calls of each capability in the container's bounding set, and the
        conditional rules (``clone`` without namespace flags, ``clone3`` ENOSYS, ``socket`` but AF_VSOCK, some
        ``personality`` values) for a container without ``CAP_SYS_ADMIN``. ``Unconfined`` is no filter.
Rule 4. ``Localhost`` needs ``localhostProfile``: a relative path without ``..`` (:func:`localhost_path`), read by
        the shell from the node's seccomp directory (``<node root>/var/lib/kubelet/seccomp``) and parsed by
        :func:`parse_profile`. A missing field or a bad path is a :class:`~ambit.lab.runtime.oci_spec`
        ``SecurityContextError`` (``CreateContainerConfigError``, the kubelet's); a file that is missing, too
        large or malformed is a :class:`SeccompProfileError` (``CreateContainerError``, the runtime's), with one
        line saying what is wrong, never the file's content.
Rule 5. A Localhost profile is the OCI form or Docker's/containerd's (``archMap``, ``includes``/``excludes`` by
        capability, architecture and ``minKernel``): it becomes the OCI form for this machine. Bounds:
        :data:`MAX_PROFILE_BYTES`, :data:`MAX_RULES` rules, :data:`MAX_NAMES` syscall names in all. Known
        actions only, and not ``SCMP_ACT_NOTIFY`` (the lab has no agent to notify).
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ambit.errors import AmbitError
from ambit.lab.runtime import seccomp_default as default

SECCOMP_DIR = "var/lib/kubelet/seccomp"
"""Under a node's root: the kubelet's ``--seccomp-profile-root``."""
MAX_PROFILE_BYTES = 1024 * 1024
MAX_RULES = 1024
MAX_NAMES = 8192
MAX_PATH = 4096

RUNTIME_DEFAULT, UNCONFINED, LOCALHOST = "RuntimeDefault", "Unconfined", "Localhost"
PROFILE_TYPES = (LOCALHOST, RUNTIME_DEFAULT, UNCONFINED)

ACTIONS = frozenset(
    {
        "SCMP_ACT_KILL",
        "SCMP_ACT_KILL_PROCESS",
        "SCMP_ACT_KILL_THREAD",
        "SCMP_ACT_TRAP",
        "SCMP_ACT_ERRNO",
        "SCMP_ACT_TRACE",
        "SCMP_ACT_ALLOW",
        "SCMP_ACT_LOG",
    }
)
OPERATORS = frozenset(
    {
        "SCMP_CMP_NE",
        "SCMP_CMP_LT",
        "SCMP_CMP_LE",
        "SCMP_CMP_EQ",
        "SCMP_CMP_GE",
        "SCMP_CMP_GT",
        "SCMP_CMP_MASKED_EQ",
    }
)
FLAGS = frozenset({"SECCOMP_FILTER_FLAG_TSYNC", "SECCOMP_FILTER_FLAG_LOG", "SECCOMP_FILTER_FLAG_SPEC_ALLOW"})
ARCHITECTURES = frozenset(
    f"SCMP_ARCH_{a}"
    for a in (
        "X86",
        "X86_64",
        "X32",
        "ARM",
        "AARCH64",
        "MIPS",
        "MIPS64",
        "MIPS64N32",
        "MIPSEL",
        "MIPSEL64",
        "MIPSEL64N32",
        "PPC",
        "PPC64",
        "PPC64LE",
        "S390",
        "S390X",
        "PARISC",
        "PARISC64",
        "RISCV64",
    )
)
GO_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}
"""Docker profiles name architectures in ``includes`` the Go way."""
_SYSCALL_NAME = re.compile(r"[a-z_][a-z0-9_]{0,63}")
_KERNEL = re.compile(r"([0-9]{1,4})\.([0-9]{1,4})")
_U64 = 2**64


class SeccompProfileError(AmbitError):
    """A Localhost profile cannot be used (rule 4): the runtime's ``CreateContainerError``."""

    reason = "CreateContainerError"


class SeccompFieldError(AmbitError):
    """``seccompProfile`` cannot be honoured as written (rule 4): the kubelet's ``CreateContainerConfigError``."""


@dataclass(frozen=True, slots=True)
class SeccompChoice:
    """The profile in effect (rules 1 and 2): its type, and for ``Localhost`` the path under the seccomp dir."""

    type: str
    localhost: str = ""


@dataclass(frozen=True, slots=True)
class Machine:
    """What a profile depends on of the machine."""

    arch: str = "x86_64"
    """``platform.machine()``."""
    kernel: tuple[int, int] = (6, 0)
    """``platform.release()``'s major and minor."""


def seccomp_choice(pod: Mapping[str, Any], container: Mapping[str, Any], *, privileged: bool) -> SeccompChoice:
    """Rules 1, 2 and 4's field checks; raises :class:`SeccompFieldError`."""
    if privileged:
        return SeccompChoice(UNCONFINED)
    spec = _mapping(pod.get("spec"))
    for owner in (_mapping(container.get("securityContext")), _mapping(spec.get("securityContext"))):
        profile = owner.get("seccompProfile")
        if profile is None:
            continue
        profile = _mapping(profile)
        kind = profile.get("type")
        if kind not in PROFILE_TYPES:
            raise SeccompFieldError(f"seccompProfile.type {kind!r} is not one of {', '.join(PROFILE_TYPES)}")
        if kind != LOCALHOST:
            return SeccompChoice(str(kind))
        return SeccompChoice(LOCALHOST, localhost_path(profile.get("localhostProfile")))
    return SeccompChoice(RUNTIME_DEFAULT)


def localhost_path(value: Any) -> str:
    """A ``localhostProfile`` made safe to join to the seccomp directory (rule 4); raises :class:`SeccompFieldError`."""
    if not isinstance(value, str) or not value:
        raise SeccompFieldError("seccompProfile.localhostProfile must be set when seccomp type is Localhost")
    if len(value) > MAX_PATH or "\0" in value:
        raise SeccompFieldError("seccompProfile.localhostProfile is not a usable path")
    if value.startswith("/"):
        raise SeccompFieldError(f"seccompProfile.localhostProfile {value!r} must be a relative path")
    parts = [p for p in value.split("/") if p and p != "."]
    if ".." in parts:
        raise SeccompFieldError(f"seccompProfile.localhostProfile {value!r} must not contain '..'")
    if not parts:
        raise SeccompFieldError(f"seccompProfile.localhostProfile {value!r} names no file")
    return "/".join(parts)


# -- rule 3 -------------------------------------------------------------------------------------------------------
def runtime_default(capabilities: Collection[str], machine: Machine) -> dict[str, Any]:
    """The ``RuntimeDefault`` filter for a container with this bounding set."""
    names = set(default.ALLOWED) | set(default.BY_ARCHITECTURE.get(machine.arch, ()))
    for cap, calls in default.BY_CAPABILITY.items():
        if cap in capabilities:
            names.update(calls)
    rules: list[dict[str, Any]] = [{"names": sorted(names), "action": "SCMP_ACT_ALLOW"}]
    for persona in default.PERSONALITIES:
        rules.append(_rule(["personality"], [{"index": 0, "value": persona, "op": "SCMP_CMP_EQ"}]))
    rules.append(_rule(["socket"], [{"index": 0, "value": default.AF_VSOCK, "op": "SCMP_CMP_NE"}]))
    if "CAP_SYS_ADMIN" not in capabilities:
        flags = default.CLONE_NAMESPACE_FLAGS
        rules.append(_rule(["clone"], [{"index": 0, "value": flags, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]))
        rules.append({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": default.ENOSYS})
    return {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": default.EPERM,
        "architectures": list(default.ARCHITECTURES.get(machine.arch, ())),
        "syscalls": rules,
    }


def _rule(names: list[str], args: list[dict[str, Any]]) -> dict[str, Any]:
    return {"names": names, "action": "SCMP_ACT_ALLOW", "args": args}


def seccomp_config(
    choice: SeccompChoice, capabilities: Collection[str], machine: Machine, localhost: bytes | None = None
) -> dict[str, Any] | None:
    """``linux.seccomp`` for the choice, or None (no filter); ``localhost`` is the file a Localhost choice names."""
    if choice.type == UNCONFINED:
        return None
    if choice.type == RUNTIME_DEFAULT:
        return runtime_default(capabilities, machine)
    if localhost is None:
        raise SeccompProfileError(f"seccomp profile {choice.localhost!r} was not read")
    return parse_profile(localhost, capabilities, machine, name=choice.localhost)


# -- rule 5 -------------------------------------------------------------------------------------------------------
def parse_profile(
    data: bytes, capabilities: Collection[str], machine: Machine, *, name: str = "profile"
) -> dict[str, Any]:
    """A Localhost profile (OCI, Docker or containerd form) as the OCI filter for this machine and bounding set;
    raises :class:`SeccompProfileError` naming ``name`` and the field at fault."""

    def fail(why: str) -> SeccompProfileError:
        return SeccompProfileError(f"cannot load seccomp profile {name!r}: {why}")

    if len(data) > MAX_PROFILE_BYTES:
        raise fail(f"larger than {MAX_PROFILE_BYTES} bytes")
    try:
        document = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise fail("not valid JSON") from None
    if not isinstance(document, dict):
        raise fail("not a JSON object")
    try:
        return _profile(document, capabilities, machine)
    except _Malformed as exc:
        raise fail(str(exc)) from None


class _Malformed(Exception):
    pass


def _profile(doc: Mapping[str, Any], capabilities: Collection[str], machine: Machine) -> dict[str, Any]:
    out: dict[str, Any] = {"defaultAction": _action(doc.get("defaultAction"), "defaultAction")}
    if doc.get("defaultErrnoRet") is not None:
        out["defaultErrnoRet"] = _uint(doc["defaultErrnoRet"], "defaultErrnoRet", 2**31)
    architectures = _architectures(doc, machine)
    if architectures:
        out["architectures"] = architectures
    flags = _strings(doc.get("flags"), "flags", 8)
    for flag in flags:
        if flag not in FLAGS:
            raise _Malformed(f"flags: unknown flag {flag!r}")
    if flags:
        out["flags"] = flags
    if doc.get("listenerPath") not in (None, ""):
        raise _Malformed("listenerPath: seccomp notification is not supported")
    rules = doc.get("syscalls")
    if rules is None:
        rules = []
    if not isinstance(rules, list):
        raise _Malformed("syscalls must be a list")
    if len(rules) > MAX_RULES:
        raise _Malformed(f"syscalls: more than {MAX_RULES} rules")
    syscalls: list[dict[str, Any]] = []
    total = 0
    for index, rule in enumerate(rules):
        where = f"syscalls[{index}]"
        if not isinstance(rule, dict):
            raise _Malformed(f"{where} must be an object")
        names = _strings(rule.get("names"), f"{where}.names", MAX_NAMES)
        if rule.get("name") is not None:  # Docker's older form
            names = [*names, *_strings([rule["name"]], f"{where}.name", 1)]
        if not names:
            raise _Malformed(f"{where} names no syscall")
        for syscall in names:
            if not _SYSCALL_NAME.fullmatch(syscall):
                raise _Malformed(f"{where}.names: {syscall[:64]!r} is not a syscall name")
        total += len(names)
        if total > MAX_NAMES:
            raise _Malformed(f"syscalls: more than {MAX_NAMES} names")
        entry: dict[str, Any] = {"names": names, "action": _action(rule.get("action"), f"{where}.action")}
        if rule.get("errnoRet") is not None:
            entry["errnoRet"] = _uint(rule["errnoRet"], f"{where}.errnoRet", 2**31)
        args = _args(rule.get("args"), f"{where}.args")
        if args:
            entry["args"] = args
        applies = _filter_holds(rule.get("includes"), f"{where}.includes", capabilities, machine, every=True)
        excluded = _filter_holds(rule.get("excludes"), f"{where}.excludes", capabilities, machine, every=False)
        if applies and not excluded:
            syscalls.append(entry)
    out["syscalls"] = syscalls
    return out


def _action(value: Any, where: str) -> str:
    if value == "SCMP_ACT_NOTIFY":
        raise _Malformed(f"{where}: SCMP_ACT_NOTIFY is not supported")
    if not isinstance(value, str) or value not in ACTIONS:
        raise _Malformed(f"{where}: {str(value)[:64]!r} is not a seccomp action")
    return value


def _uint(value: Any, where: str, limit: int = _U64) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < limit:
        raise _Malformed(f"{where} must be an integer from 0 to {limit - 1}")
    return value


def _strings(value: Any, where: str, limit: int) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _Malformed(f"{where} must be a list of strings")
    if len(value) > limit:
        raise _Malformed(f"{where}: more than {limit} entries")
    return list(value)


def _architectures(doc: Mapping[str, Any], machine: Machine) -> list[str]:
    found = _strings(doc.get("architectures"), "architectures", 32)
    arch_map = doc.get("archMap")
    if arch_map is not None:
        if not isinstance(arch_map, list) or len(arch_map) > 32:
            raise _Malformed("archMap must be a list of at most 32 entries")
        native = default.ARCHITECTURES.get(machine.arch, ("",))[0]
        for index, entry in enumerate(arch_map):
            if not isinstance(entry, dict):
                raise _Malformed(f"archMap[{index}] must be an object")
            arch = entry.get("architecture")
            subs = _strings(entry.get("subArchitectures"), f"archMap[{index}].subArchitectures", 8)
            for known in (arch, *subs):
                if known not in ARCHITECTURES:
                    raise _Malformed(f"archMap[{index}]: unknown architecture {str(known)[:64]!r}")
            if arch == native:
                found = [*found, arch, *subs]
    for arch in found:
        if arch not in ARCHITECTURES:
            raise _Malformed(f"architectures: unknown architecture {arch[:64]!r}")
    return list(dict.fromkeys(found))


def _args(value: Any, where: str) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > 6:
        raise _Malformed(f"{where} must be a list of at most 6 conditions")
    out: list[dict[str, Any]] = []
    for index, arg in enumerate(value):
        at = f"{where}[{index}]"
        if not isinstance(arg, dict):
            raise _Malformed(f"{at} must be an object")
        op = arg.get("op")
        if op not in OPERATORS:
            raise _Malformed(f"{at}.op: {str(op)[:64]!r} is not a seccomp comparison")
        condition = {
            "index": _uint(arg.get("index"), f"{at}.index", 6),
            "value": _uint(arg.get("value"), f"{at}.value"),
        }
        if arg.get("valueTwo") is not None:
            condition["valueTwo"] = _uint(arg["valueTwo"], f"{at}.valueTwo")
        condition["op"] = op
        out.append(condition)
    return out


def _filter_holds(value: Any, where: str, capabilities: Collection[str], machine: Machine, *, every: bool) -> bool:
    """Docker's ``includes`` (``every``: an empty filter holds) and ``excludes`` (any listed item holds)."""
    if value is None:
        return every
    if not isinstance(value, dict):
        raise _Malformed(f"{where} must be an object")
    caps = _strings(value.get("caps"), f"{where}.caps", 64)
    arches = _strings(value.get("arches"), f"{where}.arches", 32)
    kernel = value.get("minKernel")
    checks: list[bool] = []
    if caps:
        held = [c in capabilities for c in caps]
        checks.append(all(held) if every else any(held))
    if arches:
        names = {machine.arch, GO_ARCH.get(machine.arch, machine.arch)}
        checks.append(any(a in names for a in arches))
    if kernel not in (None, ""):
        match = _KERNEL.fullmatch(kernel) if isinstance(kernel, str) else None
        if match is None:
            raise _Malformed(f"{where}.minKernel must be like '4.8'")
        checks.append(machine.kernel >= (int(match.group(1)), int(match.group(2))))
    if every:
        return all(checks)
    return any(checks)


def kernel_version(release: str) -> tuple[int, int]:
    """``platform.release()`` (``6.1.0-18-amd64``) as (major, minor); (0, 0) when it says neither."""
    match = re.match(r"([0-9]+)\.([0-9]+)", release)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def syscall_names(config: Mapping[str, Any] | None) -> Sequence[str]:
    """Every syscall name a filter's rules mention (for tests and diagnostics)."""
    if not config:
        return ()
    return [name for rule in config.get("syscalls") or () for name in rule.get("names") or ()]

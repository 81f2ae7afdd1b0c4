"""Pod Security Admission: what kube-apiserver's built-in PodSecurity plugin decides about a write.

Theory of operation: a namespace's labels ``pod-security.kubernetes.io/<mode>`` and ``<mode>-version`` choose,
per mode (enforce, audit, warn), a level and a policy version; labels that are absent take the API server's
defaults (:class:`PodSecuritySettings`, kube's AdmissionConfiguration ``defaults``). The review functions here are
pure: they take the request's facts and return a :class:`Review` (a refusal, warnings, audit notes), which the
admission chain (:mod:`ambit.apiserver.admission_chain`) carries out. The checks themselves are
:mod:`ambit.apiserver.pod_security_checks`.

Rules, as kube's plugin:

1. Labels: a level must be ``privileged``, ``baseline`` or ``restricted``; a version ``latest`` or ``v1.<n>``.
   An invalid enforce level is read as ``restricted`` (fail closed), an invalid audit or warn level as
   ``privileged`` (fail open), an invalid version as ``latest``. A version newer than this server is evaluated
   as ``latest`` (and named as labelled).
2. Exemptions (usernames, namespaces, runtimeClassNames from the settings) skip every check of the request.
3. Pods: checked on create, and on an update of the main resource that changes the spec or a security annotation
   (seccomp, AppArmor); status and metadata-only updates, deletes and writes of other subresources (an eviction,
   a binding) are not checked. Enforce refuses with 403
   ``pods "<name>" is forbidden: violates PodSecurity "<level>:<version>": <violations>``; warn adds a warning
   ``would violate PodSecurity "<level>:<version>": <violations>``, only when the write is allowed.
4. Workloads with a pod template (Deployment, ReplicaSet, DaemonSet, StatefulSet, Job, ReplicationController, and
   CronJob's ``jobTemplate``) are never refused: their template is checked at the warn level, and a violation
   is a warning.
5. Namespaces: labels must be valid on create and whenever they change to something invalid (422). When an update
   makes the enforce level stricter (or changes its version), the namespace's existing pods are checked against
   the new level and the violators are named in warnings (``existing pods in namespace "<ns>" violate the new
   PodSecurity enforce level "<level>:<version>"``, then ``<pod> (and N other pods): <reasons>``).
6. Audit: kube writes audit annotations; this server has no audit log, so audit violations are returned as notes
   for the caller to log.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ambit.apiserver.pod_security_checks import LATEST_MINOR, Level, Violation, violations

LABEL_PREFIX = "pod-security.kubernetes.io/"
_VERSION = re.compile(r"^v1\.(0|[1-9][0-9]*)$")
LEVELS = "privileged, baseline, restricted"


class Mode(enum.Enum):
    ENFORCE = "enforce"
    AUDIT = "audit"
    WARN = "warn"


@dataclass(frozen=True, slots=True)
class LevelVersion:
    level: Level
    minor: int | None = None
    """None is ``latest``."""

    def __str__(self) -> str:
        return f"{self.level}:{'latest' if self.minor is None else f'v1.{self.minor}'}"

    @property
    def effective_minor(self) -> int:
        return LATEST_MINOR if self.minor is None else min(self.minor, LATEST_MINOR)


@dataclass(frozen=True, slots=True)
class Policy:
    enforce: LevelVersion
    audit: LevelVersion
    warn: LevelVersion

    def of(self, mode: Mode) -> LevelVersion:
        return {Mode.ENFORCE: self.enforce, Mode.AUDIT: self.audit, Mode.WARN: self.warn}[mode]

    @property
    def fully_privileged(self) -> bool:
        return all(lv.level is Level.PRIVILEGED for lv in (self.enforce, self.audit, self.warn))


DEFAULT_POLICY = Policy(LevelVersion(Level.BASELINE), LevelVersion(Level.PRIVILEGED), LevelVersion(Level.BASELINE))
"""Ambit's defaults: baseline enforced (and warned about) wherever a namespace says nothing."""


@dataclass(frozen=True, slots=True)
class PodSecuritySettings:
    """Kube's PodSecurityConfiguration: the defaults for unlabelled namespaces, and who is exempt."""

    defaults: Policy = DEFAULT_POLICY
    """The policy of each mode a namespace does not label."""
    exempt_usernames: frozenset[str] = frozenset()
    """Requests by these users are not checked."""
    exempt_namespaces: frozenset[str] = frozenset()
    """Pods in these namespaces are not checked."""
    exempt_runtime_classes: frozenset[str] = frozenset()
    """Pods with these ``runtimeClassName`` values are not checked."""


@dataclass(frozen=True, slots=True)
class LabelError:
    label: str
    value: str
    message: str

    @property
    def field(self) -> str:
        return f"metadata.labels[{self.label}]"


@dataclass(frozen=True, slots=True)
class Review:
    """What the plugin decided: ``forbidden`` (a 403 message), ``invalid`` (422 causes), warnings, audit notes."""

    forbidden: str = ""
    invalid: tuple[LabelError, ...] = ()
    warnings: tuple[str, ...] = ()
    audit: tuple[str, ...] = ()


ALLOWED = Review()


def parse_level(text: str) -> tuple[Level, str]:
    """The level a label names, or restricted and an error (rule 1)."""
    for level in Level:
        if text == str(level):
            return level, ""
    return Level.RESTRICTED, f"must be one of {LEVELS}"


def parse_version(text: str) -> tuple[int | None, str]:
    """The minor version a label names (None for latest), or latest and an error (rule 1)."""
    if text == "latest":
        return None, ""
    match = _VERSION.match(text)
    if match is None:
        return None, 'must be "latest" or "v1.x"'
    return int(match.group(1)), ""


def policy_from_labels(labels: Mapping[str, Any] | None, defaults: Policy) -> tuple[Policy, tuple[LabelError, ...]]:
    """A namespace's policy, with the errors of its invalid labels (rule 1)."""
    labels = labels if isinstance(labels, Mapping) else {}
    errors: list[LabelError] = []
    chosen: dict[Mode, LevelVersion] = {}
    for mode in Mode:
        current = defaults.of(mode)
        level, minor = current.level, current.minor
        level_key, version_key = f"{LABEL_PREFIX}{mode.value}", f"{LABEL_PREFIX}{mode.value}-version"
        if level_key in labels:
            value = str(labels[level_key])
            level, error = parse_level(value)
            if error:
                errors.append(LabelError(level_key, value, error))
                if mode is not Mode.ENFORCE:
                    level = Level.PRIVILEGED
        if version_key in labels:
            value = str(labels[version_key])
            minor, error = parse_version(value)
            if error:
                errors.append(LabelError(version_key, value, error))
        chosen[mode] = LevelVersion(level, minor)
    return Policy(chosen[Mode.ENFORCE], chosen[Mode.AUDIT], chosen[Mode.WARN]), tuple(errors)


def evaluate(lv: LevelVersion, meta: Mapping[str, Any], spec: Mapping[str, Any]) -> list[Violation]:
    if lv.level is Level.PRIVILEGED:
        return []
    return violations(lv.level, lv.effective_minor, meta, spec)


def describe(found: list[Violation]) -> str:
    return ", ".join(str(v) for v in found)


@dataclass(frozen=True, slots=True)
class PodRequest:
    """A write that carries a pod spec: a pod, or a workload's template."""

    operation: str
    namespace: str
    name: str
    username: str
    meta: Mapping[str, Any]
    spec: Mapping[str, Any]
    namespace_labels: Mapping[str, Any] | None
    old_meta: Mapping[str, Any] | None = None
    old_spec: Mapping[str, Any] | None = None
    subresource: str = ""


SECURITY_ANNOTATIONS = ("seccomp.security.alpha.kubernetes.io/", "container.seccomp.security.alpha.kubernetes.io/")
APPARMOR_PREFIX = "container.apparmor.security.beta.kubernetes.io/"


def _security_annotations(meta: Mapping[str, Any] | None) -> dict[str, Any]:
    annotations = (meta or {}).get("annotations")
    if not isinstance(annotations, Mapping):
        return {}
    prefixes = (*SECURITY_ANNOTATIONS, APPARMOR_PREFIX)
    return {k: v for k, v in annotations.items() if str(k).startswith(prefixes)}


def _significant(request: PodRequest) -> bool:
    """Rule 3: a create, or an update of the main resource that changes what the checks read."""
    if request.subresource not in ("", "ephemeralcontainers"):
        return False  # pods/eviction, pods/binding, pods/status: nothing the checks read is written
    if request.operation == "CREATE":
        return True
    if request.operation != "UPDATE":
        return False
    if request.subresource == "ephemeralcontainers":
        return True
    return request.spec != request.old_spec or _security_annotations(request.meta) != _security_annotations(
        request.old_meta
    )


def _exempt(settings: PodSecuritySettings, request: PodRequest) -> bool:
    runtime_class = request.spec.get("runtimeClassName")
    return (
        request.username in settings.exempt_usernames
        or request.namespace in settings.exempt_namespaces
        or (isinstance(runtime_class, str) and runtime_class in settings.exempt_runtime_classes)
    )


def review_pod(settings: PodSecuritySettings, request: PodRequest) -> Review:
    """Rules 2 and 3 for a pod."""
    if not _significant(request) or _exempt(settings, request):
        return ALLOWED
    policy, _ = policy_from_labels(request.namespace_labels, settings.defaults)
    if policy.fully_privileged:
        return ALLOWED
    enforced = evaluate(policy.enforce, request.meta, request.spec)
    if enforced:
        return Review(
            forbidden=f'pods "{request.name}" is forbidden: violates PodSecurity "{policy.enforce}": '
            f"{describe(enforced)}",
            audit=_audit(policy, request, enforced),
        )
    warned = enforced if policy.warn == policy.enforce else evaluate(policy.warn, request.meta, request.spec)
    warnings = (f'would violate PodSecurity "{policy.warn}": {describe(warned)}',) if warned else ()
    return Review(warnings=warnings, audit=_audit(policy, request, enforced))


def _audit(policy: Policy, request: PodRequest, enforced: list[Violation]) -> tuple[str, ...]:
    found = enforced if policy.audit == policy.enforce else evaluate(policy.audit, request.meta, request.spec)
    return (f'would violate PodSecurity "{policy.audit}": {describe(found)}',) if found else ()


def review_template(settings: PodSecuritySettings, request: PodRequest) -> Review:
    """Rule 4: a workload's pod template, warned about, never refused."""
    if request.subresource or request.operation not in ("CREATE", "UPDATE"):
        return ALLOWED
    if request.operation == "UPDATE" and not _significant(request):
        return ALLOWED
    if _exempt(settings, request):
        return ALLOWED
    policy, _ = policy_from_labels(request.namespace_labels, settings.defaults)
    warned = evaluate(policy.warn, request.meta, request.spec)
    warnings = (f'would violate PodSecurity "{policy.warn}": {describe(warned)}',) if warned else ()
    return Review(warnings=warnings, audit=_audit(policy, request, []))


@dataclass(frozen=True, slots=True)
class ExistingPod:
    name: str
    meta: Mapping[str, Any]
    spec: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class NamespaceRequest:
    operation: str
    name: str
    labels: Mapping[str, Any] | None
    old_labels: Mapping[str, Any] | None = None
    subresource: str = ""


def review_namespace(
    settings: PodSecuritySettings, request: NamespaceRequest, pods: Iterable[ExistingPod] = ()
) -> Review:
    """Rule 5. ``pods`` is only iterated when the enforce level became stricter."""
    if request.operation not in ("CREATE", "UPDATE") or request.subresource:
        return ALLOWED
    policy, errors = policy_from_labels(request.labels, settings.defaults)
    if request.operation == "CREATE":
        return Review(invalid=errors) if errors else ALLOWED
    old_policy, old_errors = policy_from_labels(request.old_labels, settings.defaults)
    if errors and errors != old_errors:
        return Review(invalid=errors)
    new, old = policy.enforce, old_policy.enforce
    if new == old or new.level is Level.PRIVILEGED or request.name in settings.exempt_namespaces:
        return ALLOWED
    if new.minor == old.minor and new.level <= old.level:
        return ALLOWED
    return Review(warnings=_existing_pod_warnings(settings, request.name, new, pods))


def _existing_pod_warnings(
    settings: PodSecuritySettings, namespace: str, enforce: LevelVersion, pods: Iterable[ExistingPod]
) -> tuple[str, ...]:
    by_reasons: dict[str, list[str]] = {}
    for pod in pods:
        runtime_class = pod.spec.get("runtimeClassName")
        if isinstance(runtime_class, str) and runtime_class in settings.exempt_runtime_classes:
            continue
        found = evaluate(enforce, pod.meta, pod.spec)
        if found:
            by_reasons.setdefault(", ".join(v.reason for v in found), []).append(pod.name)
    if not by_reasons:
        return ()
    lines = [f'existing pods in namespace "{namespace}" violate the new PodSecurity enforce level "{enforce}"']
    groups = sorted((sorted(names), reasons) for reasons, names in by_reasons.items())
    for names, reasons in groups:
        others = len(names) - 1
        more = f" (and {others} other {'pod' if others == 1 else 'pods'})" if others else ""
        lines.append(f"{names[0]}{more}: {reasons}")
    return tuple(lines)


WORKLOAD_TEMPLATES: dict[tuple[str, str], tuple[str, ...]] = {
    ("apps", "deployments"): ("spec", "template"),
    ("apps", "replicasets"): ("spec", "template"),
    ("apps", "daemonsets"): ("spec", "template"),
    ("apps", "statefulsets"): ("spec", "template"),
    ("batch", "jobs"): ("spec", "template"),
    ("", "replicationcontrollers"): ("spec", "template"),
    ("batch", "cronjobs"): ("spec", "jobTemplate", "spec", "template"),
}
"""Rule 4: the kinds whose pod template is checked, by (group, resource), and the path to the template."""


def template_of(key: tuple[str, str], obj: Mapping[str, Any] | None) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """The (metadata, spec) of a workload's pod template; empty mappings when absent or malformed."""
    node: Any = obj or {}
    for step in WORKLOAD_TEMPLATES.get(key, ()):
        node = node.get(step) if isinstance(node, Mapping) else None
    template = node if isinstance(node, Mapping) else {}
    meta, spec = template.get("metadata"), template.get("spec")
    return (meta if isinstance(meta, Mapping) else {}), (spec if isinstance(spec, Mapping) else {})

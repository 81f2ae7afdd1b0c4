"""The Pod Security Standards evaluator and the PodSecurity plugin's decisions, as table tests in kube's wording."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.apiserver.pod_security import (
    DEFAULT_POLICY,
    ExistingPod,
    LevelVersion,
    NamespaceRequest,
    PodRequest,
    PodSecuritySettings,
    policy_from_labels,
    review_namespace,
    review_pod,
    review_template,
    template_of,
)
from ambit.apiserver.pod_security_checks import Level, violations

JsonObject = dict[str, Any]


def spec(**fields: Any) -> JsonObject:
    """A pod spec with one container ``c``; ``c_*`` keys go into the container's securityContext."""
    container: JsonObject = {"name": "c", "image": "busybox"}
    sc = {k[2:]: fields.pop(k) for k in list(fields) if k.startswith("c_")}
    if sc:
        container["securityContext"] = sc
    if "ports" in fields:
        container["ports"] = fields.pop("ports")
    return {"containers": [container], **fields}


RESTRICTED_OK: JsonObject = {
    "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
    "containers": [
        {
            "name": "c",
            "image": "busybox",
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        }
    ],
}


# (name, spec, annotations, violation at baseline or None, violation at restricted or None)
CASES: list[tuple[str, JsonObject, dict[str, str], str | None, str | None]] = [
    (
        "hostNetwork",
        {**RESTRICTED_OK, "hostNetwork": True},
        {},
        "host namespaces (hostNetwork=true)",
        "host namespaces (hostNetwork=true)",
    ),
    (
        "all host namespaces, sorted",
        {**RESTRICTED_OK, "hostPID": True, "hostNetwork": True, "hostIPC": True},
        {},
        "host namespaces (hostIPC=true, hostNetwork=true, hostPID=true)",
        "host namespaces (hostIPC=true, hostNetwork=true, hostPID=true)",
    ),
    (
        "privileged",
        spec(c_privileged=True),
        {},
        'privileged (container "c" must not set securityContext.privileged=true)',
        None,
    ),
    (
        "capability beyond baseline",
        spec(c_capabilities={"add": ["NET_ADMIN", "CHOWN", "SYS_ADMIN"]}),
        {},
        'non-default capabilities (container "c" must not include "NET_ADMIN", "SYS_ADMIN" in '
        "securityContext.capabilities.add)",
        'unrestricted capabilities (container "c" must set securityContext.capabilities.drop=["ALL"]; container '
        '"c" must not include "CHOWN", "NET_ADMIN", "SYS_ADMIN" in securityContext.capabilities.add)',
    ),
    (
        "baseline's capabilities are fine at baseline",
        spec(c_capabilities={"add": ["CHOWN", "NET_BIND_SERVICE"]}),
        {},
        None,
        'unrestricted capabilities (container "c" must set securityContext.capabilities.drop=["ALL"]; container '
        '"c" must not include "CHOWN" in securityContext.capabilities.add)',
    ),
    (
        "hostPath",
        {**RESTRICTED_OK, "volumes": [{"name": "root", "hostPath": {"path": "/"}}, {"name": "tmp", "emptyDir": {}}]},
        {},
        'hostPath volumes (volume "root")',
        'restricted volume types (volume "root" uses restricted volume type "hostPath")',
    ),
    (
        "nfs is fine at baseline only",
        {**RESTRICTED_OK, "volumes": [{"name": "n", "nfs": {"server": "x", "path": "/"}}]},
        {},
        None,
        'restricted volume types (volume "n" uses restricted volume type "nfs")',
    ),
    (
        "hostPort",
        {
            **RESTRICTED_OK,
            "containers": [{**RESTRICTED_OK["containers"][0], "ports": [{"containerPort": 80, "hostPort": 8080}]}],
        },
        {},
        'hostPort (container "c" uses hostPort 8080)',
        'hostPort (container "c" uses hostPort 8080)',
    ),
    (
        "AppArmor unconfined field",
        {
            **RESTRICTED_OK,
            "securityContext": {**RESTRICTED_OK["securityContext"], "appArmorProfile": {"type": "Unconfined"}},
        },
        {},
        'forbidden AppArmor profile (pod must not set AppArmor profile type to "Unconfined")',
        'forbidden AppArmor profile (pod must not set AppArmor profile type to "Unconfined")',
    ),
    (
        "AppArmor annotation",
        RESTRICTED_OK,
        {"container.apparmor.security.beta.kubernetes.io/c": "unconfined"},
        "forbidden AppArmor profile (annotation must not set AppArmor profile type to "
        '"container.apparmor.security.beta.kubernetes.io/c=unconfined")',
        "forbidden AppArmor profile (annotation must not set AppArmor profile type to "
        '"container.apparmor.security.beta.kubernetes.io/c=unconfined")',
    ),
    (
        "SELinux type and user",
        spec(c_seLinuxOptions={"type": "spc_t", "user": "root"}),
        {},
        'seLinuxOptions (container "c" set forbidden securityContext.seLinuxOptions: type "spc_t"; user may not be '
        "set)",
        None,
    ),
    (
        "procMount Unmasked",
        spec(c_procMount="Unmasked"),
        {},
        'procMount (container "c" must not set securityContext.procMount to "Unmasked")',
        None,
    ),
    (
        "seccomp Unconfined",
        {**RESTRICTED_OK, "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "Unconfined"}}},
        {},
        'seccompProfile (pod must not set securityContext.seccompProfile.type to "Unconfined")',
        'seccompProfile (pod must not set securityContext.seccompProfile.type to "Unconfined")',
    ),
    (
        "unsafe sysctl",
        {
            **RESTRICTED_OK,
            "securityContext": {
                **RESTRICTED_OK["securityContext"],
                "sysctls": [{"name": "kernel.msgmax", "value": "1"}, {"name": "net.ipv4.tcp_syncookies", "value": "1"}],
            },
        },
        {},
        "forbidden sysctls (kernel.msgmax)",
        "forbidden sysctls (kernel.msgmax)",
    ),
    (
        "allowPrivilegeEscalation",
        {**RESTRICTED_OK, "containers": [{"name": "c", "securityContext": {"capabilities": {"drop": ["ALL"]}}}]},
        {},
        None,
        'allowPrivilegeEscalation != false (container "c" must set securityContext.allowPrivilegeEscalation=false)',
    ),
    (
        "runAsNonRoot missing",
        {**RESTRICTED_OK, "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}},
        {},
        None,
        'runAsNonRoot != true (pod or container "c" must set securityContext.runAsNonRoot=true)',
    ),
    (
        "runAsUser 0",
        {**RESTRICTED_OK, "securityContext": {**RESTRICTED_OK["securityContext"], "runAsUser": 0}},
        {},
        None,
        "runAsUser=0 (pod must not set runAsUser=0)",
    ),
    (
        "no seccomp at restricted",
        {**RESTRICTED_OK, "securityContext": {"runAsNonRoot": True}},
        {},
        None,
        'seccompProfile (pod or container "c" must set securityContext.seccompProfile.type to "RuntimeDefault" or '
        '"Localhost")',
    ),
    (
        "init and ephemeral containers are checked",
        {
            "containers": [{"name": "c"}],
            "initContainers": [{"name": "init", "securityContext": {"privileged": True}}],
            "ephemeralContainers": [{"name": "debug", "securityContext": {"privileged": True}}],
        },
        {},
        'privileged (containers "init", "debug" must not set securityContext.privileged=true)',
        None,
    ),
    ("restricted pod", RESTRICTED_OK, {}, None, None),
]


@pytest.mark.parametrize(("name", "pod_spec", "annotations", "at_baseline", "at_restricted"), CASES)
def test_each_check_at_each_level(
    name: str, pod_spec: JsonObject, annotations: dict[str, str], at_baseline: str | None, at_restricted: str | None
) -> None:
    meta = {"name": "p", "annotations": annotations}
    assert violations(Level.PRIVILEGED, 32, meta, pod_spec) == []
    baseline = [str(v) for v in violations(Level.BASELINE, 32, meta, pod_spec)]
    assert baseline == ([at_baseline] if at_baseline else [])
    restricted = [str(v) for v in violations(Level.RESTRICTED, 32, meta, pod_spec)]
    if at_restricted is None:
        if at_baseline is None:
            assert restricted == []
        else:  # what baseline forbids, restricted forbids too (here: the same words)
            assert at_baseline in restricted
    else:
        assert at_restricted in restricted


def test_restricted_lists_violations_in_kube_order() -> None:
    pod_spec = spec(c_privileged=True, c_runAsUser=0, hostNetwork=True, volumes=[{"name": "h", "hostPath": {}}])
    reasons = [v.reason for v in violations(Level.RESTRICTED, 32, {}, pod_spec)]
    assert reasons == [
        "host namespaces",
        "privileged",
        "allowPrivilegeEscalation != false",
        "unrestricted capabilities",
        "restricted volume types",
        "runAsNonRoot != true",
        "runAsUser=0",
        "seccompProfile",
    ]


def test_pinned_versions_apply_only_the_checks_of_their_time() -> None:
    pod_spec = spec(c_runAsUser=0)
    assert "runAsUser=0" in [v.reason for v in violations(Level.RESTRICTED, 23, {}, pod_spec)]
    assert "runAsUser=0" not in [v.reason for v in violations(Level.RESTRICTED, 22, {}, pod_spec)]
    sysctl = {
        **RESTRICTED_OK,
        "securityContext": {**RESTRICTED_OK["securityContext"], "sysctls": [{"name": "net.ipv4.tcp_fin_timeout"}]},
    }
    assert violations(Level.BASELINE, 29, {}, sysctl) == []
    assert [v.reason for v in violations(Level.BASELINE, 28, {}, sysctl)] == ["forbidden sysctls"]


# -- labels ---------------------------------------------------------------------------------------------------
def test_unlabelled_namespace_gets_the_defaults() -> None:
    policy, errors = policy_from_labels({}, DEFAULT_POLICY)
    assert (str(policy.enforce), str(policy.audit), str(policy.warn), errors) == (
        "baseline:latest",
        "privileged:latest",
        "baseline:latest",
        (),
    )


def test_labels_choose_level_and_version_per_mode() -> None:
    labels = {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "v1.25",
        "pod-security.kubernetes.io/warn": "privileged",
    }
    policy, errors = policy_from_labels(labels, DEFAULT_POLICY)
    assert (str(policy.enforce), str(policy.warn), errors) == ("restricted:v1.25", "privileged:latest", ())


def test_invalid_labels_fail_closed_for_enforce_and_open_for_warn_as_kube_does() -> None:
    """kube's PolicyToEvaluate: a bad enforce level is restricted, a bad warn or audit level privileged, a bad
    version latest; each is reported as an error."""
    labels = {
        "pod-security.kubernetes.io/enforce": "strict",
        "pod-security.kubernetes.io/warn": "loud",
        "pod-security.kubernetes.io/audit-version": "1.25",
    }
    policy, errors = policy_from_labels(labels, DEFAULT_POLICY)
    assert (str(policy.enforce), str(policy.warn), str(policy.audit)) == (
        "restricted:latest",
        "privileged:latest",
        "privileged:latest",
    )
    assert [(e.field, e.message) for e in errors] == [
        ("metadata.labels[pod-security.kubernetes.io/enforce]", "must be one of privileged, baseline, restricted"),
        ("metadata.labels[pod-security.kubernetes.io/audit-version]", 'must be "latest" or "v1.x"'),
        ("metadata.labels[pod-security.kubernetes.io/warn]", "must be one of privileged, baseline, restricted"),
    ]


@given(
    st.dictionaries(
        st.sampled_from(
            [f"pod-security.kubernetes.io/{m}{s}" for m in ("enforce", "audit", "warn") for s in ("", "-version")]
        ),
        st.text(max_size=12),
    )
)
def test_any_labels_give_a_policy_and_never_raise(labels: dict[str, str]) -> None:
    policy, errors = policy_from_labels(labels, DEFAULT_POLICY)
    assert isinstance(policy.enforce, LevelVersion)
    assert all(e.label in labels for e in errors)


# -- the plugin's decisions -----------------------------------------------------------------------------------
def pod_request(pod_spec: JsonObject, labels: dict[str, str] | None = None, **kw: Any) -> PodRequest:
    fields: dict[str, Any] = {"operation": "CREATE", "namespace": "apps", "name": "x", "username": "alice"}
    fields.update(kw)
    return PodRequest(meta={"name": "x"}, spec=pod_spec, namespace_labels=labels or {}, **fields)


SETTINGS = PodSecuritySettings()


def test_a_violating_pod_is_refused_in_kube_words() -> None:
    review = review_pod(SETTINGS, pod_request(spec(c_privileged=True, hostNetwork=True)))
    assert review.forbidden == (
        'pods "x" is forbidden: violates PodSecurity "baseline:latest": host namespaces (hostNetwork=true), '
        'privileged (container "c" must not set securityContext.privileged=true)'
    )
    assert review.warnings == ()


def test_warn_level_stricter_than_enforce_warns_without_refusing() -> None:
    labels = {"pod-security.kubernetes.io/enforce": "baseline", "pod-security.kubernetes.io/warn": "restricted"}
    review = review_pod(SETTINGS, pod_request(spec(), labels))
    assert review.forbidden == ""
    assert len(review.warnings) == 1
    assert review.warnings[0].startswith('would violate PodSecurity "restricted:latest": allowPrivilegeEscalation')


def test_privileged_namespace_allows_anything() -> None:
    labels = {f"pod-security.kubernetes.io/{m}": "privileged" for m in ("enforce", "warn", "audit")}
    assert review_pod(SETTINGS, pod_request(spec(c_privileged=True), labels)).forbidden == ""


@pytest.mark.parametrize(
    "settings",
    [
        PodSecuritySettings(exempt_usernames=frozenset({"alice"})),
        PodSecuritySettings(exempt_namespaces=frozenset({"apps"})),
        PodSecuritySettings(exempt_runtime_classes=frozenset({"kata"})),
    ],
)
def test_exemptions_skip_the_checks(settings: PodSecuritySettings) -> None:
    review = review_pod(settings, pod_request(spec(c_privileged=True, runtimeClassName="kata")))
    assert review.forbidden == ""


def test_status_and_metadata_updates_are_not_checked_but_spec_updates_are() -> None:
    bad = spec(c_privileged=True)
    status = pod_request(bad, operation="UPDATE", subresource="status", old_spec=bad, old_meta={})
    assert review_pod(SETTINGS, status).forbidden == ""
    labels_only = pod_request(bad, operation="UPDATE", old_spec=bad, old_meta={"labels": {"a": "b"}})
    assert review_pod(SETTINGS, labels_only).forbidden == ""
    changed = pod_request(bad, operation="UPDATE", old_spec=spec(), old_meta={})
    assert review_pod(SETTINGS, changed).forbidden.startswith('pods "x" is forbidden')


def test_creates_of_other_subresources_such_as_an_eviction_are_not_checked() -> None:
    bad = spec(c_privileged=True)
    for sub in ("eviction", "binding"):
        assert review_pod(SETTINGS, pod_request(bad, subresource=sub)).forbidden == ""
    assert review_pod(SETTINGS, pod_request(bad)).forbidden.startswith('pods "x" is forbidden')


def test_workload_templates_get_warnings_only() -> None:
    deployment = {"spec": {"template": {"metadata": {}, "spec": spec(c_privileged=True)}}}
    _, pod_spec = template_of(("apps", "deployments"), deployment)
    review = review_template(SETTINGS, pod_request(pod_spec))
    assert review.forbidden == ""
    assert review.warnings == (
        'would violate PodSecurity "baseline:latest": privileged (container "c" must not set '
        "securityContext.privileged=true)",
    )
    cron = {"spec": {"jobTemplate": {"spec": {"template": {"spec": spec(hostPID=True)}}}}}
    assert template_of(("batch", "cronjobs"), cron)[1]["hostPID"] is True


def test_invalid_labels_on_a_namespace_are_refused() -> None:
    bad = {"pod-security.kubernetes.io/enforce": "strict"}
    assert review_namespace(SETTINGS, NamespaceRequest("CREATE", "n", bad)).invalid
    assert review_namespace(SETTINGS, NamespaceRequest("UPDATE", "n", bad, {})).invalid
    # already invalid and unchanged: the update goes through (other fields may change)
    assert not review_namespace(SETTINGS, NamespaceRequest("UPDATE", "n", bad, bad)).invalid


def test_a_stricter_enforce_label_warns_about_existing_pods() -> None:
    pods = [
        ExistingPod("b", {}, spec(hostNetwork=True)),
        ExistingPod("a", {}, spec(hostNetwork=True)),
        ExistingPod("c", {}, spec(c_privileged=True)),
        ExistingPod("ok", {}, spec()),
    ]
    restricted = {"pod-security.kubernetes.io/enforce": "baseline"}
    old = {"pod-security.kubernetes.io/enforce": "privileged"}
    review = review_namespace(SETTINGS, NamespaceRequest("UPDATE", "apps", restricted, old), pods)
    assert review.warnings == (
        'existing pods in namespace "apps" violate the new PodSecurity enforce level "baseline:latest"',
        "a (and 1 other pod): host namespaces",
        "c: privileged",
    )
    relaxed = review_namespace(SETTINGS, NamespaceRequest("UPDATE", "apps", old, restricted), pods)
    assert relaxed.warnings == ()

"""Defaults kube-apiserver fills in on create, per kind (pure).

Only the fields that clients and our own controllers read are defaulted; everything else is stored as sent.
"""

from __future__ import annotations

import base64
from typing import Any

from ambit.apiserver import claims

JsonObject = dict[str, Any]
INT32_MAX = 2**31 - 1


def apply_defaults(group: str, kind: str, obj: JsonObject, *, creating: bool = True) -> None:
    """Fill in defaults in place (``obj`` is a fresh copy owned by the caller). Defaults apply on every write,
    as in kube-apiserver; only a create also sets the initial status."""
    handler = _DEFAULTERS.get((group, kind))
    if handler is not None:
        status = obj.get("status")
        handler(obj)
        if not creating:
            if status is None:
                obj.pop("status", None)
            else:
                obj["status"] = status


def _namespace(obj: JsonObject) -> None:
    meta = obj["metadata"]
    labels = meta.setdefault("labels", {})
    if isinstance(labels, dict):
        labels["kubernetes.io/metadata.name"] = meta.get("name", "")
    spec = obj.setdefault("spec", {})
    if isinstance(spec, dict):
        spec.setdefault("finalizers", ["kubernetes"])
    obj["status"] = {"phase": "Active"}


def pod_spec_defaults(spec: Any) -> None:
    if not isinstance(spec, dict):
        return
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("enableServiceLinks", True)
    sa = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
    spec["serviceAccountName"] = sa
    spec["serviceAccount"] = sa
    for field in ("containers", "initContainers"):
        containers = spec.get(field)
        for container in containers if isinstance(containers, list) else ():
            if not isinstance(container, dict):
                continue
            image = str(container.get("image", ""))
            latest = image.endswith(":latest") or (":" not in image.rsplit("/", 1)[-1] and "@" not in image)
            container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            container.setdefault("terminationMessagePolicy", "File")
            ports = container.get("ports")
            for port in ports if isinstance(ports, list) else ():
                if isinstance(port, dict):
                    port.setdefault("protocol", "TCP")


def _pod(obj: JsonObject) -> None:
    pod_spec_defaults(obj.get("spec"))
    obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}


def _service(obj: JsonObject) -> None:
    spec = obj.setdefault("spec", {})
    if not isinstance(spec, dict):
        return
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    if spec["type"] != "ExternalName":
        spec.setdefault("internalTrafficPolicy", "Cluster")
        # ipFamilies and ipFamilyPolicy depend on the cluster's Service ranges: the Service strategy sets them
        # (ambit.apiserver.service_families), as kube-apiserver's REST storage does.
    ports = spec.get("ports")
    for port in ports if isinstance(ports, list) else ():
        if isinstance(port, dict):
            port.setdefault("protocol", "TCP")
            if "port" in port:
                port.setdefault("targetPort", port["port"])
    obj["status"] = {"loadBalancer": {}}


def _workload(obj: JsonObject) -> None:
    spec = obj.setdefault("spec", {})
    if not isinstance(spec, dict):
        return
    if obj.get("kind") != "DaemonSet":
        spec.setdefault("replicas", 1)
    spec.setdefault("revisionHistoryLimit", 10)
    if obj.get("kind") == "Deployment":
        spec.setdefault("progressDeadlineSeconds", 600)
        spec.setdefault(
            "strategy", {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}
        )
    if obj.get("kind") == "DaemonSet":
        _daemon_set_strategy(spec)
    if obj.get("kind") == "StatefulSet":
        _stateful_set(spec)
    template = spec.get("template")
    if isinstance(template, dict):
        pod_spec_defaults(template.get("spec"))
    obj["status"] = {}


def _daemon_set_strategy(spec: JsonObject) -> None:
    """kube's DaemonSet default: RollingUpdate, one node at a time, no surge (OnDelete takes no parameters)."""
    strategy = spec.setdefault("updateStrategy", {})
    if not isinstance(strategy, dict):
        return
    kind = strategy.setdefault("type", "RollingUpdate")
    if kind == "RollingUpdate":
        rolling = strategy.setdefault("rollingUpdate", {})
        if isinstance(rolling, dict):
            rolling.setdefault("maxUnavailable", 1)
            rolling.setdefault("maxSurge", 0)


def _stateful_set(spec: JsonObject) -> None:
    """kube's StatefulSet defaults: pods one at a time in ordinal order, a rolling update with partition 0,
    claims kept when the set shrinks or goes; each claim template a Filesystem claim. ``minReadySeconds`` 0 is
    left unwritten, as kube leaves it (its JSON omits a zero)."""
    spec.setdefault("podManagementPolicy", "OrderedReady")
    strategy = spec.setdefault("updateStrategy", {})
    if isinstance(strategy, dict) and strategy.setdefault("type", "RollingUpdate") == "RollingUpdate":
        rolling = strategy.setdefault("rollingUpdate", {})
        if isinstance(rolling, dict):
            rolling.setdefault("partition", 0)
    retention = spec.setdefault("persistentVolumeClaimRetentionPolicy", {})
    if isinstance(retention, dict):
        retention.setdefault("whenDeleted", "Retain")
        retention.setdefault("whenScaled", "Retain")
    claims = spec.get("volumeClaimTemplates")
    for claim in claims if isinstance(claims, list) else ():
        if isinstance(claim, dict):
            claim.setdefault("apiVersion", "v1")
            claim.setdefault("kind", "PersistentVolumeClaim")
            claim_spec = claim.setdefault("spec", {})
            if isinstance(claim_spec, dict):
                claim_spec.setdefault("volumeMode", "Filesystem")
            claim.setdefault("status", {"phase": "Pending"})


def _job(obj: JsonObject) -> None:
    """kube's Job defaults (:func:`job_spec_defaults`); the status starts empty."""
    spec = obj.setdefault("spec", {})
    if isinstance(spec, dict):
        job_spec_defaults(spec)
    obj.setdefault("status", {})


def job_spec_defaults(spec: JsonObject) -> None:
    """kube's JobSpec defaults: one pod, one completion, unless only ``parallelism`` is given (then completions
    stay unset: a work queue); six retries (or, with a per-index limit, the int32 maximum), NonIndexed, not
    suspended, a replacement pod only once the old one is Failed or terminating, the selector generated."""
    parallelism = spec.get("parallelism")
    if spec.get("completions") is None and parallelism is None:
        spec["completions"] = 1
    spec.setdefault("parallelism", 1)
    spec.setdefault("backoffLimit", INT32_MAX if spec.get("backoffLimitPerIndex") is not None else 6)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
    spec.setdefault("manualSelector", False)
    template = spec.get("template")
    if isinstance(template, dict):
        pod_spec_defaults(template.get("spec"))


def _cron_job(obj: JsonObject) -> None:
    """kube's CronJob defaults: Allow concurrent runs, not suspended, keep three succeeded Jobs and one failed;
    the job template's pod template gets the pod defaults (its Job defaults are the Job's own, on create)."""
    spec = obj.setdefault("spec", {})
    if isinstance(spec, dict):
        spec.setdefault("concurrencyPolicy", "Allow")
        spec.setdefault("suspend", False)
        spec.setdefault("successfulJobsHistoryLimit", 3)
        spec.setdefault("failedJobsHistoryLimit", 1)
        job = spec.get("jobTemplate")
        job_spec = job.get("spec") if isinstance(job, dict) else None
        template = job_spec.get("template") if isinstance(job_spec, dict) else None
        if isinstance(template, dict):
            pod_spec_defaults(template.get("spec"))
    obj.setdefault("status", {})


def _secret(obj: JsonObject) -> None:
    obj.setdefault("type", "Opaque")
    string_data = obj.pop("stringData", None)
    if isinstance(string_data, dict):
        data = obj.setdefault("data", {})
        if isinstance(data, dict):
            for key, value in string_data.items():
                data[key] = base64.b64encode(str(value).encode()).decode()


def _priority_class(obj: JsonObject) -> None:
    obj.setdefault("preemptionPolicy", "PreemptLowerPriority")


def _pod_disruption_budget(obj: JsonObject) -> None:
    obj["status"] = {"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0}


def _network_policy(obj: JsonObject) -> None:
    """kube's NetworkPolicy defaults: an absent ``podSelector`` is the empty one; ``policyTypes`` from the rules
    given (Ingress always, Egress when there are egress rules); each port's protocol TCP."""
    if obj.get("spec") is None:  # null is Go's zero spec
        obj["spec"] = {}
    spec = obj["spec"]
    if not isinstance(spec, dict):
        return
    if spec.get("podSelector") is None:
        spec["podSelector"] = {}
    if not spec.get("policyTypes"):
        spec["policyTypes"] = ["Ingress", "Egress"] if spec.get("egress") else ["Ingress"]
    for direction in ("ingress", "egress"):
        rules = spec.get(direction)
        for rule in rules if isinstance(rules, list) else ():
            ports = rule.get("ports") if isinstance(rule, dict) else None
            for port in ports if isinstance(ports, list) else ():
                if isinstance(port, dict) and port.get("protocol") is None:
                    port["protocol"] = "TCP"


def _custom_resource_definition(obj: JsonObject) -> None:
    spec = obj.get("spec")
    if isinstance(spec, dict):
        spec.setdefault("scope", "Namespaced")
        names = spec.get("names")
        if isinstance(names, dict) and "kind" in names:
            names.setdefault("singular", str(names["kind"]).lower())
            names.setdefault("listKind", f"{names['kind']}List")
        spec.setdefault("conversion", {"strategy": "None"})


_DEFAULTERS = {
    ("", "Namespace"): _namespace,
    ("", "Pod"): _pod,
    ("", "Service"): _service,
    ("", "Secret"): _secret,
    ("apps", "Deployment"): _workload,
    ("apps", "ReplicaSet"): _workload,
    ("apps", "DaemonSet"): _workload,
    ("apps", "StatefulSet"): _workload,
    ("batch", "Job"): _job,
    ("batch", "CronJob"): _cron_job,
    ("scheduling.k8s.io", "PriorityClass"): _priority_class,
    ("policy", "PodDisruptionBudget"): _pod_disruption_budget,
    ("networking.k8s.io", "NetworkPolicy"): _network_policy,
    ("apiextensions.k8s.io", "CustomResourceDefinition"): _custom_resource_definition,
    ("", "PersistentVolumeClaim"): claims.claim_defaults,
    ("", "PersistentVolume"): claims.volume_defaults,
    ("storage.k8s.io", "StorageClass"): claims.class_defaults,
}

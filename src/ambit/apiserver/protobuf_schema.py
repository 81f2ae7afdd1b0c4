"""The protobuf schema of the kinds we accept as ``application/vnd.kubernetes.protobuf``: a table, not code.

Each message maps a field number to ``(json name, Go type)``. Field numbers are the ones in Kubernetes'
``generated.proto`` files (k8s.io/api core/v1, apps/v1, batch/v1, storage/v1, authentication/v1,
coordination/v1, networking/v1;
k8s.io/apimachinery meta/v1, runtime, util/intstr, api/resource); they are protocol facts and never change once
released. A field that is not listed here is skipped by the decoder, so only what our clients send needs to be
here, and a field is only listed where its number was checked against those files.

The Go type decides how a field is read and when it shows in the JSON form (:mod:`ambit.apiserver.protobuf`):

- ``string``, ``bytes``, ``bool``, ``int32``, ``int64``: a plain Go value. gogo-protobuf always writes these, so a
  zero value means "unset" and is left out, as ``omitempty`` does in kube-apiserver's JSON.
- ``*T``: a Go pointer. It is written only when set, so it shows even when zero (``replicas: 0``,
  ``emptyDir: {}``).
- ``[]T``, ``map[string]V``: lists and maps; left out when empty.
- ``inline T``: an embedded struct (``json:",inline"``): its fields land in the enclosing object.
- ``Time``, ``MicroTime`` (RFC 3339 strings), ``Quantity`` (its string), ``IntOrString`` (an int or a string),
  ``ExtraValue`` (a list of strings): apimachinery types with a JSON form of their own.
- any other name: a nested message from this table.

The table is kept in parts, by API group: :mod:`~ambit.apiserver.protobuf_schema_core` (meta/v1 and the plain
objects, with :data:`Message`), :mod:`~ambit.apiserver.protobuf_schema_pods` (a pod, its spec and status),
:mod:`~ambit.apiserver.protobuf_schema_workloads` (apps/v1, batch/v1) and
:mod:`~ambit.apiserver.protobuf_schema_access` (networking/v1, authentication/v1, authorization/v1). This module
joins them and says which (apiVersion, kind) of a body is which message.
"""

from __future__ import annotations

from ambit.apiserver.protobuf_schema_access import ACCESS_MESSAGES
from ambit.apiserver.protobuf_schema_core import CORE_MESSAGES, Message
from ambit.apiserver.protobuf_schema_pods import POD_MESSAGES
from ambit.apiserver.protobuf_schema_workloads import WORKLOAD_MESSAGES

MESSAGES: dict[str, Message] = {**CORE_MESSAGES, **POD_MESSAGES, **WORKLOAD_MESSAGES, **ACCESS_MESSAGES}
"""Every message we decode, by Go type name (the parts have no name in common)."""

KINDS: dict[tuple[str, str], str] = {
    ("v1", "Namespace"): "Namespace",
    ("v1", "ConfigMap"): "ConfigMap",
    ("v1", "Secret"): "Secret",
    ("v1", "ServiceAccount"): "ServiceAccount",
    ("v1", "Service"): "Service",
    ("v1", "Endpoints"): "Endpoints",
    ("v1", "Event"): "Event",
    ("v1", "Pod"): "Pod",
    ("v1", "PersistentVolumeClaim"): "PersistentVolumeClaim",
    ("v1", "PersistentVolume"): "PersistentVolume",
    ("storage.k8s.io/v1", "StorageClass"): "StorageClass",
    ("apps/v1", "Deployment"): "Deployment",
    ("apps/v1", "ReplicaSet"): "ReplicaSet",
    ("apps/v1", "DaemonSet"): "DaemonSet",
    ("apps/v1", "StatefulSet"): "StatefulSet",
    ("batch/v1", "Job"): "Job",
    ("batch/v1", "CronJob"): "CronJob",
    ("authentication.k8s.io/v1", "TokenRequest"): "TokenRequest",
    ("authentication.k8s.io/v1", "TokenReview"): "TokenReview",
    ("coordination.k8s.io/v1", "Lease"): "Lease",
    ("networking.k8s.io/v1", "NetworkPolicy"): "NetworkPolicy",
    ("authorization.k8s.io/v1", "SubjectAccessReview"): "SubjectAccessReview",
    ("authorization.k8s.io/v1", "LocalSubjectAccessReview"): "SubjectAccessReview",
    ("authorization.k8s.io/v1", "SelfSubjectAccessReview"): "SelfSubjectAccessReview",
    ("authorization.k8s.io/v1", "SelfSubjectRulesReview"): "SelfSubjectRulesReview",
}
"""(apiVersion, kind) of a body → its message. ``DeleteOptions`` is accepted under any apiVersion (client-go
sends it tagged with the group version of the resource being deleted)."""

ANY_VERSION_KINDS: dict[str, str] = {"DeleteOptions": "DeleteOptions"}

"""Names of the resource kinds Ambit reads and writes.

A :class:`ResourceKind` is all the client needs to build a URL: group, version and plural name, plus whether
objects live in namespaces. The constants below are the kinds the mesh uses; a component that needs another
kind (any CRD) makes its own ``ResourceKind``. Nothing here knows an object's schema: objects are plain dicts.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote


@dataclass(frozen=True, slots=True)
class ResourceKind:
    """One resource of one API group version, e.g. ``ResourceKind("apps", "v1", "deployments", "Deployment")``."""

    group: str
    """API group; ``""`` for the core group (``/api/v1``)."""
    version: str
    plural: str
    """The resource name in URLs."""
    kind: str
    """The ``kind`` of its objects."""
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        """The ``apiVersion`` of its objects."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_path(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        """The URL path of the collection (no name) or of one object, optionally of its subresource.

        ``namespace`` must be None for cluster-scoped kinds; for namespaced kinds None means all namespaces.
        """
        parts = [self.group_path]
        if namespace is not None:
            if not self.namespaced:
                raise ValueError(f"{self.plural} are cluster-scoped: no namespace ({namespace!r}) applies")
            parts.append("namespaces/" + _segment(namespace))
        parts.append(self.plural)
        if name is not None:
            parts.append(_segment(name))
            if subresource:
                parts.append(subresource)
        elif subresource:
            raise ValueError("a subresource needs an object name")
        return "/".join(parts)

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


def _segment(value: str) -> str:
    if not value or value in (".", "..") or "/" in value:
        raise ValueError(f"{value!r} is not a valid name or namespace")
    return quote(value, safe=":@")


# core/v1
NAMESPACES = ResourceKind("", "v1", "namespaces", "Namespace", namespaced=False)
NODES = ResourceKind("", "v1", "nodes", "Node", namespaced=False)
PODS = ResourceKind("", "v1", "pods", "Pod")
SERVICES = ResourceKind("", "v1", "services", "Service")
CONFIG_MAPS = ResourceKind("", "v1", "configmaps", "ConfigMap")
SECRETS = ResourceKind("", "v1", "secrets", "Secret")
SERVICE_ACCOUNTS = ResourceKind("", "v1", "serviceaccounts", "ServiceAccount")
PERSISTENT_VOLUME_CLAIMS = ResourceKind("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim")
PERSISTENT_VOLUMES = ResourceKind("", "v1", "persistentvolumes", "PersistentVolume", namespaced=False)
# other built-in groups
EVENTS = ResourceKind("events.k8s.io", "v1", "events", "Event")
ENDPOINT_SLICES = ResourceKind("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice")
LEASES = ResourceKind("coordination.k8s.io", "v1", "leases", "Lease")
DEPLOYMENTS = ResourceKind("apps", "v1", "deployments", "Deployment")
REPLICA_SETS = ResourceKind("apps", "v1", "replicasets", "ReplicaSet")
DAEMON_SETS = ResourceKind("apps", "v1", "daemonsets", "DaemonSet")
STATEFUL_SETS = ResourceKind("apps", "v1", "statefulsets", "StatefulSet")
CONTROLLER_REVISIONS = ResourceKind("apps", "v1", "controllerrevisions", "ControllerRevision")
JOBS = ResourceKind("batch", "v1", "jobs", "Job")
CRON_JOBS = ResourceKind("batch", "v1", "cronjobs", "CronJob")
PRIORITY_CLASSES = ResourceKind("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", namespaced=False)
NETWORK_POLICIES = ResourceKind("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy")
STORAGE_CLASSES = ResourceKind("storage.k8s.io", "v1", "storageclasses", "StorageClass", namespaced=False)
POD_DISRUPTION_BUDGETS = ResourceKind("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget")
HORIZONTAL_POD_AUTOSCALERS = ResourceKind("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler")
CUSTOM_RESOURCE_DEFINITIONS = ResourceKind(
    "apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", namespaced=False
)
VALIDATING_WEBHOOK_CONFIGURATIONS = ResourceKind(
    "admissionregistration.k8s.io",
    "v1",
    "validatingwebhookconfigurations",
    "ValidatingWebhookConfiguration",
    namespaced=False,
)
TOKEN_REVIEWS = ResourceKind("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", namespaced=False)
SUBJECT_ACCESS_REVIEWS = ResourceKind(
    "authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", namespaced=False
)
# Istio
AUTHORIZATION_POLICIES = ResourceKind("security.istio.io", "v1", "authorizationpolicies", "AuthorizationPolicy")
PEER_AUTHENTICATIONS = ResourceKind("security.istio.io", "v1", "peerauthentications", "PeerAuthentication")
REQUEST_AUTHENTICATIONS = ResourceKind("security.istio.io", "v1", "requestauthentications", "RequestAuthentication")
DESTINATION_RULES = ResourceKind("networking.istio.io", "v1", "destinationrules", "DestinationRule")
SERVICE_ENTRIES = ResourceKind("networking.istio.io", "v1", "serviceentries", "ServiceEntry")
WORKLOAD_ENTRIES = ResourceKind("networking.istio.io", "v1", "workloadentries", "WorkloadEntry")
VIRTUAL_SERVICES = ResourceKind("networking.istio.io", "v1", "virtualservices", "VirtualService")
ISTIO_GATEWAYS = ResourceKind("networking.istio.io", "v1", "gateways", "Gateway")
"""Istio's own ``Gateway`` (servers on selected gateway pods), not Gateway API's :data:`GATEWAYS`."""
TELEMETRIES = ResourceKind("telemetry.istio.io", "v1", "telemetries", "Telemetry")
ENVOY_FILTERS = ResourceKind("networking.istio.io", "v1alpha3", "envoyfilters", "EnvoyFilter")
# Gateway API
GATEWAY_CLASSES = ResourceKind("gateway.networking.k8s.io", "v1", "gatewayclasses", "GatewayClass", namespaced=False)
GATEWAYS = ResourceKind("gateway.networking.k8s.io", "v1", "gateways", "Gateway")
HTTP_ROUTES = ResourceKind("gateway.networking.k8s.io", "v1", "httproutes", "HTTPRoute")
GRPC_ROUTES = ResourceKind("gateway.networking.k8s.io", "v1", "grpcroutes", "GRPCRoute")
TCP_ROUTES = ResourceKind("gateway.networking.k8s.io", "v1alpha2", "tcproutes", "TCPRoute")
TLS_ROUTES = ResourceKind("gateway.networking.k8s.io", "v1alpha2", "tlsroutes", "TLSRoute")
REFERENCE_GRANTS = ResourceKind("gateway.networking.k8s.io", "v1beta1", "referencegrants", "ReferenceGrant")
BACKEND_TLS_POLICIES = ResourceKind("gateway.networking.k8s.io", "v1", "backendtlspolicies", "BackendTLSPolicy")
LISTENER_SETS = ResourceKind("gateway.networking.k8s.io", "v1", "listenersets", "ListenerSet")
X_LISTENER_SETS = ResourceKind("gateway.networking.x-k8s.io", "v1alpha1", "xlistenersets", "XListenerSet")
"""The experimental name of :data:`LISTENER_SETS` (Gateway API v1.3 and v1.4), read alike."""

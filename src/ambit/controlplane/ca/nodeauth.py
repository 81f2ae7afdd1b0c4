"""May this caller have that identity? The node authorization rule for impersonation (spec §5.3 step 4).

Theory of operation: a node proxy (ztunnel) asks for certificates on behalf of the pods on its node by putting
``ImpersonatedIdentity`` in the request metadata. Its token proves only who the node proxy is, so the request is
granted when, and only when, all of these hold (checked in this order, the first failure is the answer):

Rule 1. The caller's ``<namespace>/<service account>`` is one of the trusted node accounts
        (``CA_TRUSTED_NODE_ACCOUNTS``, default ``istio-system/ztunnel``).
Rule 2. The requested identity parses as a SPIFFE id in this CA's trust domain.
Rule 3. The caller's token is bound to a pod, that pod exists (read directly from the API server, never from a
        cache, so a deleted or replaced node proxy cannot keep minting), and its uid and service account are
        the ones in the token.
Rule 4. The caller pod is scheduled on a node that exists as a Node object (read directly too).
Rule 5. At least one pod with the requested namespace and service account whose phase is not ``Failed`` is
        scheduled on that same node, and that namespace is discovered (the mesh config's ``discoverySelectors``,
        :mod:`ambit.controlplane.translate.discovery`): istiod's node authorizer reads pods through its
        discovery-filtered informer, so a pod of an excluded namespace gets no certificate through a node proxy.

What the rule trusts, and why that is enough: only objects a workload cannot write. Rule 1 trusts the token's
service account (TokenReview: the API server's signature). Rules 3 and 4 trust the Pod object of a trusted node
account, its ``spec.serviceAccountName`` and ``spec.nodeName``: only those allowed to create pods in the node
proxies' namespace (``istio-system``; RBAC, privileged users) can make one, and TokenRequest binds a token to a
pod only when that pod runs as the token's service account, so a pod in the workload's own namespace that
names ``ztunnel`` is a caller of ``<its namespace>/ztunnel``, which rule 1 refuses. Rule 5 reads pods by
``spec.nodeName`` and ``spec.serviceAccountName``, never labels or annotations, and only grants what the node
proxy of that node may hold anyway: a workload that creates a pod of another service account of its own
namespace on a node (which needs that RBAC permission and that the service account exists) lets that node's
proxy, not itself, have that identity.

:func:`check_impersonation` is the rule itself, pure: it is given the caller pod, whether its node exists, and a
synchronous lookup of the pods on a node. :class:`NodeAuthorizer` is the shell that fetches the caller pod and
its Node and consults a :class:`PodIndex`. :class:`InformerPodIndex` is the production index: an
:class:`~ambit.k8s.Informer` over all Pods whose handlers keep an index keyed by
``(spec.nodeName, namespace, serviceAccountName)``.

Failures raise :class:`AuthorizationError` with a detailed message for the log; the caller sees an opaque one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ambit.controlplane.ca.authn import Caller
from ambit.controlplane.ca.errors import AuthorizationError
from ambit.k8s.client import KubeClient
from ambit.k8s.errors import KubeClientError, KubeNotFoundError
from ambit.k8s.informer import Informer
from ambit.k8s.kinds import NODES, PODS
from ambit.model.identity import DEFAULT_SERVICE_ACCOUNT, IdentityError, SpiffeId

DEFAULT_TRUSTED_NODE_ACCOUNTS: frozenset[tuple[str, str]] = frozenset({("istio-system", "ztunnel")})
"""istiod's ``CA_TRUSTED_NODE_ACCOUNTS`` default: (namespace, service account) pairs that may impersonate."""

NodeKey = tuple[str, str, str]
"""(spec.nodeName, namespace, serviceAccountName): how pods are indexed."""


@dataclass(frozen=True, slots=True)
class PodFacts:
    """What the rule needs to know of a pod."""

    namespace: str
    name: str
    uid: str
    service_account: str
    node_name: str
    phase: str

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> PodFacts:
        """Read a Pod object; absent fields read as empty (a service account as ``default``)."""
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        return cls(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            service_account=str(spec.get("serviceAccountName") or DEFAULT_SERVICE_ACCOUNT),
            node_name=str(spec.get("nodeName") or ""),
            phase=str(status.get("phase") or ""),
        )


def parse_trusted_accounts(value: str) -> frozenset[tuple[str, str]]:
    """Read ``CA_TRUSTED_NODE_ACCOUNTS``: comma-separated ``namespace/serviceaccount`` pairs."""
    accounts = set()
    for item in value.split(","):
        if not (item := item.strip()):
            continue
        namespace, slash, account = item.partition("/")
        if not slash or not namespace or not account or "/" in account:
            raise ValueError(f"trusted node account {item!r} is not <namespace>/<service account>")
        accounts.add((namespace, account))
    return frozenset(accounts)


def check_impersonation(
    caller: Caller,
    requested: str,
    *,
    trust_domain: str,
    trusted: frozenset[tuple[str, str]],
    caller_pod: PodFacts | None,
    caller_node_exists: bool,
    pods_on_node: Callable[[NodeKey], Iterable[PodFacts]],
    discovered: Callable[[str], bool] = lambda namespace: True,
) -> SpiffeId:
    """The identity ``caller`` may impersonate, by rules 1-5 of the module docstring, else AuthorizationError."""
    if (caller.namespace, caller.service_account) not in trusted:
        raise AuthorizationError(f"caller {caller} is not a trusted node account; it may not impersonate")
    try:
        identity = SpiffeId.parse(requested)
    except IdentityError as exc:
        raise AuthorizationError(f"caller {caller} asked to impersonate a malformed identity: {exc}") from None
    if identity.trust_domain != trust_domain:
        raise AuthorizationError(f"{identity} is outside this CA's trust domain {trust_domain!r}")
    if caller.pod_name is None or caller.pod_uid is None:
        raise AuthorizationError(f"caller {caller}'s token is not bound to a pod")
    if caller_pod is None:
        raise AuthorizationError(f"caller pod {caller.namespace}/{caller.pod_name} does not exist")
    if caller_pod.uid != caller.pod_uid:
        raise AuthorizationError(f"caller pod {caller.namespace}/{caller.pod_name} has another uid than the token's")
    if caller_pod.service_account != caller.service_account:
        raise AuthorizationError(
            f"caller pod {caller.namespace}/{caller.pod_name} runs as {caller_pod.service_account}, "
            f"not the token's {caller.service_account}"
        )
    if not caller_pod.node_name:
        raise AuthorizationError(f"caller pod {caller.namespace}/{caller.pod_name} is not on a node")
    if not caller_node_exists:
        raise AuthorizationError(
            f"caller pod {caller.namespace}/{caller.pod_name} is on node {caller_pod.node_name}, which does not exist"
        )
    if not discovered(identity.namespace):
        raise AuthorizationError(f"namespace {identity.namespace} of {identity} is not discovered (discoverySelectors)")
    key = (caller_pod.node_name, identity.namespace, identity.service_account)
    if not any(pod.phase != "Failed" for pod in pods_on_node(key)):
        raise AuthorizationError(f"no pod of {identity} runs on node {caller_pod.node_name} of caller {caller}")
    return identity


class PodIndex(Protocol):
    """Pod lookups for the rule: a cached index by node, and a direct read of one pod."""

    def find_pods_on_node(self, key: NodeKey) -> Sequence[PodFacts]: ...

    async def fetch_pod(self, namespace: str, name: str) -> PodFacts | None: ...

    async def fetch_node_exists(self, name: str) -> bool: ...


class NodeAuthorizer:
    """Decides impersonation requests (spec §5.3 step 4) with pods from a :class:`PodIndex`."""

    def __init__(
        self,
        pods: PodIndex,
        *,
        trust_domain: str,
        trusted_accounts: frozenset[tuple[str, str]] = DEFAULT_TRUSTED_NODE_ACCOUNTS,
        discovered: Callable[[str], bool] = lambda namespace: True,
    ) -> None:
        """``discovered`` says whether a namespace is discovered now (rule 5); the default: every one is."""
        self._pods = pods
        self._discovered = discovered
        self._trust_domain = trust_domain
        self._trusted = trusted_accounts

    async def authorize(self, caller: Caller, requested: str) -> SpiffeId:
        """The impersonated identity if ``caller`` may have it, else :class:`AuthorizationError`."""
        caller_pod = None
        node_exists = False
        trusted = (caller.namespace, caller.service_account) in self._trusted
        if trusted and caller.pod_name is not None:  # no API request for callers rule 1 refuses anyway
            caller_pod = await self._pods.fetch_pod(caller.namespace, caller.pod_name)
            if caller_pod is not None and caller_pod.node_name:
                node_exists = await self._pods.fetch_node_exists(caller_pod.node_name)
        return check_impersonation(
            caller,
            requested,
            trust_domain=self._trust_domain,
            trusted=self._trusted,
            caller_pod=caller_pod,
            caller_node_exists=node_exists,
            pods_on_node=self._pods.find_pods_on_node,
            discovered=self._discovered,
        )


class InformerPodIndex:
    """A :class:`PodIndex` over an informer on all Pods; ``async with`` it (or ``start``/``aclose``)."""

    def __init__(self, client: KubeClient, *, informer: Informer | None = None) -> None:
        self._client = client
        self._by_node: dict[NodeKey, dict[tuple[str, str], PodFacts]] = {}
        # Not `informer or ...`: an Informer is a sized collection, and one not yet started is empty, so falsy.
        self.informer = informer if informer is not None else Informer(client, PODS)
        self.informer.add_handler(on_add=self._added, on_update=self._updated, on_delete=self._deleted)

    async def start(self) -> None:
        """Start the informer and wait until its first list is indexed."""
        self.informer.start()
        await self.informer.wait_synced()

    async def aclose(self) -> None:
        await self.informer.aclose()

    async def __aenter__(self) -> InformerPodIndex:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def find_pods_on_node(self, key: NodeKey) -> Sequence[PodFacts]:
        return list(self._by_node.get(key, {}).values())

    async def fetch_pod(self, namespace: str, name: str) -> PodFacts | None:
        try:
            return PodFacts.of(await self._client.get(PODS, name, namespace))
        except KubeNotFoundError:
            return None
        except KubeClientError as exc:
            raise AuthorizationError(f"cannot read caller pod {namespace}/{name}: {exc}") from None

    async def fetch_node_exists(self, name: str) -> bool:
        try:
            await self._client.get(NODES, name)
        except KubeNotFoundError:
            return False
        except KubeClientError as exc:
            raise AuthorizationError(f"cannot read node {name}: {exc}") from None
        return True

    def _added(self, pod: dict[str, Any]) -> None:
        facts = PodFacts.of(pod)
        if facts.node_name:
            key = (facts.node_name, facts.namespace, facts.service_account)
            self._by_node.setdefault(key, {})[(facts.namespace, facts.name)] = facts

    def _deleted(self, pod: dict[str, Any]) -> None:
        facts = PodFacts.of(pod)
        key = (facts.node_name, facts.namespace, facts.service_account)
        bucket = self._by_node.get(key)
        if bucket is not None:
            bucket.pop((facts.namespace, facts.name), None)
            if not bucket:
                del self._by_node[key]

    def _updated(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        self._deleted(old)
        self._added(new)

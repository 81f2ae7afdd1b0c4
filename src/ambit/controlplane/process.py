"""The control plane as a process (``ambit controlplane``): the workload API over delta xDS and the mesh CA.

Theory of operation: everything is built once from :class:`ControlPlaneSettings` and wired here:

1. the mesh root: a plug-in CA from files, or the root kept in Secret ``istio-system/istio-ca-secret`` (created
   on first start, reused after);
2. one TLS gRPC server on ``:15012`` with a serving certificate issued by that root (names
   ``istiod.istio-system.svc`` and the configured SANs), carrying both the delta ADS service and
   ``IstioCertificateService``;
3. the cluster view (informers, debounced translation) feeding the xDS resource tables (Addresses,
   Authorizations, each waypoint's WaypointConfig, readable only by that waypoint's service account, and each
   ingress gateway's GatewayConfig, with its listeners' certificates, readable only by that gateway's), so
   pushes carry only changed and removed resources, and the ``ZtunnelAccepted`` status of each
   AuthorizationPolicy, the ``istio.io/WaypointBound`` status of each Service and ServiceEntry and the parents of
   each HTTPRoute, GRPCRoute, TCPRoute and TLSRoute, and the auto-allocated addresses of ServiceEntries without
   any (their ``status.addresses``, which the translation reads back as VIPs), written only when it changes
   (:mod:`ambit.controlplane.status`); each
   object (or part of one) the translation had to leave out gets one Warning Event (reason ``TranslationSkipped``,
   the note naming the field to fix), again only once the problem has gone away and come back, changed, or the
   object was recreated;
4. the pod index behind node authorization, and the publisher of ``istio-ca-root-cert`` in every namespace (and,
   with a plug-in CA that has a ``ca-crl.pem``, of ``istio-ca-crl``: :mod:`ambit.controlplane.ca.crl`); with a
   plug-in CA, the watch of its files, which swaps the signing CA and the published trust bundle when a changed
   set passes :mod:`ambit.controlplane.ca.rotation` (a Normal ``CaReloaded`` or Warning ``CaReloadRefused`` Event on
   Secret ``istio-system/cacerts`` either way);
5. the validating webhook for the Istio and Gateway API kinds (``/validate`` on ``:15017``), registered with the
   API server as ``istio-validator-ambit`` with the mesh root as its CA bundle;
6. the gateway deployment controller (:mod:`ambit.controlplane.gateway`): the GatewayClass ``istio-waypoint``,
   and for each waypoint Gateway its ServiceAccount, Deployment and Service, and its status;
7. with a monitoring port, istiod's metrics on ``/metrics`` and the version on ``/version`` (:mod:`.monitoring`),
   counted where things happen: the xDS streams, the CA, the informers and the translation.

Every xDS stream and CA call authenticates its caller with a TokenReview of its bearer token (audience
``istio-ca``) against the API server in use, embedded or real. The same port serves the sync status of every
connected proxy (``istio.io/debug/syncz``) to administrators only (:mod:`ambit.controlplane.debug_access`). The
process runs until SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ambit import __version__
from ambit.controlplane.addresses import (
    AddressCache,
    AuthorizationCache,
    address_changes,
    addresses,
    authorization_changes,
)
from ambit.controlplane.ca.authn import KubeAuthenticator
from ambit.controlplane.ca.cawatch import CA_POLL_INTERVAL, CaPaths, PluginCaWatcher
from ambit.controlplane.ca.crl import CRL_CONFIG_MAP, CRL_FILE, CRL_KEY, CRL_POLL_INTERVAL, CrlFileWatcher
from ambit.controlplane.ca.errors import CaServerError
from ambit.controlplane.ca.nodeauth import InformerPodIndex, NodeAuthorizer
from ambit.controlplane.ca.publish import ConfigMapPublisher
from ambit.controlplane.ca.root import RootCertPublisher, load_or_create_root_secret, load_plugin_ca
from ambit.controlplane.ca.rootca import RootCa
from ambit.controlplane.ca.rotation import Refusal
from ambit.controlplane.ca.server import GRPC_SERVER_OPTIONS, CaService, RootSigner
from ambit.controlplane.debug_access import DEBUG_ACCOUNTS, DebugAccessChecker
from ambit.controlplane.gateway import GatewayController, GatewayControllerSettings, WaypointTemplateSettings
from ambit.controlplane.monitoring import ControlPlaneMetrics, MonitoringServer
from ambit.controlplane.monitoring.expiry import ca_expiry
from ambit.controlplane.status import (
    AddressStatusWriter,
    AncestorStatusWriter,
    PolicyStatusWriter,
    RouteStatusWriter,
)
from ambit.controlplane.translate import (
    DEFAULT_ROOT_NAMESPACE,
    PolicyStatus,
    SkipMemory,
    Skipped,
    Translation,
    WorkloadChanges,
)
from ambit.controlplane.translate.discovery import EVERY_NAMESPACE
from ambit.controlplane.translate.envoyfilters import PatchNote
from ambit.controlplane.translate.visibility import VISIBILITY_APPLIED
from ambit.controlplane.translate.waypoint_policies import WAYPOINT_ACCEPTED
from ambit.controlplane.translate.waypoint_status import WAYPOINT_BOUND, WAYPOINT_MISSING
from ambit.controlplane.untaint import NodeUntainter
from ambit.controlplane.view import ClusterView, ClusterViewSettings
from ambit.controlplane.webhook.serving import WebhookManager
from ambit.heap import ChurningHeap
from ambit.k8s import EventRecorder, EventRecorderSettings, KubeClient, KubeClientSettings, kinds
from ambit.model.dnsname import is_ip
from ambit.model.localconfig import LocalConfig
from ambit.model.routes import WaypointConfig
from ambit.tls.certs import issue_server_cert
from ambit.xds.admission import Admission, default_rate
from ambit.xds.callers import Caller, Metadata
from ambit.xds.gateway import GATEWAY_CONFIG_TYPE_URL, gateway_config_to_proto
from ambit.xds.routes import WAYPOINT_CONFIG_TYPE_URL, waypoint_config_to_proto
from ambit.xds.server import XdsServer
from ambit.xds.table import AddressTable, AuthorizationTable, GatewayConfigTable, WaypointConfigTable

log = logging.getLogger("ambit.controlplane")

DEFAULT_SERVER_NAMES = ("istiod.istio-system.svc", "istiod.istio-system.svc.cluster.local", "istiod")
REPORTING_CONTROLLER = "ambit.dev/controlplane"
SKIPPED_REASON = "TranslationSkipped"
SKIPPED_ACTION = "Translate"
CA_RELOADED_REASON = "CaReloaded"
CA_REFUSED_REASON = "CaReloadRefused"
CA_ACTION = "ReloadCA"
_CACERTS = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "cacerts", "namespace": "istio-system"}}
"""What plug-in CA Events are about: Istio's ``cacerts`` Secret, the usual source of the files."""


@dataclass(frozen=True, slots=True)
class ControlPlaneSettings:
    kubeconfig: Path | None = None
    """The API server to watch and to send TokenReviews to (None: in-cluster or $KUBECONFIG)."""
    host: str = "0.0.0.0"
    port: int = 15012
    """xDS and CA (gRPC over TLS)."""
    sans: tuple[str, ...] = ()
    """Extra DNS names or IPs for the serving certificate (the address node proxies dial)."""
    trust_domain: str = "cluster.local"
    cluster_id: str = "Kubernetes"
    domain: str = "cluster.local"
    plugin_cert: Path | None = None
    """Plug-in CA: the signing certificate (with the root last if it is an intermediate)."""
    plugin_key: Path | None = None
    plugin_root: Path | None = None
    debounce: float = 0.1
    """Seconds to gather changes before a translation (each stream then pushes at once)."""
    kubernetes_api_qps: float = 80.0
    """Requests per second to the API server at most (istiod's ``--kubernetesApiQPS``): status writes for 10,000
    policies go at this pace instead of running into the server's limit (:mod:`ambit.k8s.throttle`)."""
    kubernetes_api_burst: int = 160
    """Requests at once after being idle (istiod's ``--kubernetesApiBurst``)."""
    webhook_port: int | None = 15017
    """The validating webhook (``/validate``) on ``host``; None: no webhook. Registered with the API server."""
    webhook_host: str | None = None
    """The address the API server dials for the webhook (default: ``host``, or 127.0.0.1 for a wildcard)."""
    webhook_service: str | None = None
    """In a cluster: ``namespace/name`` of the Service the installed webhook configuration points at; the control
    plane then only fills in its caBundle (and keeps trying until the installer has created it)."""
    cacerts_dir: Path | None = None
    """Istio's plug-in CA directory (the ``cacerts`` Secret): used when it holds ``ca-cert.pem`` and ``ca-key.pem``
    and no ``plugin_cert`` is given; ``root-cert.pem`` is the root when the CA is an intermediate."""
    untaint_nodes: bool = False
    """Remove the ``cni.istio.io/not-ready`` taint from each node whose node agent (``k8s-app=istio-cni-node`` in
    the root namespace) is ready (:mod:`ambit.controlplane.untaint`; istiod's
    ``PILOT_ENABLE_NODE_UNTAINT_CONTROLLERS``). Needs ``patch`` on Nodes."""
    xds_rate: float | None = None
    """New xDS streams admitted a second (istiod's ``PILOT_MAX_REQUESTS_PER_SECOND``); None: istiod's default for
    this machine (:func:`~ambit.xds.admission.default_rate`)."""
    xds_max_streams: int = 20_000
    """xDS streams held at most (:mod:`ambit.xds.admission` rule 1)."""
    instance: str = ""
    """Who reports Events (their ``reportingInstance``), e.g. the pod name; default: the host name."""
    root_namespace: str = DEFAULT_ROOT_NAMESPACE
    """The mesh's root namespace: its AuthorizationPolicies and PeerAuthentications are mesh-wide."""
    enable_dry_run: bool = False
    """Send ``istio.io/dry-run`` AuthorizationPolicies with ``dry_run`` set (istiod's
    ``AMBIENT_ENABLE_DRY_RUN_AUTHORIZATION_POLICY``, off by default); when off they are not sent."""
    deploy_waypoints: bool = True
    """Run the gateway deployment controller: waypoint Gateways get their Deployment, Service and ServiceAccount."""
    waypoint_xds_address: str = "istiod.istio-system.svc:15012"
    """HOST:PORT the waypoint pods dial for xDS and the CA (an address their network reaches and the serving
    certificate names)."""
    waypoint_image: str = "ambit"
    waypoint_image_pull_policy: str | None = None
    """``Never`` in the lab (containers run commands there, not images); None: the cluster's default."""
    revision: str = "default"
    """This control plane's revision (istiod's ``REVISION``): the gateway controller leaves Gateways of another
    revision alone (:mod:`ambit.controlplane.gateway.revision`)."""
    enable_ca_crl: bool = True
    """Replicate the plug-in CA's CRL (``ca-crl.pem`` next to its files) as ConfigMap ``crl_config_map`` in every
    namespace (istiod's ``PILOT_ENABLE_CA_CRL``; :mod:`ambit.controlplane.ca.crl`)."""
    http10: bool = False
    """istiod's ``PILOT_HTTP10``: the waypoints and gateways this control plane deploys serve HTTP/1.0 (Envoy's
    ``accept_http_10``) instead of answering it 426; handed to their pods as ``PILOT_HTTP10``
    (:func:`ambit.waypoint.settings.accepts_http10`)."""
    crl_file: Path | None = None
    """The plug-in CA's CRL file; default ``ca-crl.pem`` in the directory of the plug-in CA's files."""
    crl_config_map: str = CRL_CONFIG_MAP
    """The ConfigMap the CRL is published as (istiod's ``PILOT_CRL_CONFIGMAP``)."""
    crl_poll_interval: float = CRL_POLL_INTERVAL
    """Seconds between looks at the CRL file."""
    ca_poll_interval: float = CA_POLL_INTERVAL
    """Seconds between looks at the plug-in CA's files; a changed good set is signing within two looks
    (:mod:`ambit.controlplane.ca.cawatch`). 0: the files are read once, at start."""
    monitoring_port: int | None = None
    """istiod's monitoring port (15014: ``/metrics``, ``/version``, no credentials) on ``host``; None: not served,
    0: an ephemeral port (tests)."""
    debug_accounts: frozenset[str] = DEBUG_ACCOUNTS
    """``namespace/service account`` pairs that may read the sync status without an RBAC rule
    (:mod:`ambit.controlplane.debug_access`); any other caller needs ``get`` on ``/debug/syncz``."""


class ControlPlane:
    """The running control plane; ``start`` then ``aclose``."""

    def __init__(self, settings: ControlPlaneSettings, client: KubeClient) -> None:
        self.settings = settings
        self.client = client
        self.table = AddressTable()
        self.authorizations = AuthorizationTable()
        self.waypoint_configs = WaypointConfigTable()
        self._waypoint_readers: dict[str, str] = {}
        """Waypoint key → the one caller name (``system:serviceaccount:<ns>:<sa>``) that may read its config."""
        self._waypoint_encoded: dict[str, tuple[WaypointConfig, str, Any]] = {}
        """Waypoint key → (config, reader, (version, message)) last encoded: unchanged configs are not encoded again."""
        self.gateway_configs = GatewayConfigTable()
        self._gateway_readers: dict[str, str] = {}
        """Ingress Gateway key → the one caller name that may read its config (it holds private keys)."""
        self._gateway_encoded: dict[str, tuple[Any, str, Any]] = {}
        self._encoded: AuthorizationCache = {}
        self._encoded_addresses: AddressCache = {}
        self._applied: LocalConfig | None = None
        """The config the address table was last made from (None: none, or its hand-over failed)."""
        self._workload_changes: WorkloadChanges | None = None
        self.authenticator = KubeAuthenticator(client, cluster_id=settings.cluster_id)
        self._discovery = EVERY_NAMESPACE
        self.root: RootCa | None = None
        self.server: XdsServer | None = None
        self.metrics = ControlPlaneMetrics(version=__version__)
        self.monitoring: MonitoringServer | None = None
        self.view = ClusterView(
            client,
            ClusterViewSettings(
                debounce=settings.debounce,
                cluster_id=settings.cluster_id,
                trust_domain=settings.trust_domain,
                domain=settings.domain,
                root_namespace=settings.root_namespace,
                enable_dry_run=settings.enable_dry_run,
            ),
            self._config_changed,
            on_skipped=self._skipped,
            on_status=self._status,
            on_waypoint_status=self._waypoint_status,
            on_routes=self._routes_changed,
            on_workload_changes=self._workloads_changed,
            observer=self.metrics,
        )
        self.view.add_event_handlers(self.metrics.event_handlers)
        # One pod cache: the node authorization's index is fed by the view's informer (issue 22: 50,000 pods twice).
        self.pods = InformerPodIndex(client, informer=self.view.informer(kinds.PODS))
        self.status = PolicyStatusWriter(
            client,
            self._cached("authorizationpolicies"),
            clock=time.time,
            generation=self._generation("authorizationpolicies"),
        )
        self.waypoint_policy_status = PolicyStatusWriter(
            client,
            self._cached("authorizationpolicies"),
            clock=time.time,
            condition_type=WAYPOINT_ACCEPTED,
            generation=self._generation("authorizationpolicies"),
        )
        self.service_status = PolicyStatusWriter(
            client,
            self._cached("services"),
            clock=time.time,
            kind=kinds.SERVICES,
            condition_type=WAYPOINT_BOUND,
            generation=self._generation("services"),
        )
        self.service_entry_status = PolicyStatusWriter(
            client,
            self._cached("serviceentries"),
            clock=time.time,
            kind=kinds.SERVICE_ENTRIES,
            condition_type=WAYPOINT_BOUND,
            more_types=(WAYPOINT_MISSING, VISIBILITY_APPLIED),
            generation=self._generation("serviceentries"),
        )
        # Every ServiceEntry, discovered or not: an address held by an entry of an excluded namespace stays taken, so
        # that the namespace coming back brings no collision.
        self.entry_addresses = AddressStatusWriter(client, lambda: self.view.items("serviceentries"), clock=time.time)
        self.route_status = tuple(
            RouteStatusWriter(
                client, self._cached(kind.plural), clock=time.time, kind=kind, generation=self._generation(kind.plural)
            )
            for kind in (kinds.HTTP_ROUTES, kinds.GRPC_ROUTES, kinds.TCP_ROUTES, kinds.TLS_ROUTES)
        )
        self.backend_tls_status = AncestorStatusWriter(client, self._cached("backendtlspolicies"), clock=time.time)
        self.events = EventRecorder(
            client,
            EventRecorderSettings(
                reporting_controller=REPORTING_CONTROLLER, reporting_instance=settings.instance or socket.gethostname()
            ),
        )
        self._skip_memory = SkipMemory()
        self.heap = ChurningHeap()
        """The collector kept off the caches and the translation (:mod:`ambit.heap`): a full collection of ~1 GiB
        of objects held every push for a second or more (issue 22)."""
        self._envoy_notes: set[PatchNote] = set()
        self.gateways: GatewayController | None = None
        if settings.deploy_waypoints:
            template = WaypointTemplateSettings(
                xds_address=settings.waypoint_xds_address,
                image=settings.waypoint_image,
                image_pull_policy=settings.waypoint_image_pull_policy,
                cluster_id=settings.cluster_id,
                trust_domain=settings.trust_domain,
                domain=settings.domain,
                revision=settings.revision,
                http10=settings.http10,
            )
            self.gateways = GatewayController(
                client,
                GatewayControllerSettings(
                    template=template, debounce=settings.debounce, system_namespace=settings.root_namespace
                ),
                clock=time.time,
                services=self.view,
            )
            # Services and EndpointSlices come from the view's caches, not a second copy of them.
            self.view.add_event_handlers(self.gateways.backing_event_handlers)
        self.publisher: RootCertPublisher | None = None
        self.crl_publisher: ConfigMapPublisher | None = None
        self.crl_watcher: CrlFileWatcher | None = None
        self._plugin_dir: Path | None = None
        """The directory of the plug-in CA's files, when one is in use (its CRL file lives there)."""
        self._plugin_paths: CaPaths | None = None
        self.signer: RootSigner | None = None
        self.ca_watcher: PluginCaWatcher | None = None
        self.webhook: WebhookManager | None = None
        self.untainter: NodeUntainter | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.pushes = 0

    def _change_started(self) -> None:
        """Tell the xDS server when the change being handed over began (each stream's convergence time)."""
        if self.server is not None:
            self.server.service.change_started = self.view.change_started

    def _config_changed(self, config: LocalConfig) -> None:
        self._change_started()
        self.heap.changed()  # the translation the tables are about to hold is long-lived: out of the collector's walk
        self.metrics.set_services(len(config.services))
        changes, self._workload_changes = self._workload_changes, None
        previous, self._applied = self._applied, None
        if changes is not None and previous is not None and changes.since is previous.workloads:
            # Only the workloads the translation changed (and the services): the hand-over costs the change.
            upserts, removed = address_changes(previous, config, self._encoded_addresses, changes.uids, encoded=True)
            changed = self.table.patch(upserts, removed)
        else:
            changed = self.table.replace(addresses(config, self._encoded_addresses, encoded=True))
        encoded_policies = authorization_changes(previous, config, self._encoded)
        changed_policies = frozenset() if encoded_policies is None else self.authorizations.replace(encoded_policies)
        if changed or changed_policies:
            self.pushes += 1
            log.info(
                "workload API: %d resources, %d changed; %d policies, %d changed",
                len(config.workloads) + len(config.services),
                len(changed),
                len(config.policies),
                len(changed_policies),
            )
        self._applied = config

    def _workloads_changed(self, changes: WorkloadChanges | None) -> None:
        """The translation about to be handed over, as changes to the last one (:meth:`_config_changed` uses
        them when they are relative to the config it last applied)."""
        self._workload_changes = changes

    def _cached(self, plural: str) -> Callable[[], list[dict[str, Any]]]:
        """The cached objects of ``plural`` the last translation saw: a status writer neither writes nor removes
        conditions in a namespace the ``discoverySelectors`` exclude (istiod does not see them)."""
        return lambda: [obj for obj in self.view.items(plural) if self._discovery.admits(obj)]

    def _generation(self, plural: str) -> Callable[[], object]:
        """What :meth:`_cached` of ``plural`` returns depends on (status rule 11): the informer's last
        resourceVersion and the discovery filter."""
        return lambda: (self.view.generation(plural), self._discovery)

    def _discovered(self, namespace: str) -> bool:
        """Whether the last translation saw ``namespace`` (``discoverySelectors``); every one before the first."""
        return self._discovery.admits_namespace(namespace)

    def _routes_changed(self, translation: Translation) -> None:
        """Serve each waypoint its config (versioned with who may read it) and write the routes' status."""
        self._change_started()
        self._discovery = translation.discovery
        self._note_envoy_filters(translation)
        accounts = dict(translation.waypoint_accounts)
        readers: dict[str, str] = {}
        resources = {}
        for config in translation.waypoint_configs:
            namespace = config.waypoint.partition("/")[0]
            account = accounts.get(config.waypoint)
            if account is None:
                continue
            reader = f"system:serviceaccount:{namespace}:{account}"
            readers[config.waypoint] = reader
            previous = self._waypoint_encoded.get(config.waypoint)
            if previous is not None and previous[1] == reader and previous[0] == config:
                resources[config.waypoint] = previous[2]
                continue
            message = waypoint_config_to_proto(config)
            # The reader is part of the version: a new service account re-evaluates every stream's view.
            body = message.SerializeToString(deterministic=True) + b"\0" + reader.encode()
            resources[config.waypoint] = (hashlib.sha256(body).hexdigest()[:16], message)
            self._waypoint_encoded[config.waypoint] = (config, reader, resources[config.waypoint])
        self._waypoint_encoded = {k: v for k, v in self._waypoint_encoded.items() if k in resources}
        self._waypoint_readers = readers
        self.waypoint_configs.replace(resources)
        self._gateways_changed(translation)
        for writer in self.route_status:
            writer.submit(translation.route_status)
        self.backend_tls_status.submit(translation.backend_tls_status)
        self.waypoint_policy_status.submit(translation.waypoint_policy_status)

    def _gateways_changed(self, translation: Translation) -> None:
        """Serve each ingress gateway its config, versioned with who may read it (as waypoints' configs)."""
        accounts = dict(translation.gateway_accounts)
        readers: dict[str, str] = {}
        resources: dict[str, tuple[str, Any]] = {}
        for config in translation.gateway_configs:
            account = accounts.get(config.gateway)
            if account is None:
                continue
            reader = f"system:serviceaccount:{config.gateway.partition('/')[0]}:{account}"
            readers[config.gateway] = reader
            previous = self._gateway_encoded.get(config.gateway)
            if previous is not None and previous[1] == reader and previous[0] == config:
                resources[config.gateway] = previous[2]
                continue
            message = gateway_config_to_proto(config)
            body = message.SerializeToString(deterministic=True) + b"\0" + reader.encode()
            resources[config.gateway] = (hashlib.sha256(body).hexdigest()[:16], message)
            self._gateway_encoded[config.gateway] = (config, reader, resources[config.gateway])
        self._gateway_encoded = {k: v for k, v in self._gateway_encoded.items() if k in resources}
        self._gateway_readers = readers
        self.gateway_configs.replace(resources)

    def _may_read_gateway(self, caller: Caller, name: str) -> bool:
        """Only the gateway's own service account, in the Gateway's namespace, reads its config and keys."""
        reader = self._gateway_readers.get(name)
        return reader is not None and caller.name == reader

    def _may_read_waypoint(self, caller: Caller, name: str) -> bool:
        """Only the waypoint's own service account, in the waypoint's namespace, reads its config."""
        reader = self._waypoint_readers.get(name)
        return reader is not None and caller.name == reader

    def _status(self, statuses: tuple[PolicyStatus, ...]) -> None:
        self.status.submit(statuses)

    def _waypoint_status(self, services: tuple[PolicyStatus, ...], entries: tuple[PolicyStatus, ...]) -> None:
        self.service_status.submit(services)
        self.service_entry_status.submit(entries)
        self.entry_addresses.wake()

    def _note_envoy_filters(self, translation: Translation) -> None:
        """One log line per EnvoyFilter patch not applied, once per object generation. istiod writes no status
        or Event for an EnvoyFilter, so neither does Ambit."""
        current = set(translation.envoy_filter_notes)
        for note in sorted(current - self._envoy_notes):
            log.warning(
                "EnvoyFilter %s/%s (generation %d) %s not applied: %s",
                note.namespace,
                note.name,
                note.generation,
                note.field,
                note.reason,
            )
        self._envoy_notes = current

    def _skipped(self, skipped: tuple[Skipped, ...]) -> None:
        """One Warning Event per problem that the previous translation did not have."""
        for skip in self._skip_memory.news(skipped):
            log.info("translation left out %s %s/%s: %s", skip.kind, skip.namespace, skip.name, skip.note)
            note = f"left out of the workload API: {skip.note}"
            self.events.record(skip.regarding(), "Warning", SKIPPED_REASON, note, SKIPPED_ACTION)

    async def _authenticate(self, metadata: Metadata) -> Caller | None:
        try:
            caller = await self.authenticator.authenticate(metadata)
        except CaServerError as exc:
            log.info("xds: refused a client: %s", exc)
            return None
        return Caller(f"system:serviceaccount:{caller.namespace}:{caller.service_account}", self.settings.cluster_id)

    async def _load_root(self) -> RootCa:
        s = self.settings
        if s.plugin_cert is not None and s.plugin_key is not None:
            self._plugin_dir = s.plugin_cert.parent
            self._plugin_paths = CaPaths(s.plugin_cert, s.plugin_key, None, s.plugin_root)
            return await asyncio.to_thread(load_plugin_ca, s.plugin_cert, s.plugin_key, s.plugin_root)
        if s.cacerts_dir is not None and (s.cacerts_dir / "ca-key.pem").is_file():
            paths = CaPaths.in_directory(s.cacerts_dir)
            log.info("using the plug-in CA in %s", s.cacerts_dir)
            self._plugin_dir, self._plugin_paths = s.cacerts_dir, paths
            root, chain = (p if p is not None and p.is_file() else None for p in (paths.root, paths.chain))
            return await asyncio.to_thread(load_plugin_ca, paths.cert, paths.key, root, chain)
        return await load_or_create_root_secret(self.client)

    def _serving_certificate(self, root: RootCa) -> tuple[bytes, bytes]:
        """The xDS and CA port's certificate chain and key, issued by ``root``'s signer (names
        ``istiod.istio-system.svc`` and the configured SANs)."""
        names = [*DEFAULT_SERVER_NAMES, *self.settings.sans]
        serving = issue_server_cert(
            root.signer,
            common_name="istiod.istio-system.svc",
            dns_names=[n for n in names if not is_ip(n)],
            ip_addresses=[n for n in names if is_ip(n)],
            now=time.time(),
        )
        return serving.cert_pem + (
            b"" if root.signer.cert_pem == root.root_pem else root.signer.cert_pem
        ), serving.key_pem

    async def start(self) -> None:
        s = self.settings
        self.root = await self._load_root()
        chain, key = self._serving_certificate(self.root)
        self.server = XdsServer(
            self.table,
            self._authenticate,
            cert_chain_pem=chain,
            key_pem=key,
            host=s.host,
            port=s.port,
            # The view already gathers changes for ``debounce`` before it translates; a second wait per stream only
            # let the next translation (which blocks the loop) start first and delayed every push by one more
            # translation (issue 22: 10,000 pods, p50 3.8 s). Each stream still coalesces what arrives while it writes.
            debounce=0.0,
            # The CA's keepalive, but the xDS stream's request limit: the CA bounds its own requests (its module's
            # step 0); a reconnecting node proxy names everything it holds (issue 22).
            grpc_options=[o for o in GRPC_SERVER_OPTIONS if o[0] != "grpc.max_receive_message_length"],
            authorizations=self.authorizations,
            sources={WAYPOINT_CONFIG_TYPE_URL: self.waypoint_configs, GATEWAY_CONFIG_TYPE_URL: self.gateway_configs},
            readers={
                WAYPOINT_CONFIG_TYPE_URL: self._may_read_waypoint,
                GATEWAY_CONFIG_TYPE_URL: self._may_read_gateway,
            },
            debug_access=DebugAccessChecker(self.client, accounts=s.debug_accounts),
            control_plane=s.instance or socket.gethostname(),
            observer=self.metrics,
            admission=Admission(rate=s.xds_rate or default_rate(), max_streams=s.xds_max_streams),
        )
        self.events.start()
        await self.pods.start()
        authorizer = NodeAuthorizer(self.pods, trust_domain=s.trust_domain, discovered=self._discovered)
        self.signer = RootSigner(self.root)
        self.metrics.set_ca_expiry(*ca_expiry(self.root))
        CaService(self.authenticator, authorizer, self.signer, observer=self.metrics).add_to_server(
            self.server.grpc_server
        )
        if s.monitoring_port is not None:
            self.monitoring = MonitoringServer(self.metrics, host=s.host, port=s.monitoring_port, version=__version__)
            await self.monitoring.start()
        self.status.start()
        self.waypoint_policy_status.start()
        self.service_status.start()
        self.service_entry_status.start()
        self.entry_addresses.start()
        for writer in self.route_status:
            writer.start()
        self.backend_tls_status.start()
        await self.view.start()
        if s.untaint_nodes:
            self.untainter = NodeUntainter(self.client, namespace=s.root_namespace)
            await self.untainter.start()
        if self.gateways is not None:
            await self.gateways.start()
        await self.server.start()
        self.publisher = RootCertPublisher(self.client, self.root.root_pem)
        await self.publisher.start()
        await self._start_crl(self.root)
        self._start_ca_watch(self.root)
        if s.webhook_port is not None:
            await self._start_webhook(self.root)
        log.info("control plane serving xDS and CA on %s:%d", s.host, self.server.port)

    async def _start_crl(self, root: RootCa) -> None:
        """With a plug-in CA, publish its CRL file (when there is one) as ConfigMaps and follow its changes."""
        s = self.settings
        path = s.crl_file or (self._plugin_dir / CRL_FILE if self._plugin_dir is not None else None)
        if not s.enable_ca_crl or path is None:
            return
        self.crl_publisher = ConfigMapPublisher(self.client, s.crl_config_map, CRL_KEY, None)
        await self.crl_publisher.start()
        anchors = (root.signer.cert_pem, root.root_pem)
        self.crl_watcher = CrlFileWatcher(
            path, self.crl_publisher.set_value, anchors=anchors, interval=s.crl_poll_interval
        )
        self.crl_watcher.poll()
        self._tasks.append(asyncio.create_task(self.crl_watcher.run(), name="CRL file watcher"))
        log.info("watching the plug-in CA's CRL file %s (ConfigMap %s)", path, s.crl_config_map)

    def _start_ca_watch(self, root: RootCa) -> None:
        """With a plug-in CA, follow its files: a changed good set signs from then on (:mod:`.ca.cawatch`)."""
        if self._plugin_paths is None or self.settings.ca_poll_interval <= 0:
            return
        self.ca_watcher = PluginCaWatcher(
            self._plugin_paths,
            root,
            on_reload=self._ca_reloaded,
            on_refused=self._ca_refused,
            interval=self.settings.ca_poll_interval,
        )
        self._tasks.append(asyncio.create_task(self.ca_watcher.run(), name="plug-in CA watcher"))
        log.info("watching the plug-in CA's files in %s", self._plugin_paths.cert.parent)

    def _ca_reloaded(self, root: RootCa, what: str) -> None:
        """Sign with the new CA from now on and publish its trust bundle; node proxies move to it as they refresh
        their certificates (at half life: :mod:`ambit.identity.manager`)."""
        self.root = root
        self.metrics.set_ca_expiry(*ca_expiry(root))
        if self.signer is not None:
            self.signer.set_root(root)
        if self.server is not None:
            # As istiod regenerates its own certificate: proxies that trust only the new root still reach us.
            self.server.set_certificate(*self._serving_certificate(root))
        if self.webhook is not None:
            self.webhook.rotate(root)
        if self.publisher is not None:
            self.publisher.set_root(root.root_pem)
        if self.crl_watcher is not None:
            self.crl_watcher.set_anchors((root.signer.cert_pem, root.root_pem))
        self.events.record(
            _CACERTS, "Normal", CA_RELOADED_REASON, f"signing with the new plug-in CA: {what}", CA_ACTION
        )

    def _ca_refused(self, refusal: Refusal, message: str) -> None:
        note = f"plug-in CA not taken ({refusal.value}): {message}; the CA in use keeps signing"
        self.events.record(_CACERTS, "Warning", CA_REFUSED_REASON, note, CA_ACTION)

    async def _start_webhook(self, root: RootCa) -> None:
        """Serve ``/validate`` with a certificate from the mesh CA, and register it (failurePolicy Fail)."""
        s = self.settings
        assert s.webhook_port is not None
        dial = s.webhook_host or (s.host if s.host not in ("0.0.0.0", "::") else "127.0.0.1")
        self.webhook = WebhookManager(
            self.client, host=s.host, port=s.webhook_port, dial=dial, service=s.webhook_service, observer=self.metrics
        )
        await self.webhook.start(root)

    async def aclose(self) -> None:
        self.heap.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.untainter is not None:
            await self.untainter.aclose()
        for closer in (
            self.monitoring.aclose() if self.monitoring else None,
            self.webhook.aclose() if self.webhook else None,
            self.server.aclose() if self.server else None,
            self.publisher.aclose() if self.publisher else None,
            self.crl_publisher.aclose() if self.crl_publisher else None,
            self.view.aclose(),
            self.gateways.aclose() if self.gateways else None,
            self.status.aclose(),
            self.waypoint_policy_status.aclose(),
            self.service_status.aclose(),
            self.service_entry_status.aclose(),
            self.entry_addresses.aclose(),
            *(writer.aclose() for writer in self.route_status),
            self.backend_tls_status.aclose(),
            self.pods.aclose(),
            self.events.aclose(),
        ):
            if closer is not None:
                with contextlib.suppress(Exception):
                    await closer


async def run_control_plane(settings: ControlPlaneSettings) -> None:
    """Run until SIGTERM or SIGINT; print one ready line once serving (the lab waits for it)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    budget = KubeClientSettings(qps=settings.kubernetes_api_qps, burst=settings.kubernetes_api_burst)
    client = (
        KubeClient.from_kubeconfig(settings.kubeconfig, settings=budget)
        if settings.kubeconfig
        else KubeClient.from_env(budget)
    )
    async with client:
        plane = ControlPlane(settings, client)
        try:
            await plane.start()
            assert plane.server is not None
            print(f"control plane ready on port {plane.server.port}", flush=True)
            await stop.wait()
        finally:
            await plane.aclose()

"""Starting and stopping the controllers together, on shared informers.

Order of ``start()``: build the shared informers (one per kind) and each controller with its Event recorder
(controllers add their handlers, which only queue keys); start the recorders and the informers; wait until
every informer has listed once; only then start the reconcile workers, so that no controller acts on a partial
cache (kube's ``WaitForCacheSync``). ``aclose()`` stops the workers, then the informers, then the recorders
(which first write the Events still queued).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from types import TracebackType

from ambit.k8s import EventRecorder, EventRecorderSettings, Informer, KubeClient, kinds
from ambit.lab.controllers.cronjob import CronJobController
from ambit.lab.controllers.daemonset import DaemonSetController
from ambit.lab.controllers.deployment import DeploymentController
from ambit.lab.controllers.disruption import DisruptionController
from ambit.lab.controllers.endpointslice import EndpointSliceController
from ambit.lab.controllers.job import JobController
from ambit.lab.controllers.legacy_endpoints import EndpointsController
from ambit.lab.controllers.loadbalancer import LoadBalancerController
from ambit.lab.controllers.persistentvolume import PersistentVolumeController
from ambit.lab.controllers.provisioner import LocalPathProvisioner
from ambit.lab.controllers.reconcile import ControllerError, ReconcileLoop, Reconciler
from ambit.lab.controllers.replicaset import ReplicaSetController
from ambit.lab.controllers.scheduler import Scheduler
from ambit.lab.controllers.settings import ENDPOINTS, ControllerSettings, Informers
from ambit.lab.controllers.slicing import CONTROLLER, MANAGED_BY
from ambit.lab.controllers.statefulset import StatefulSetController
from ambit.lab.controllers.taint_manager import TaintManager
from ambit.lab.controllers.ttl_after_finished import TtlAfterFinishedController

log = logging.getLogger("ambit.lab.controllers")


class ControllerManager:
    """The lab's controllers; ``async with`` it, or ``await start()`` then ``await aclose()``."""

    def __init__(
        self,
        client: KubeClient,
        settings: ControllerSettings | None = None,
        *,
        schedule_clock: Callable[[], float] = time.time,
    ) -> None:
        """``schedule_clock`` (seconds since the epoch) is what the CronJob and TTL-after-finished controllers read
        the time from: tests pass their own to fire schedules and expire Jobs."""
        self.client = client
        self.settings = settings or ControllerSettings()
        s = self.settings

        def informer(kind: kinds.ResourceKind, label_selector: dict[str, str] | None = None) -> Informer:
            return Informer(client, kind, label_selector=label_selector, settings=s.informer)

        self.informers = Informers(
            pods=informer(kinds.PODS),
            nodes=informer(kinds.NODES),
            services=informer(kinds.SERVICES),
            deployments=informer(kinds.DEPLOYMENTS),
            replicasets=informer(kinds.REPLICA_SETS),
            endpointslices=informer(kinds.ENDPOINT_SLICES, {MANAGED_BY: CONTROLLER}),
            endpoints=informer(ENDPOINTS),
            daemonsets=informer(kinds.DAEMON_SETS),
            statefulsets=informer(kinds.STATEFUL_SETS),
            controllerrevisions=informer(kinds.CONTROLLER_REVISIONS),
            poddisruptionbudgets=informer(kinds.POD_DISRUPTION_BUDGETS),
            jobs=informer(kinds.JOBS),
            cronjobs=informer(kinds.CRON_JOBS),
            persistentvolumeclaims=informer(kinds.PERSISTENT_VOLUME_CLAIMS),
            persistentvolumes=informer(kinds.PERSISTENT_VOLUMES),
            storageclasses=informer(kinds.STORAGE_CLASSES),
        )
        self.recorders: list[EventRecorder] = []
        self.controllers: dict[str, Reconciler] = {}
        self.loops: list[ReconcileLoop] = []
        if s.scheduler:
            self._add(Scheduler(client, self.informers, self._recorder(Scheduler.name), s), workers=1)
        if s.workloads:
            self._add(DeploymentController(client, self.informers, self._recorder(DeploymentController.name), s))
            self._add(ReplicaSetController(client, self.informers, self._recorder(ReplicaSetController.name), s))
            self._add(DaemonSetController(client, self.informers, self._recorder(DaemonSetController.name), s))
            self._add(StatefulSetController(client, self.informers, self._recorder(StatefulSetController.name), s))
        if s.batch:
            self._add(JobController(client, self.informers, self._recorder(JobController.name), s))
            recorder = self._recorder(CronJobController.name)
            self._add(CronJobController(client, self.informers, recorder, s, clock=schedule_clock))
            recorder = self._recorder(TtlAfterFinishedController.name)
            self._add(TtlAfterFinishedController(client, self.informers, recorder, s, clock=schedule_clock))
        if s.volumes:
            self._add(
                PersistentVolumeController(client, self.informers, self._recorder(PersistentVolumeController.name), s)
            )
        if s.local_path_dir is not None:
            recorder = self._recorder(LocalPathProvisioner.name)
            self._add(LocalPathProvisioner(client, self.informers, recorder, s, lab_dir=s.local_path_dir))
        if s.disruption:
            self._add(DisruptionController(client, self.informers, self._recorder(DisruptionController.name), s))
        if s.taint_eviction:
            self._add(TaintManager(client, self.informers, self._recorder(TaintManager.name), s), workers=1)
        if s.endpoints:
            self._add(EndpointSliceController(client, self.informers, self._recorder(EndpointSliceController.name), s))
            self._add(EndpointsController(client, self.informers, self._recorder(EndpointsController.name), s))
        if s.load_balancer_cidr is not None:
            recorder = self._recorder(LoadBalancerController.name)
            # One worker: addresses are planned for all Services at once, never by two reconciles apart.
            self._add(LoadBalancerController(client, self.informers, recorder, s, cidr=s.load_balancer_cidr), workers=1)
        self._started = False

    def _recorder(self, controller: str) -> EventRecorder:
        settings = EventRecorderSettings(
            reporting_controller=controller, reporting_instance=self.settings.reporting_instance
        )
        recorder = EventRecorder(self.client, settings)
        self.recorders.append(recorder)
        return recorder

    def _add(self, reconciler: Reconciler, workers: int | None = None) -> None:
        self.controllers[reconciler.name] = reconciler
        self.loops.append(ReconcileLoop(reconciler, workers or self.settings.workers, self.settings.resync))

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        for recorder in self.recorders:
            recorder.start()
        for inf in self.informers.all():
            inf.start()
        try:
            async with asyncio.timeout(self.settings.sync_timeout):
                for inf in self.informers.all():
                    await inf.wait_synced()
        except TimeoutError:
            await self.aclose()
            raise ControllerError(
                f"the controllers' caches did not sync within {self.settings.sync_timeout:g}s "
                f"(is the API server at {self.client.connection.server} up?)"
            ) from None
        except BaseException:
            await self.aclose()
            raise
        for loop in self.loops:
            loop.start()
        log.info("controllers running: %s", ", ".join(self.controllers))

    async def aclose(self) -> None:
        for loop in self.loops:
            await loop.aclose()
        for inf in self.informers.all():
            await inf.aclose()
        for recorder in self.recorders:
            with contextlib.suppress(Exception):
                await recorder.aclose()

    async def __aenter__(self) -> ControllerManager:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


async def run_controllers(client: KubeClient, settings: ControllerSettings) -> None:
    """Run the controllers until cancelled (what ``ambit lab up`` runs)."""
    async with ControllerManager(client, settings):
        await asyncio.Event().wait()

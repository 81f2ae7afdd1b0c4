"""The lab's controllers: kube-scheduler and kube-controller-manager's Deployment, ReplicaSet, DaemonSet,
StatefulSet, Job, CronJob, TTL-after-finished, NoExecute taint eviction, disruption (PodDisruptionBudget status),
PersistentVolume, EndpointSlice and Endpoints controllers and rancher's local-path provisioner, simplified, in one
process (``ambit lab up`` runs :func:`run_controllers`).

Each controller is an informer-driven reconcile loop (:mod:`reconcile`) around a :mod:`controller` shell (its queue,
the cache of its kind, and the claiming and pod deletion that owners of objects share): informer handlers only queue
keys (``namespace/name``) on a de-duplicating work queue (:mod:`workqueue`); workers take a key, read the object and
what it relates to from the shared caches, and write what differs. Failures are retried per key with back-off; one
bad object is logged and reported with a Warning Event, and never stops the loop.

Modules: ``scheduler`` and ``placement`` (binding pods to nodes: kube-scheduler's NodeUnschedulable, NodeName,
TaintToleration and NodeAffinity filters), ``taint_manager`` and ``eviction`` (NoExecute taints), ``deployment`` and
``rollout`` (Deployments to ReplicaSets), ``replicaset`` and ``expectations`` (ReplicaSets to pods), ``daemonset``,
``daemon_rollout`` and ``revisions`` (DaemonSets to pods, with their ControllerRevision history), ``statefulset``,
``stateful_rollout`` and ``stateful_claims`` (StatefulSets to pods named by ordinal and their claims;
``revision_history`` writes both kinds' revisions), ``persistentvolume`` and ``volume_binding`` (claims bound to
PersistentVolumes, phases, protection finalizers), ``provisioner`` and ``local_path`` (kind's local-path
provisioner), ``volume_scheduling`` (the scheduler's VolumeBinding filter), ``job`` and ``job_progress`` (Jobs
to pods, each counted once), ``cronjob`` and ``cron_runs`` (CronJobs to Jobs on a schedule), ``ttl_after_finished``
(finished Jobs deleted), ``disruption`` and ``budgets``
(PodDisruptionBudgets' status, which the API server's eviction subresource charges), ``endpointslice``, ``slicing``,
``legacy_endpoints`` and ``endpoints`` (Services to EndpointSlices and Endpoints), ``ownership``, ``pods`` and
``selectors`` (reading objects), ``manager`` and ``settings`` (running them together). Each pair splits as the style
asks: a pure module of decisions, a thin reconciler.

Not done: Jobs' ``podFailurePolicy``, ``successPolicy``, ``backoffLimitPerIndex`` and ``managedBy`` (stored, not
acted on); StatefulSet ``maxUnavailable`` (alpha in kube); volume expansion, Block volumes, CSI and snapshots
(only hostPath and local volumes, and rancher's local-path provisioner); scheduler resources, inter-pod affinity,
preferred affinity and scoring beyond the least-loaded node, preemption (pods get their priority, nothing acts on
it); a node lifecycle controller (the scheduler treats a node that is not Ready as tainted ``not-ready:NoSchedule``,
but nothing adds NoExecute taints to failed nodes); the disruption controller's ReplicationController and custom-
resource scale finders (the lab serves neither, so budgets over their pods fail to sync when they need a scale, with
kube's reasons) and the stale ``DisruptionTarget`` condition clean-up; DaemonSet failed-pod back-off and
``DaemonSet`` conditions; Deployment progress deadlines and proportional scaling during a rollout; pod garbage
collection (Failed pods stay); per-controller RBAC roles (the controllers run as the lab's admin).

Errors::

    AmbitError
    └── ControllerError          a controller could not start (caches did not sync)
        └── SyncError            one object's reconcile failed; becomes a Warning Event and a retry
"""

from ambit.lab.controllers.manager import ControllerManager, run_controllers
from ambit.lab.controllers.reconcile import ControllerError, SyncError
from ambit.lab.controllers.settings import ControllerSettings

__all__ = ["ControllerError", "ControllerManager", "ControllerSettings", "SyncError", "run_controllers"]

"""Kubernetes access for every component: a REST client, watches, informers and an Event recorder.

This is the only package that imports the Kubernetes client library. The same code talks to a real cluster and to
the embedded API server (:mod:`ambit.apiserver`).

Choice of client: lightkube is used for what it does well, reading configuration (``lightkube.KubeConfig``:
contexts, CA and client certificates, token, token file and exec credentials), on top of httpx (``httpx2``, the
transport lightkube is built on). Requests, watches and decoding are ours, not lightkube's ``AsyncClient``:

- Objects are plain dicts (the JSON) for built-in kinds and any CRD alike, decoded by msgspec in one pass.
  lightkube decodes built-in kinds into its model structs and CRDs into generic wrappers, and components would
  come to depend on those classes. Speed is not the reason: lightkube 1.0 decodes with msgspec too, and both
  take about 2 ms to list 300 ConfigMaps and 0.5 ms for a get from the embedded server.
- Watch semantics are the protocol's: bookmarks are asked for and delivered, each event's resourceVersion is
  kept for resuming, and ``410 Gone`` is raised as :class:`KubeGoneError` whether it comes as an HTTP 410 or as
  an ``ERROR`` event, so that an :class:`Informer` relists and diffs. lightkube's watch does not ask for
  bookmarks and, when told to retry, answers 410 by watching again from "now", losing every change in between.
- Errors leave as :class:`KubeClientError` / :class:`KubeApiStatusError` (see :mod:`ambit.k8s.errors`), never as
  httpx or lightkube exceptions.

Modules: ``kinds`` (which resources), ``connection`` (where the server is, how to authenticate), ``client`` (the
verbs), ``watch`` (one watch stream), ``informer`` (list + watch into a cache, with handlers), ``events`` (Events
with series folding), ``errors``, and the pure ``patch`` (JSON, merge and strategic merge patches, shared by the
embedded API server and the gateway controller's overlays).
"""

from ambit.k8s.client import KubeClient, KubeClientSettings, PatchType, Selector
from ambit.k8s.connection import Connection, TokenFileAuth, load_from_env, load_in_cluster, load_kubeconfig
from ambit.k8s.errors import (
    KubeAlreadyExistsError,
    KubeApiStatusError,
    KubeBadRequestError,
    KubeClientError,
    KubeConfigError,
    KubeConflictError,
    KubeForbiddenError,
    KubeGoneError,
    KubeInvalidError,
    KubeNotFoundError,
    KubeUnauthorizedError,
)
from ambit.k8s.events import EventRecorder, EventRecorderSettings, EventRecorderStats
from ambit.k8s.informer import Informer, InformerSettings, InformerStats
from ambit.k8s.kinds import ResourceKind
from ambit.k8s.watch import Watch, WatchEvent, WatchEventType

__all__ = [
    "Connection",
    "EventRecorder",
    "EventRecorderSettings",
    "EventRecorderStats",
    "Informer",
    "InformerSettings",
    "InformerStats",
    "KubeAlreadyExistsError",
    "KubeApiStatusError",
    "KubeBadRequestError",
    "KubeClient",
    "KubeClientError",
    "KubeClientSettings",
    "KubeConfigError",
    "KubeConflictError",
    "KubeForbiddenError",
    "KubeGoneError",
    "KubeInvalidError",
    "KubeNotFoundError",
    "KubeUnauthorizedError",
    "PatchType",
    "ResourceKind",
    "Selector",
    "TokenFileAuth",
    "Watch",
    "WatchEvent",
    "WatchEventType",
    "load_from_env",
    "load_in_cluster",
    "load_kubeconfig",
]

"""istiod's own metrics for the control plane, kept in plain counters and rendered as Prometheus text.

Theory of operation
-------------------
:class:`ControlPlaneMetrics` holds every series the control plane reports on its monitoring port, under istiod's
names and labels, and is told about events where they happen:

- the delta-xDS server (:class:`ambit.xds.service_metrics.XdsObserver`, which this class implements): clients connected
  by proxy version (``pilot_xds``), each response built and written (``pilot_xds_pushes``,
  ``pilot_xds_push_time``, ``pilot_xds_config_size_bytes`` by type), each write (``pilot_xds_send_time``), each
  push round of a stream (``pilot_push_triggers`` by reason, with istiod's merged event counts,
  ``pilot_proxy_convergence_time``), NACKs
  (``pilot_total_xds_rejects``), ACKs of a nonce no longer in flight (``pilot_xds_expired_nonce``) and streams
  that failed (``pilot_total_xds_internal_errors``);
- the CA service (:class:`ambit.controlplane.ca.server.CaObserver`): ``citadel_server_*`` counters, and the
  expiry of the root and of the signing CA's chain whenever the CA in use is set;
- the informers: ``pilot_k8s_reg_events`` for the service registry's kinds and ``pilot_k8s_cfg_events`` for
  Istio's and the Gateway API's kinds, by kind and event (add, update, delete);
- the translation: ``pilot_services``, the number of services (Services and ServiceEntry hosts) it produced;
- the cluster view (:class:`ambit.controlplane.view.ViewObserver`, which this class implements): how long each
  translation took (``pilot_pushcontext_init_seconds``, istiod's push context init) and, for each burst of changes,
  the time from its first change to the end of its hand-over (``pilot_debounce_time``: the debounce wait plus the
  translation, measured where istiod measures it, after the merged push is queued);
- the webhook: ``galley_validation_passed`` and ``galley_validation_failed`` (by group, version, resource, and for
  failures the reason).

Rules:

1. Recording is a dictionary lookup of a series made once per distinct label values, then an integer or float
   addition: no label tuple or string is built per event. Label values come from small closed sets (xDS types
   served, Kubernetes kinds watched, trigger reasons), except the proxy version, which a client states: it is cut
   to :data:`MAX_VERSION_LENGTH` characters and its series goes away with the last client stating it, so the
   ``pilot_xds`` series are at most as many as the streams connected.
2. Everything is called on the event loop's thread (the xDS streams, the CA's coroutines, informer handlers and
   the scrape handler all run there), so nothing takes a lock.
3. Counters are exposed without a ``_total`` suffix and with ``# TYPE <name> counter``, as istiod's exporter does
   (prometheus_client's text writer always appends ``_total`` to a counter's name, so :func:`render_families`
   writes the text from the library's metric families itself). Histograms use istiod's buckets.
4. The process's own metrics (``process_cpu_seconds_total``, ``process_resident_memory_bytes``, open file
   descriptors, start time) come from prometheus_client's process collector.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString as _untyped_go_float

from ambit.k8s.informer import OnAdd, OnDelete, OnUpdate
from ambit.k8s.kinds import ResourceKind

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
COMPONENT = "pilot"
"""``istio_build``'s component label for istiod."""

PUSH_TIME_BUCKETS = (0.01, 0.1, 0.5, 1.0, 3.0, 5.0, 10.0, 20.0, 30.0)
CONVERGENCE_BUCKETS = (0.1, 0.5, 1.0, 3.0, 5.0, 10.0, 20.0, 30.0)
SEND_TIME_BUCKETS = (0.01, 0.1, 1.0, 3.0, 5.0, 10.0, 20.0, 30.0)
DEBOUNCE_BUCKETS = (0.01, 0.1, 0.5, 1.0, 3.0, 5.0, 10.0, 20.0, 30.0)
PUSHCONTEXT_INIT_BUCKETS = (0.01, 0.1, 0.5, 1.0, 3.0, 5.0)
CONFIG_SIZE_BUCKETS = (1.0, 10_000.0, 1_000_000.0, 4_000_000.0, 10_000_000.0, 40_000_000.0)

ADDRESS_TYPE = "type.googleapis.com/istio.workload.Address"
WORKLOAD_TYPE = "type.googleapis.com/istio.workload.Workload"
AUTHORIZATION_TYPE = "type.googleapis.com/istio.security.Authorization"
_METRIC_TYPES = {ADDRESS_TYPE: "wds", WORKLOAD_TYPE: "wds", AUTHORIZATION_TYPE: "wads"}
"""istiod's short names of xDS types in metric labels (``GetMetricType``); other types keep their URL."""
AMBIENT_TYPES = frozenset(_METRIC_TYPES)
AMBIENT_TRIGGER = "ambient"
"""The push reason of the workload API's types (istiod's ambient index pushes with ``AmbientUpdate``)."""
CONFIG_TRIGGER = "config"
"""The push reason of every other type (waypoint and gateway configurations: istiod's ``ConfigUpdate``)."""

REGISTRY_KINDS = {"Pod": "Pods", "Service": "Services", "EndpointSlice": "EndpointSlice"}
REGISTRY_KINDS |= {"Namespace": "Namespaces", "Node": "Nodes"}
"""Kubernetes kinds istiod's service registry watches, with the ``type`` label it counts their events under."""
KUBE_EVENTS = ("add", "update", "delete")
MAX_VERSION_LENGTH = 64
"""Longest proxy version kept as a label value (a client states its own)."""
CONFIG_GROUPS = ("istio.io", "gateway.networking.k8s.io")
"""API groups (and their subgroups) whose kinds are counted as configuration events."""


_go_float = cast(Callable[[float], str], _untyped_go_float)
"""A number as Go's Prometheus client writes it (``1e+06``, ``+Inf``), for bucket bounds and values."""


def metric_type(type_url: str) -> str:
    """The ``type`` label istiod gives an xDS type URL."""
    return _METRIC_TYPES.get(type_url, type_url)


@dataclass(slots=True)
class Count:
    """One counter series."""

    value: int = 0

    def inc(self, by: int = 1) -> None:
        self.value += by


@dataclass(slots=True)
class Histogram:
    """One histogram series: per-bucket counts (the last bucket is +Inf), their sum, in istiod's buckets."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value


@dataclass(slots=True)
class _TypeSeries:
    """The series of one xDS type, looked up once per response by type URL."""

    pushes: Count
    push_time: Histogram
    config_size: Histogram
    rejects: Count
    expired_nonces: Count
    trigger: Count


class ControlPlaneMetrics:
    """istiod's metrics for one control plane; see the module docstring for where each is counted."""

    content_type = CONTENT_TYPE

    def __init__(
        self,
        *,
        version: str,
        clock: Callable[[], float] = time.time,
        process: bool = True,
    ) -> None:
        """``version`` is the build's version (``istio_build``'s tag, ``pilot_info``, ``/version``); ``process``
        adds the process collector (tests of several instances in one process leave it out)."""
        self.version = version
        self._clock = clock
        self._started = clock()
        self.xds_clients: dict[str, int] = {}
        """Connected streams by the proxy version they stated (``pilot_xds``)."""
        self._types: dict[str, _TypeSeries] = {}
        self.pushes: dict[str, Count] = {}
        self.push_time: dict[str, Histogram] = {}
        self.config_size: dict[str, Histogram] = {}
        self.rejects: dict[str, Count] = {}
        self.expired_nonces: dict[str, Count] = {}
        self.triggers: dict[str, Count] = {}
        self.send_time = Histogram(SEND_TIME_BUCKETS)
        self.convergence = Histogram(CONVERGENCE_BUCKETS)
        self.debounce_time = Histogram(DEBOUNCE_BUCKETS)
        self.pushcontext_init = Histogram(PUSHCONTEXT_INIT_BUCKETS)
        self.internal_errors = 0
        self.services = 0
        self.reg_events: dict[tuple[str, str], Count] = {}
        self.cfg_events: dict[tuple[str, str], Count] = {}
        self.csr = 0
        self.authentication_failures = 0
        self.csr_parsing_errors = 0
        self.issued = 0
        self.root_expiry: float | None = None
        self.chain_expiry: float | None = None
        self.validation_passed: dict[tuple[str, str, str], Count] = {}
        self.validation_failed: dict[tuple[str, str, str, str], Count] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))
        if process:
            ProcessCollector(registry=self.registry)

    # --- xDS (ambit.xds.service_metrics.XdsObserver) ------------------------------------------------------------------

    def _series(self, type_url: str) -> _TypeSeries:
        series = self._types.get(type_url)
        if series is None:
            label = metric_type(type_url)
            trigger = AMBIENT_TRIGGER if type_url in AMBIENT_TYPES else CONFIG_TRIGGER
            series = self._types[type_url] = _TypeSeries(
                pushes=self.pushes.setdefault(label, Count()),
                push_time=self.push_time.setdefault(label, Histogram(PUSH_TIME_BUCKETS)),
                # istiod labels the size with the full type URL, unlike its other per-type series.
                config_size=self.config_size.setdefault(type_url, Histogram(CONFIG_SIZE_BUCKETS)),
                rejects=self.rejects.setdefault(label, Count()),
                expired_nonces=self.expired_nonces.setdefault(label, Count()),
                trigger=self.triggers.setdefault(trigger, Count()),
            )
        return series

    def client_connected(self, version: str) -> None:
        version = version[:MAX_VERSION_LENGTH]
        self.xds_clients[version] = self.xds_clients.get(version, 0) + 1

    def client_disconnected(self, version: str) -> None:
        version = version[:MAX_VERSION_LENGTH]
        left = self.xds_clients.get(version, 0) - 1
        if left > 0:
            self.xds_clients[version] = left
        else:  # a version nobody states any more has no series: clients cannot grow the set by reconnecting
            self.xds_clients.pop(version, None)

    def response_written(self, type_url: str, seconds: float) -> None:
        """A response of ``type_url`` was built and written, in ``seconds``."""
        series = self._series(type_url)
        series.pushes.inc()
        series.push_time.observe(seconds)

    def config_sent(self, type_url: str, size: int) -> None:
        """A response of ``type_url`` of ``size`` bytes went to a client (istiod counts the resources' bytes; the
        response around them adds a few dozen)."""
        self._series(type_url).config_size.observe(size)

    def write_took(self, seconds: float) -> None:
        self.send_time.observe(seconds)

    def push_round(self, changed: Mapping[str, int], converged: float | None) -> None:
        """A stream woke to push the changes in ``changed`` (resource names changed, by type URL); ``converged``:
        seconds from the first change to the last response written (None: the changes turned out to be nothing this
        stream sees).

        ``pilot_push_triggers`` counts as istiod's does: a push carries the merged count of the events behind it by
        reason, and each client's push adds that count to its reasons' series (five pods changed within one debounce
        add 5 to ``ambient`` for every client pushed). Here an event is one changed resource name of a type."""
        for type_url, count in changed.items():
            if count > 0:
                self._series(type_url).trigger.inc(count)
        if converged is not None:
            self.convergence.observe(converged)

    def translated(self, seconds: float) -> None:
        """The cluster view translated its caches (istiod's push context init): ``pilot_pushcontext_init_seconds``."""
        self.pushcontext_init.observe(seconds)

    def debounced(self, seconds: float) -> None:
        """A burst of changes was handed over, ``seconds`` after its first change was seen (translation included):
        ``pilot_debounce_time``."""
        self.debounce_time.observe(seconds)

    def rejected(self, type_url: str) -> None:
        self._series(type_url).rejects.inc()

    def nonce_expired(self, type_url: str) -> None:
        self._series(type_url).expired_nonces.inc()

    def stream_failed(self) -> None:
        self.internal_errors += 1

    # --- the CA (ambit.controlplane.ca.server.CaObserver) ----------------------------------------------------

    def csr_received(self) -> None:
        self.csr += 1

    def authentication_failed(self) -> None:
        self.authentication_failures += 1

    def csr_malformed(self) -> None:
        self.csr_parsing_errors += 1

    def certificate_issued(self) -> None:
        self.issued += 1

    def set_ca_expiry(self, root_not_after: float, chain_not_after: float | None) -> None:
        """The root's expiry, and the signing CA's when it is an intermediate (istiod has no chain otherwise)."""
        self.root_expiry = root_not_after
        self.chain_expiry = chain_not_after

    # --- informers, translation, webhook ---------------------------------------------------------------------

    def kube_events(self, group: str, kind: str) -> Mapping[str, Count] | None:
        """The counters of ``add``, ``update`` and ``delete`` events of ``group``/``kind`` (None: a kind istiod
        does not count); an informer's handlers bump them (rule 1: made once per kind)."""
        registry_type = REGISTRY_KINDS.get(kind) if group in ("", "discovery.k8s.io") else None
        if registry_type is not None:
            family, label = self.reg_events, registry_type
        elif any(group == g or group.endswith("." + g) for g in CONFIG_GROUPS):
            family, label = self.cfg_events, kind
        else:
            return None
        return {event: family.setdefault((label, event), Count()) for event in KUBE_EVENTS}

    def event_handlers(self, kind: ResourceKind) -> tuple[OnAdd, OnUpdate, OnDelete] | None:
        """Informer handlers that count ``kind``'s events (None for a kind istiod does not count)."""
        counts = self.kube_events(kind.group, kind.kind)
        if counts is None:
            return None
        add, update, delete = counts["add"], counts["update"], counts["delete"]

        def on_add(obj: Any) -> None:
            add.inc()

        def on_update(old: Any, new: Any) -> None:
            update.inc()

        def on_delete(obj: Any) -> None:
            delete.inc()

        return on_add, on_update, on_delete

    def set_services(self, count: int) -> None:
        self.services = count

    def validation_passed_for(self, group: str, version: str, resource: str) -> None:
        key = (group, version, resource)
        counter = self.validation_passed.get(key) or self.validation_passed.setdefault(key, Count())
        counter.inc()

    def validation_failed_for(self, group: str, version: str, resource: str, reason: str) -> None:
        key = (group, version, resource, reason)
        counter = self.validation_failed.get(key) or self.validation_failed.setdefault(key, Count())
        counter.inc()

    # --- exposition ------------------------------------------------------------------------------------------

    def render(self) -> bytes:
        """The Prometheus text exposition (format 0.0.4) of every series and the process's metrics."""
        return render_families(self.registry.collect())

    def families(self) -> Iterator[Metric]:
        now = self._clock()
        yield _gauge(
            "istio_build", "Istio component build info", ("component", "tag"), [((COMPONENT, self.version), 1)]
        )
        yield _gauge("pilot_info", "Pilot version and build information.", ("version",), [((self.version,), 1)])
        yield _gauge(
            "istiod_uptime_seconds", "Current istiod server uptime in seconds", (), [((), now - self._started)]
        )
        yield _gauge(
            "pilot_xds",
            "Number of endpoints connected to this pilot using XDS.",
            ("version",),
            [((v,), n) for v, n in self.xds_clients.items()],
        )
        yield _gauge("pilot_services", "Total services known to pilot.", (), [((), self.services)])
        yield _counter(
            "pilot_xds_pushes",
            "Pilot build and send errors for lds, rds, cds and eds.",
            ("type",),
            [((t,), c.value) for t, c in self.pushes.items()],
        )
        yield _histogram(
            "pilot_xds_push_time",
            "Total time in seconds Pilot takes to push lds, rds, cds and eds.",
            ("type",),
            [((t,), h) for t, h in self.push_time.items()],
        )
        yield _histogram(
            "pilot_xds_config_size_bytes",
            "Distribution of configuration sizes pushed to clients",
            ("type",),
            [((t,), h) for t, h in self.config_size.items()],
        )
        yield _histogram(
            "pilot_xds_send_time",
            "Total time in seconds Pilot takes to send generated configuration.",
            (),
            [((), self.send_time)],
        )
        yield _histogram(
            "pilot_proxy_convergence_time",
            "Delay in seconds between config change and a proxy receiving all required configuration.",
            (),
            [((), self.convergence)],
        )
        yield _histogram(
            "pilot_debounce_time",
            "Delay in seconds between the first config enters debouncing and the merged push request is pushed into "
            "the push queue (includes pushcontext_init_seconds).",
            (),
            [((), self.debounce_time)],
        )
        yield _histogram(
            "pilot_pushcontext_init_seconds",
            "Total time in seconds Pilot takes to init pushContext.",
            (),
            [((), self.pushcontext_init)],
        )
        yield _counter(
            "pilot_push_triggers",
            "Total number of times a push was triggered, labeled by reason for the push.",
            ("type",),
            [((t,), c.value) for t, c in self.triggers.items()],
        )
        yield _counter(
            "pilot_total_xds_rejects",
            "Total number of XDS responses from pilot rejected by proxy.",
            ("type",),
            [((t,), c.value) for t, c in self.rejects.items() if c.value],
        )
        yield _counter(
            "pilot_xds_expired_nonce",
            "Total number of XDS requests with an expired nonce.",
            ("type",),
            [((t,), c.value) for t, c in self.expired_nonces.items() if c.value],
        )
        yield _counter(
            "pilot_total_xds_internal_errors",
            "Total number of internal XDS errors in pilot.",
            (),
            [((), self.internal_errors)],
        )
        yield _counter(
            "pilot_k8s_reg_events",
            "Events from k8s registry.",
            ("type", "event"),
            [(k, c.value) for k, c in self.reg_events.items()],
        )
        yield _counter(
            "pilot_k8s_cfg_events",
            "Events from k8s config.",
            ("type", "event"),
            [(k, c.value) for k, c in self.cfg_events.items()],
        )
        yield _counter(
            "galley_validation_passed",
            "Resource is valid",
            ("group", "version", "resource"),
            [(k, c.value) for k, c in self.validation_passed.items()],
        )
        yield _counter(
            "galley_validation_failed",
            "Resource validation failed",
            ("group", "version", "resource", "reason"),
            [(k, c.value) for k, c in self.validation_failed.items()],
        )
        for name, doc, value in (
            ("citadel_server_csr_count", "The number of CSRs received by Citadel server.", self.csr),
            ("citadel_server_authentication_failure_count", "The number of authentication failures.",
             self.authentication_failures),
            ("citadel_server_csr_parsing_err_count", "The number of errors occurred when parsing the CSR.",
             self.csr_parsing_errors),
            ("citadel_server_success_cert_issuance_count",
             "The number of certificates issuances that have succeeded.", self.issued),
        ):  # fmt: skip
            yield _counter(name, doc, (), [((), value)])
        if self.root_expiry is not None:
            yield _gauge(
                "citadel_server_root_cert_expiry_timestamp",
                "The unix timestamp, in seconds, when the root cert will expire.",
                (),
                [((), self.root_expiry)],
            )
            yield _gauge(
                "citadel_server_root_cert_expiry_seconds",
                "The time remaining, in seconds, before the root cert will expire. "
                "A negative value indicates the cert is expired.",
                (),
                [((), self.root_expiry - now)],
            )
        if self.chain_expiry is not None:
            yield _gauge(
                "citadel_server_cert_chain_expiry_timestamp",
                "The unix timestamp, in seconds, when Istio generated cert chain will expire.",
                (),
                [((), self.chain_expiry)],
            )
            yield _gauge(
                "citadel_server_cert_chain_expiry_seconds",
                "The time remaining, in seconds, before the Istio Generated cert chain will expire. "
                "A negative value indicates the cert is expired.",
                (),
                [((), self.chain_expiry - now)],
            )


Samples = Sequence[tuple[tuple[str, ...], float]]


def _labelled(names: Sequence[str], values: Sequence[str]) -> dict[str, str]:
    return dict(zip(names, values, strict=True))


def _gauge(name: str, doc: str, labels: Sequence[str], samples: Samples) -> Metric:
    metric = Metric(name, doc, "gauge")
    for values, value in samples:
        metric.add_sample(name, _labelled(labels, values), value)
    return metric


def _counter(name: str, doc: str, labels: Sequence[str], samples: Samples) -> Metric:
    metric = Metric(name, doc, "counter")
    for values, value in samples:
        metric.add_sample(name, _labelled(labels, values), value)  # no _total: istiod's names (rule 3)
    return metric


def _histogram(
    name: str, doc: str, labels: Sequence[str], series: Sequence[tuple[tuple[str, ...], Histogram]]
) -> Metric:
    metric = Metric(name, doc, "histogram")
    for values, histogram in series:
        base = _labelled(labels, values)
        cumulative = 0
        for bound, count in zip((*histogram.bounds, float("inf")), histogram.counts, strict=True):
            cumulative += count
            metric.add_sample(f"{name}_bucket", base | {"le": _go_float(bound)}, cumulative)
        metric.add_sample(f"{name}_sum", base, histogram.total)
        metric.add_sample(f"{name}_count", base, cumulative)
    return metric


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _escape_value(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def render_families(families: Iterable[Metric]) -> bytes:
    """Prometheus text format 0.0.4 of ``families``: a counter's TYPE line names its samples as they are (with
    ``_total`` only where the samples have it), labels sorted by name."""
    out: list[str] = []
    for metric in families:
        name, kind = metric.name, metric.type
        if kind == "counter" and any(s.name.endswith("_total") for s in metric.samples):
            name = f"{name}_total"
        elif kind not in ("counter", "gauge", "histogram", "summary"):
            kind = "untyped"
        out.append(f"# HELP {name} {_escape_help(metric.documentation)}\n# TYPE {name} {kind}\n")
        for sample in metric.samples:
            if sample.name.endswith("_created"):
                continue
            labels = ",".join(f'{k}="{_escape_value(v)}"' for k, v in sorted(sample.labels.items()))
            text = f"{{{labels}}}" if labels else ""
            out.append(f"{sample.name}{text} {_go_float(sample.value)}\n")
    return "".join(out).encode()


class _Collector(Collector):
    def __init__(self, metrics: ControlPlaneMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self._metrics.families()

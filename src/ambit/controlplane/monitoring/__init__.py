"""The control plane's monitoring: istiod's metrics (:mod:`.metrics`) and the port that serves them (:mod:`.server`,
15014: ``/metrics`` and ``/version``)."""

from __future__ import annotations

from ambit.controlplane.monitoring.metrics import ControlPlaneMetrics
from ambit.controlplane.monitoring.server import MONITORING_PORT, MonitoringServer

__all__ = ["MONITORING_PORT", "ControlPlaneMetrics", "MonitoringServer"]

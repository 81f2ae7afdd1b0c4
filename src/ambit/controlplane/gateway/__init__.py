"""The gateway deployment controller: waypoint Gateways (class ``istio-waypoint``) become a ServiceAccount, a
Deployment running ``ambit waypoint proxy`` and a Service (and, when an overlay asks, a HorizontalPodAutoscaler and
a PodDisruptionBudget), with the Gateway's status, as istiod deploys them.

Modules: ``render`` (a Gateway's objects, pure), ``overlay`` (the ConfigMap overlays on them: class defaults and
``parametersRef``, pure), ``injection`` (the ``istio-sidecar-injector`` templates as the first overlay, pure),
``gotemplate`` (the Go ``text/template`` subset those templates are written in, pure), ``apply`` (create or
patch, decided without I/O), ``status`` (the Gateway's and GatewayClass's status, pure), ``revision`` (which
Gateways this control plane's revision controls, pure), ``controller`` (the asyncio shell: informers, writes).
"""

from __future__ import annotations

from ambit.controlplane.gateway.controller import GatewayController, GatewayControllerSettings
from ambit.controlplane.gateway.render import WaypointTemplateSettings

__all__ = ["GatewayController", "GatewayControllerSettings", "WaypointTemplateSettings"]

"""The waypoint's route configuration as the shell reads it, and the router it uses until the engine is wired.

Theory of operation: :class:`RouteConfig` holds one :class:`~ambit.model.routes.WaypointConfig` and swaps it
whole (:meth:`RouteConfig.replace`), so a request sees either the old tables or the new ones, never a mix; the
shell asks :meth:`RouteConfig.find_table` per request, so a new configuration applies from the next request on.
Until the control plane sends a ``WaypointConfig`` the tables are empty: Istio's default, every Service routes to
itself. A destination without HTTP rules takes the default route with the configuration's ``default_retry`` (the
mesh config's ``defaultHttpRetryPolicy``): :meth:`RouteConfig.find_table` hands the engine a table carrying it
(made once per destination and configuration) when it differs from Istio's default.

:func:`forward_unchanged` is a :data:`~ambit.waypoint.decisions.Router` for that default alone (every request
forwarded to the addressed Service as received), for tests; the waypoint runs
:func:`ambit.waypoint.routing.waypoint_route`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ambit.model.destination_policy import DestinationPolicy
from ambit.model.routes import ISTIO_RETRY, BackendService, RouteTable, WaypointConfig
from ambit.waypoint.decisions import Decision, Forward, RequestHead
from ambit.waypoint.destinations import Refusal
from ambit.waypoint.traffic_policy import BackendPolicy, plan_backend

MAX_PLANS = 4096
"""Backend plans remembered per configuration (a backend is a Service port and subset: few per waypoint)."""


class RouteConfig:
    """The current :class:`WaypointConfig`, replaced atomically."""

    __slots__ = ("_config", "_defaults", "_dynamic", "_listed", "_plans", "_racing", "_rules")

    def __init__(self, config: WaypointConfig | None = None) -> None:
        self._config = config if config is not None else WaypointConfig(waypoint="")
        self._rules = {rule.service_key: rule for rule in self._config.destination_rules}
        self._listed = frozenset(self._config.services)
        self._racing = frozenset(self._config.race_first_connect)
        self._dynamic = frozenset(self._config.dynamic_dns)
        self._plans: dict[tuple[BackendService, bool], BackendPolicy | Refusal] = {}
        self._defaults: dict[tuple[str, int], RouteTable] = {}

    @property
    def current(self) -> WaypointConfig:
        return self._config

    @property
    def destination_rules(self) -> Mapping[str, DestinationPolicy]:
        """The DestinationRules by service key (one lookup per request)."""
        return self._rules

    @property
    def listed(self) -> frozenset[str]:
        """The keys of the Services the configuration lists as bound to the waypoint (one lookup per tunnel)."""
        return self._listed

    def is_dynamic(self, service_key: str) -> bool:
        """Whether the Service is a ``DYNAMIC_DNS`` ServiceEntry host, forwarded by the name each request asks for
        (:mod:`ambit.waypoint.dynamic_hosts`)."""
        return service_key in self._dynamic

    def replace(self, config: WaypointConfig) -> None:
        self._config = config
        self._rules = {rule.service_key: rule for rule in config.destination_rules}
        self._listed = frozenset(config.services)
        self._racing = frozenset(config.race_first_connect)
        self._dynamic = frozenset(config.dynamic_dns)
        self._plans = {}
        self._defaults = {}

    def plan_backend(self, backend: BackendService, *, upgrade: bool = False) -> BackendPolicy | Refusal:
        """:func:`~ambit.waypoint.traffic_policy.plan_backend` for the current rules, remembered until they change
        (at most :data:`MAX_PLANS` at once)."""
        key = (backend, upgrade)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= MAX_PLANS:
                self._plans.clear()
            plan = self._plans[key] = plan_backend(self._rules, backend, upgrade=upgrade, racing=self._racing)
        return plan

    def find_table(self, service_key: str, port: int) -> RouteTable | None:
        """The destination's table; one without HTTP rules (or none) carries the configuration's default retries
        when they are not Istio's (the module's docstring)."""
        table = self._config.find_table(service_key, port)
        default = self._config.default_retry
        if (table is not None and table.http) or default is ISTIO_RETRY or default == ISTIO_RETRY:
            return table
        key = (service_key, port)
        found = self._defaults.get(key)
        if found is None:
            if len(self._defaults) >= MAX_PLANS:
                self._defaults.clear()
            base = table if table is not None else RouteTable(service_key, port)
            found = self._defaults[key] = replace(base, default_retry=default)
        return found

    def to_dump(self) -> dict[str, Any]:
        return {
            "waypoint": self._config.waypoint,
            "services": list(self._config.services),
            "dynamicDns": list(self._config.dynamic_dns),
            "defaultRetry": {
                "attempts": self._config.default_retry.policy.attempts,
                "perTryTimeout": self._config.default_retry.per_try_timeout,
            },
            "tables": [
                {
                    "service": table.service_key,
                    "port": table.port,
                    "hostnames": list(table.hostnames),
                    "http": [rule.route for rule in table.http],
                    "tcpBackends": len(table.tcp_backends),
                }
                for table in self._config.tables
            ],
            "policies": [
                {
                    "policy": policy.key,
                    "scope": policy.scope.name,
                    "action": policy.action.name,
                    "rules": len(policy.rules),
                    "dryRun": policy.dry_run,
                    "services": list(policy.services),
                }
                for policy in self._config.policies
            ],
            "destinationRules": [
                {
                    "service": rule.service_key,
                    "rule": rule.rule,
                    "subsets": {subset.name: len(subset.workloads) for subset in rule.subsets},
                }
                for rule in self._config.destination_rules
            ],
            "metrics": [
                {
                    "service": entry.service_key,
                    "disabled": entry.disabled,
                    "overrides": {
                        o.metric.value: {
                            "disabled": o.disabled,
                            "tags": {t.name: "REMOVE" if t.value is None else t.value.source for t in o.tags},
                        }
                        for o in entry.overrides
                    },
                }
                for entry in self._config.metrics
            ],
            "envoyFilterPatches": {
                "httpFilters": [p.source for p in self._config.envoy_patches.filters],
                "routes": [p.source for p in self._config.envoy_patches.routes],
                "http2Backends": [
                    f"{s.hostname or '*'}:{s.port or '*'}" for s in self._config.envoy_patches.upstream_h2
                ],
            },
        }


def forward_unchanged(
    table: RouteTable | None, destination: BackendService, request: RequestHead, random: float
) -> Decision:
    """The default route: the request goes to the Service it was sent to, unchanged."""
    return Forward(destination, request)

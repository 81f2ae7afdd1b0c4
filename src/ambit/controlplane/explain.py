"""Why a connection would be allowed or denied: the verdict of the node proxy's engine for one flow (``ambit policy
explain``), computed from the translated cluster, with every policy that took part.

Theory of operation: the caller translates the cluster's objects (:func:`ambit.controlplane.translate.translate_all`)
and hands over the :class:`~ambit.model.localconfig.LocalConfig`. :func:`explain` finds the source and destination
workloads, works out what the destination's node proxy would see (the peer identity when the source is captured by
the mesh, none for an uncaptured client; the pod address and the target port the service port maps to) and asks
:class:`ambit.rbac.PolicyIndex` for its decision, exactly as the proxy does. A Service destination is explained
once per endpoint, since each endpoint has its own policies.

Rules:

1. A destination that is not captured (not HBONE) is not enforced by any node proxy: its verdict is ALLOW with the
   note "not in the mesh".
2. A source that is not captured arrives in plaintext: no identity, so principal, namespace and service-account
   matches cannot hold.
3. For a policy that did not match, each rule names the first clause that failed, described by its fields.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from ambit.model.localconfig import LocalConfig
from ambit.model.policy import Clause, Match, Policy
from ambit.model.state import WorkloadState
from ambit.model.workload import TunnelProtocol, Workload
from ambit.rbac import Connection, Decision, PolicyIndex, evaluate, match_holds

__all__ = ["ExplainError", "Explanation", "FlowVerdict", "PolicyReport", "explain"]

CLUSTER_ID = "Kubernetes"


class ExplainError(ValueError):
    """The flow cannot be explained: an unknown pod or service, or a port the service does not have."""


@dataclass(frozen=True, slots=True)
class PolicyReport:
    key: str
    action: str
    dry_run: bool
    matched_rule: int | None
    why_not: tuple[str, ...]
    """For each rule, why it did not match (empty when one matched)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.key,
            "action": self.action,
            "dryRun": self.dry_run,
            "matchedRule": self.matched_rule,
            "whyNot": list(self.why_not),
        }


@dataclass(frozen=True, slots=True)
class FlowVerdict:
    """The decision for one destination endpoint."""

    destination: str
    """``ns/pod`` of the endpoint."""
    address: str
    port: int
    allowed: bool
    reason: str
    note: str
    policies: tuple[PolicyReport, ...]
    dry_run: str = ""
    missing: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "destination": self.destination,
            "address": self.address,
            "port": self.port,
            "verdict": "ALLOW" if self.allowed else "DENY",
            "reason": self.reason,
            "note": self.note,
            "dryRun": self.dry_run,
            "missingPolicies": list(self.missing),
            "policies": [p.to_json() for p in self.policies],
        }


@dataclass(frozen=True, slots=True)
class Explanation:
    source: str
    source_identity: str
    """The identity the destination sees ("" for an uncaptured, plaintext client)."""
    verdicts: tuple[FlowVerdict, ...]

    @property
    def allowed(self) -> bool:
        return all(v.allowed for v in self.verdicts)

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "sourceIdentity": self.source_identity,
            "verdict": "ALLOW" if self.allowed else "DENY",
            "destinations": [v.to_json() for v in self.verdicts],
        }


def _describe_match(match: Match) -> str:
    parts: list[str] = []
    for name in Match.__dataclass_fields__:
        values = getattr(match, name)
        if values:
            parts.append(f"{name}=[{', '.join(str(v) for v in values)}]")
    return " ".join(parts) or "(empty)"


def _describe_clause(clause: Clause) -> str:
    return " OR ".join(_describe_match(m) for m in clause.matches) or "(no match)"


def _why_not(policy: Policy, conn: Connection) -> tuple[str, ...]:
    reasons: list[str] = []
    for r, rule in enumerate(policy.rules):
        for c, clause in enumerate(rule.clauses):
            if not any(match_holds(m, conn) for m in clause.matches if not m.is_empty):
                reasons.append(f"rule {r}: clause {c} did not match: {_describe_clause(clause)}")
                break
    if not policy.rules:
        reasons.append("the policy has no rules, so it matches nothing")
    return tuple(reasons)


def _pod(state: WorkloadState, ref: str) -> Workload:
    namespace, slash, name = ref.partition("/")
    if not (slash and namespace and name):
        raise ExplainError(f"expected NAMESPACE/POD, got {ref!r}")
    workload = state.find_workload(f"{CLUSTER_ID}//Pod/{namespace}/{name}")
    if workload is None:
        raise ExplainError(f"no pod {ref} in the mesh's view (is it running, with an IP?)")
    return workload


def _targets(state: WorkloadState, ref: str, port: int, domain: str) -> list[tuple[Workload, int]]:
    """The endpoints a connection to ``ref`` (``ns/pod`` or ``ns/service``) on ``port`` reaches, with their port."""
    namespace, slash, name = ref.partition("/")
    if not (slash and namespace and name):
        raise ExplainError(f"expected NAMESPACE/POD or NAMESPACE/SERVICE, got {ref!r}")
    workload = state.find_workload(f"{CLUSTER_ID}//Pod/{namespace}/{name}")
    if workload is not None:
        return [(workload, port)]
    hostname = f"{name}.{namespace}.svc.{domain}"
    service = state.find_service_by_hostname(hostname)
    if service is None:
        raise ExplainError(f"no pod or service {ref} in the mesh's view")
    if not any(p.service_port == port for p in service.ports):
        known = ", ".join(str(p.service_port) for p in service.ports) or "none"
        raise ExplainError(f"service {ref} has no port {port} (ports: {known})")
    targets: list[tuple[Workload, int]] = []
    for endpoint in state.find_endpoints(service):
        target = state.resolve_inbound_target(endpoint, hostname, port)
        if target is not None:
            targets.append((endpoint, target))
    if not targets:
        raise ExplainError(f"service {ref} has no endpoint for port {port}")
    return targets


def _verdict(index: PolicyIndex, source: Workload, captured: bool, target: Workload, port: int) -> FlowVerdict:
    name = f"{target.namespace}/{target.name}"
    address = str(target.addresses[0]) if target.addresses else ""
    if target.tunnel_protocol is not TunnelProtocol.HBONE:
        return FlowVerdict(name, address, port, True, "", "not in the mesh: no node proxy enforces policy for it", ())
    if not source.addresses or not target.addresses:
        raise ExplainError(f"{name} or the source has no address")
    conn = Connection(source.addresses[0], source.identity if captured else None, ipaddress.ip_address(address), port)
    policies, missing = index.find_for(target)
    decision: Decision = evaluate(policies, conn, missing)
    by_key = {p.key: p for p in policies}
    reports = tuple(
        PolicyReport(
            t.key,
            t.action.name,
            t.dry_run,
            t.rule,
            () if t.rule is not None else _why_not(by_key[t.key], conn),
        )
        for t in decision.trace
    )
    note = "" if captured else "the source is not in the mesh: it arrives in plaintext, without an identity"
    if not reports:
        note = (note + "; " if note else "") + "no policy applies: allowed"
    return FlowVerdict(
        name, address, port, decision.allowed, decision.reason, note, reports, decision.dry_run, decision.missing
    )


def explain(
    config: LocalConfig, source: str, destination: str, port: int, *, domain: str = "cluster.local"
) -> Explanation:
    """The verdict for a connection from pod ``source`` (``ns/pod``) to ``destination`` on ``port``."""
    state = WorkloadState()
    state.replace_all(config.workloads, config.services)
    index = PolicyIndex(config.policies)
    client = _pod(state, source)
    captured = client.tunnel_protocol is TunnelProtocol.HBONE
    verdicts = tuple(
        _verdict(index, client, captured, target, target_port)
        for target, target_port in _targets(state, destination, port, domain)
    )
    return Explanation(source, str(client.identity) if captured else "", verdicts)

"""``ambit policy explain``'s core: the proxy's verdict for one flow, with each policy's part (pure)."""

from __future__ import annotations

import dataclasses

import pytest
from tests.unit.workload_builders import pod, web_service

from ambit.controlplane.explain import ExplainError, explain
from ambit.model.localconfig import LocalConfig
from ambit.model.policy import Action, Clause, Match, Policy, Rule, Scope, StringMatch
from ambit.model.workload import PortMapping, TunnelProtocol

WEB_KEY = "apps/web.apps.svc.cluster.local"
WEB_1 = pod("web-1", "198.18.2.7", services={WEB_KEY: (PortMapping(80, 8080),)})
WEB_2 = pod("web-2", "198.18.2.8", services={WEB_KEY: (PortMapping(80, 8080),)})
CLIENT = pod("client", "198.18.1.5", service_account="client", services={})
OUTSIDER = dataclasses.replace(
    CLIENT,
    uid="Kubernetes//Pod/apps/outsider",
    name="outsider",
    tunnel_protocol=TunnelProtocol.NONE,
)
ALLOW_CLIENT = Policy(
    "allow-client",
    "apps",
    Scope.NAMESPACE,
    Action.ALLOW,
    (Rule((Clause((Match(principals=(StringMatch.exact("cluster.local/ns/apps/sa/client"),)),)),)),),
)
DENY_8080 = Policy(
    "deny-8080", "apps", Scope.NAMESPACE, Action.DENY, (Rule((Clause((Match(destination_ports=(8080,)),)),)),)
)


def config(*policies: Policy, workloads: tuple[object, ...] = (WEB_1, WEB_2, CLIENT)) -> LocalConfig:
    return LocalConfig(workloads, (web_service(),), policies)  # type: ignore[arg-type]


def test_no_policy_allows_and_says_so() -> None:
    result = explain(config(), "apps/client", "apps/web-1", 8080)
    assert result.allowed
    assert result.verdicts[0].note == "no policy applies: allowed"
    assert result.source_identity == "spiffe://cluster.local/ns/apps/sa/client"


def test_a_service_is_explained_per_endpoint_on_the_target_port() -> None:
    result = explain(config(ALLOW_CLIENT), "apps/client", "apps/web", 80)
    assert [(v.destination, v.port, v.allowed) for v in result.verdicts] == [
        ("apps/web-1", 8080, True),
        ("apps/web-2", 8080, True),
    ]
    assert result.verdicts[0].policies[0].matched_rule == 0


def test_a_deny_names_the_policy_and_the_json_form_says_deny() -> None:
    result = explain(config(ALLOW_CLIENT, DENY_8080), "apps/client", "apps/web-1", 8080)
    assert not result.allowed
    assert result.verdicts[0].reason == "explicitly denied by: apps/deny-8080"
    document = result.to_json()
    assert document["verdict"] == "DENY"
    assert {p["policy"] for p in document["destinations"][0]["policies"]} == {"apps/allow-client", "apps/deny-8080"}


def test_an_uncaptured_client_has_no_identity_and_the_report_says_which_clause_failed() -> None:
    result = explain(config(ALLOW_CLIENT, workloads=(WEB_1, OUTSIDER)), "apps/outsider", "apps/web-1", 8080)
    verdict = result.verdicts[0]
    assert not verdict.allowed and verdict.reason == "allow policies exist, but none allowed"
    assert "plaintext" in verdict.note
    assert verdict.policies[0].why_not == (
        "rule 0: clause 0 did not match: principals=[cluster.local/ns/apps/sa/client]",
    )


def test_a_destination_outside_the_mesh_is_not_enforced() -> None:
    plain = dataclasses.replace(WEB_1, tunnel_protocol=TunnelProtocol.NONE)
    result = explain(config(DENY_8080, workloads=(plain, CLIENT)), "apps/client", "apps/web-1", 8080)
    assert result.allowed and "not in the mesh" in result.verdicts[0].note


@pytest.mark.parametrize(
    ("source", "destination", "port", "message"),
    [
        ("client", "apps/web-1", 80, "expected NAMESPACE/POD"),
        ("apps/nobody", "apps/web-1", 80, "no pod apps/nobody"),
        ("apps/client", "apps/nothing", 80, "no pod or service apps/nothing"),
        ("apps/client", "apps/web", 81, "service apps/web has no port 81"),
    ],
)
def test_unknown_flows_are_clear_errors(source: str, destination: str, port: int, message: str) -> None:
    with pytest.raises(ExplainError, match=message):
        explain(config(), source, destination, port)

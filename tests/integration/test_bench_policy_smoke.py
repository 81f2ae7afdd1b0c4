"""The policy benchmark's micro-benchmark part runs end to end and writes its table and JSON lines (no timing
gate); its policy set is what the benchmark says it is (the lab part is too slow for CI: ``make bench-policy``)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # bench/ is not installed: `python -m bench.policy` runs from the repository root
    sys.path.insert(0, str(REPO))

from bench import policy  # noqa: E402 - after the path set-up above


def test_the_micro_benchmark_writes_a_decision_row_per_policy_count(tmp_path: Path) -> None:
    profile = replace(policy.PROFILES["quick"], name="test", micro_decisions=50)

    report = policy.run(profile, tmp_path, echo=False, lab=False)

    table = (tmp_path / "policy.md").read_text()
    assert "| Scenario | Metric | Value | Unit | Reference | Ratio |" in table
    rows = [json.loads(line) for line in (tmp_path / "policy.json").read_text().splitlines()]
    assert len(rows) == len(report.measurements) == len(policy.COUNTS)
    assert [r["metric"] for r in rows] == ["0 policies", "100 policies", "10,000 policies"]
    assert all(r["unit"] == "µs" and r["value"] > 0 for r in rows)
    assert rows[0]["ratio"] is None
    assert rows[2]["reference_name"] == "0 policies" and rows[2]["ratio"] > 0
    assert "5 apply to the destination" in rows[2]["note"]
    assert {"kernel", "cpus", "python"} <= rows[0]["env"].keys()


def test_the_sets_are_prefixes_with_unique_names_and_five_policies_on_the_destination() -> None:
    small, large = policy.policy_objects(100), policy.policy_objects(10_000)
    assert large[:100] == small
    keys = [f"{o['metadata']['namespace']}/{o['metadata']['name']}" for o in large]
    assert len(set(keys)) == 10_000
    assert len({o["metadata"]["namespace"] for o in large}) == policy.SPREAD_NAMESPACES + 1
    assert policy.policy_objects(0) == []
    assert [policy.decisions(n).applying for n in (0, 3, 100, 10_000)] == [0, 3, 5, 5]


def test_every_set_lets_the_client_in_and_the_bench_deny_refuses_it() -> None:
    """The benchmark times allowed connections, and its DENY must really match the client it is timed against."""
    from ambit.controlplane.translate.policies import translate_authorization_policy

    setup = policy.decisions(100)
    assert setup.index.check(setup.workload, setup.connection).allowed
    deny = translate_authorization_policy(policy.deny_policy()).policy
    assert deny is not None
    setup.index.put(deny)
    decision = setup.index.check(setup.workload, setup.connection)
    assert not decision.allowed
    assert decision.denied_by == f"{policy.DEST_NAMESPACE}/{policy.DENY_NAME}"


def test_a_negative_count_is_refused() -> None:
    with pytest.raises(ValueError, match="not negative"):
        policy.policy_objects(-1)

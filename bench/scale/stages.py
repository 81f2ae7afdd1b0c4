"""``python -m bench.scale.stages [--pods N] [--full] [--profile]``: the control plane's per-change stages, in process.

Builds the scale harness's cluster (:mod:`bench.scale.cluster`: ``pods`` pods, a Service per ten pods with its
EndpointSlice, a policy per twenty pods) as plain objects, translates it once, then makes ``--changes`` readiness
flips (each pod's EndpointSlice written with it, as the harness's churn does) and times, per change, the stages a
hand-over runs: ``translate_all``, the Address encoding, the address table's update and the authorization table's
(encoding and update). By default each translation is told what changed, the address table is patched and the
authorization table is left alone when the translation reused its policies (what the control plane does);
``--full`` translates and encodes without the changes (what it did before). CPU time per stage
(``time.process_time``: a loaded machine inflates it less than wall time), median over the changes. No API server,
no clients, no root.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import pstats
import statistics
import time
from typing import Any

from ambit.controlplane.addresses import (
    AddressCache,
    AuthorizationCache,
    address_changes,
    addresses,
    authorization_changes,
    authorizations,
)
from ambit.controlplane.translate import Changes, PolicyMemo, Translation, TranslationMemo, translate_all
from ambit.model.localconfig import LocalConfig
from ambit.xds.table import AddressTable, AuthorizationTable
from bench.scale.cluster import (
    POD_RANGE,
    ClusterShape,
    endpoint_slice_manifest,
    initial_members,
    namespace_manifest,
    pod_manifest,
    pod_status,
    policy_manifest,
    service_manifest,
)


def _stamped(obj: dict[str, Any], uid: str, version: int) -> dict[str, Any]:
    obj["metadata"]["uid"] = uid
    obj["metadata"]["resourceVersion"] = str(version)
    return obj


class Stages:
    """The cluster's objects, the control plane's memo and address table, and the stages' timings."""

    def __init__(self, pods: int, *, by_changes: bool) -> None:
        self.shape = shape = ClusterShape(
            namespaces=max(1, pods // 1000), services=max(1, pods // 10), pods=pods, policies=pods // 20, nodes=100
        )
        self.by_changes = by_changes
        self.version = 1
        self.namespaces = [
            _stamped(namespace_manifest(shape.namespace(i)), f"ns-{i}", 1) for i in range(shape.namespaces)
        ]
        self.services = [_stamped(service_manifest(shape, j), f"svc-{j}", 1) for j in range(shape.services)]
        self.pods = {i: _stamped(pod_manifest(shape, i), f"pod-{i}", 1) for i in range(pods)}
        self.members = initial_members(shape)
        self.slices = {
            j: _stamped(endpoint_slice_manifest(shape, j, self.members[j]), f"eps-{j}", 1)
            for j in range(shape.services)
        }
        self.policies = [_stamped(policy_manifest(shape, k), f"ap-{k}", 1) for k in range(shape.policies)]
        self.memo = TranslationMemo()
        self.policy_memo: PolicyMemo = {}
        self.cache, self.table = AddressCache(), AddressTable()
        self.policy_cache, self.policy_table = AuthorizationCache(), AuthorizationTable()
        self.applied: LocalConfig | None = None

    def flip(self, k: int) -> Changes:
        """Pod ``k`` from the end becomes not ready, and its Service's slice says so."""
        self.version += 1
        i = self.shape.pods - 1 - k
        pod = copy.deepcopy(self.pods[i])
        pod["metadata"]["resourceVersion"] = str(self.version)
        pod["status"] = pod_status(str(POD_RANGE.network_address + 1 + i), ready=False)
        self.pods[i] = pod
        j = i % self.shape.services
        self.members[j][i] = False
        eps = _stamped(endpoint_slice_manifest(self.shape, j, self.members[j]), f"eps-{j}", self.version)
        self.slices[j] = eps
        key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        return {
            ("pods", key): pod,
            ("endpointslices", f"{eps['metadata']['namespace']}/{eps['metadata']['name']}"): eps,
        }

    def run(self, changed: Changes | None) -> tuple[float, float, float, float]:
        """(translate, encode, address table, authorization table) CPU seconds of one hand-over."""
        t0 = time.process_time()
        translation: Translation = translate_all(
            list(self.pods.values()),
            self.services,
            list(self.slices.values()),
            self.namespaces,
            authorization_policies=self.policies,
            policy_memo=self.policy_memo,
            translation_memo=self.memo,
            changed=changed if self.by_changes else None,
        )
        t1 = time.process_time()
        config, changes, previous = translation.config, translation.workload_changes, self.applied
        if self.by_changes and changes is not None and previous is not None and changes.since is previous.workloads:
            upserts, removed = address_changes(previous, config, self.cache, changes.uids)
            t2 = time.process_time()
            self.table.patch(upserts, removed)
        else:
            encoded = addresses(config, self.cache)
            t2 = time.process_time()
            self.table.replace(encoded)
        t3 = time.process_time()
        if self.by_changes:
            policies = authorization_changes(previous, config, self.policy_cache)
        else:
            policies = authorizations(config, self.policy_cache)
        if policies is not None:
            self.policy_table.replace(policies)
        self.applied = config
        return t1 - t0, t2 - t1, t3 - t2, time.process_time() - t3


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scale.stages", description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--changes", type=int, default=20)
    parser.add_argument("--full", action="store_true", help="translate and encode without the changes")
    parser.add_argument("--profile", action="store_true", help="cProfile the changes; print the top functions")
    args = parser.parse_args(argv)
    stages = Stages(args.pods, by_changes=not args.full)
    stages.run(None)
    stages.run({})
    profiler = cProfile.Profile() if args.profile else None
    timings = []
    for k in range(args.changes):
        changed = stages.flip(k)
        if profiler is not None:
            profiler.enable()
        timings.append(stages.run(changed))
        if profiler is not None:
            profiler.disable()
    mode = "full" if args.full else "by changes"
    print(f"{args.pods:,} pods, {stages.shape.services:,} Services, {stages.shape.policies:,} policies ({mode}):")
    for at, name in enumerate(("translate_all", "addresses", "address table", "authorization table")):
        print(f"  {name}: {statistics.median(t[at] for t in timings) * 1000:.1f} ms CPU per change (median)")
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)


if __name__ == "__main__":
    main()

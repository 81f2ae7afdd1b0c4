"""Profiles and modes of the data-path benchmark.

A mode is a way for the client pod's traffic to reach the server pod's application: straight (``direct``),
through a C mutual-TLS tunnel pair (``stunnel``, ``haproxy-tls``), or through the node proxies (``ambit``: both
pods enrolled, HBONE; ``ambit-passthrough``: only the client enrolled, so the client's node proxy relays plain
TCP). A profile says how long each measurement runs, how often it is repeated, and which optional scenarios run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

DIRECT, STUNNEL, HAPROXY, AMBIT, PASSTHROUGH = "direct", "stunnel", "haproxy-tls", "ambit", "ambit-passthrough"
MODES = (DIRECT, STUNNEL, HAPROXY, AMBIT, PASSTHROUGH)
PROXY_MODES = (STUNNEL, HAPROXY, AMBIT, PASSTHROUGH)
"""Modes with a proxy whose CPU and memory can be read (``direct`` has none)."""


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    repeats: int
    """How many times each (scenario, mode) is measured, interleaved across modes."""
    bulk_seconds: float
    rr_seconds: float
    rate_seconds: float
    idle_counts: tuple[int, ...]
    """Held idle connections per idle scenario."""
    streams: tuple[int, ...] = (1, 4)
    rr_sizes: tuple[int, ...] = (14, 1024)
    """Request/response payload bytes; 14 is sockperf's smallest message (its header), the nearest to 1 byte."""
    unpinned_sizes: tuple[int, ...] = (14,)
    """Payload bytes of the closed-loop latency scenario measured again with every process left to the scheduler
    (no vCPU per node): the issue's targets hold "both pinned and unpinned"; () leaves it out."""
    fixed_rate: int = 0
    """Messages per second for the open-loop latency scenario; 0 leaves it out."""
    same_node: bool = False
    """Also measure bulk and latency with both pods on node 1."""
    rate_concurrency: int = 8
    cold: bool = True
    """Also measure new connections with cold handshakes (node proxies restarted without pooling, then back)."""
    cold_seconds: float = 0.0
    """Seconds per cold-handshake connection-rate measurement (0: ``rate_seconds``)."""
    idle_repeats: int = 0
    """Repeats of the idle scenarios (0: ``repeats``); holding 10k connections is slow to set up."""
    fresh_idle: bool = True
    """Restart each mode's proxies before its idle scenario (a process that held connections before keeps the memory
    it freed); False measures the processes as the earlier scenarios left them (a smoke run's figures)."""
    flow_log: bool = True
    """Also measure the pooled connection rate with the node proxies' flow log off (two restarts of them)."""


PROFILES = {
    "smoke": Profile(
        "smoke",
        repeats=1,
        bulk_seconds=1,
        rr_seconds=1,
        rate_seconds=1,
        idle_counts=(20,),
        streams=(1,),
        rr_sizes=(14,),
        # What a smoke run need not repeat: the same measurements unpinned (~20 s), or with the flow log off, or after
        # restarting each mode's proxies for the idle scenario (the restarts of the node proxies, about 10 s each,
        # are still exercised by the cold-handshake scenario).
        unpinned_sizes=(),
        fresh_idle=False,
        flow_log=False,
    ),
    "short": Profile(
        "short", repeats=3, bulk_seconds=2, rr_seconds=1, rate_seconds=1.5, idle_counts=(200,), cold_seconds=1
    ),
    "full": Profile(
        "full",
        repeats=3,
        bulk_seconds=8,
        rr_seconds=4,
        rate_seconds=4,
        idle_counts=(1000, 10000),
        unpinned_sizes=(14, 1024),
        fixed_rate=1000,
        same_node=True,
        idle_repeats=2,
    ),
}


def profile_named(name: str, repeats: int | None = None) -> Profile:
    profile = PROFILES[name]
    return replace(profile, repeats=repeats) if repeats else profile

"""Which waypoint of a Service takes one new connection or request (spec §4.1 ``Service.weighted_waypoints``).

Theory of operation: a Service with a canary waypoint carries a weighted set (the primary and the canary, each with
its share); :func:`choose_waypoint` picks one for a draw in [0, 1) that the caller owns (the I/O shells pass
``random.random()``, tests a fixed value), so the choice stays pure and table-testable. Node proxies choose per
connection, ingress gateways per request.

Rules:

1. A Service without a weighted set uses its ``waypoint`` (None: none).
2. Candidates are the entries with a weight above 0 whose waypoint ``usable`` accepts (the caller knows an instance
   to send to); a weight of 0 is never chosen.
3. No candidate (an unknown or unready canary, every weight 0): the primary ``waypoint`` takes everything; it is
   not filtered by ``usable``, so a missing primary is refused by the caller as before, never bypassed.
4. Otherwise the draw is scaled by the candidates' total weight and the first entry whose running total exceeds it
   wins: over many draws each candidate gets ``weight / total`` of them.
"""

from __future__ import annotations

from collections.abc import Callable

from ambit.model.workload import GatewayAddress, Service

__all__ = ["choose_waypoint"]


def choose_waypoint(service: Service, usable: Callable[[GatewayAddress], bool], draw: float) -> GatewayAddress | None:
    """The waypoint for one connection or request to ``service`` (the module's rules); ``draw`` in [0, 1)."""
    if not service.weighted_waypoints:
        return service.waypoint
    candidates = [w for w in service.weighted_waypoints if w.weight > 0 and usable(w.destination)]
    if not candidates:
        return service.waypoint
    point = min(max(draw, 0.0), 1.0) * sum(w.weight for w in candidates)
    running = 0
    for candidate in candidates:
        running += candidate.weight
        if point < running:
            return candidate.destination
    return candidates[-1].destination  # a draw of exactly 1.0

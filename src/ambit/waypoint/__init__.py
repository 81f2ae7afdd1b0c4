"""The waypoint: Ambit's L7 proxy (spec §1.4), serving waypoints and ingress gateways with one engine.

Layout: :mod:`ambit.waypoint.decisions` is the seam between the pure routing engine (what to do with one request,
given the destination's :class:`ambit.model.routes.RouteTable`) and the asyncio shell that terminates HBONE, parses
HTTP and opens upstream tunnels. The pure engine: :mod:`~ambit.waypoint.routing` (which rule, which backend, what
the filters do, with :mod:`~ambit.waypoint.filters`), :mod:`~ambit.waypoint.retries` (one request's tries and
timeouts as a state machine) and :mod:`~ambit.waypoint.sniff` (which protocol a tunnelled stream speaks).
"""

"""The waypoint: Ambit's L7 proxy (spec §1.4), serving waypoints and ingress gateways with one engine.

Layout: :mod:`ambit.waypoint.decisions` is the seam between the pure routing engine (what to do with one request,
given the destination's :class:`ambit.model.routes.RouteTable`) and the asyncio shell that terminates HBONE, parses
HTTP and opens upstream tunnels.
"""

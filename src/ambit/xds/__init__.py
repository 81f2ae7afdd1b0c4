"""The workload API over delta xDS (spec §4.2): sans-IO sessions, proto conversion, and thin asyncio shells.

Modules:

- ``convert``: model :class:`~ambit.model.workload.Workload` / :class:`~ambit.model.workload.Service` ↔ proto
  ``istio.workload.Address``, resource names and ``network/IP`` aliases; bad input raises
  :class:`~ambit.xds.errors.XdsConversionError` naming the resource and the field.
- ``session``: the server's pure per-client delta session (subscriptions, what the client holds, nonces, ACK/NACK,
  on-demand lookups answered as istiod's: a Service with all its endpoints).
- ``resource_set``: :class:`~ambit.xds.resource_set.XdsResource` and the immutable
  :class:`~ambit.xds.resource_set.ResourceSet` snapshots the sessions compare against; ``held_versions``: what one
  client holds of one type, on a shared base set.
- ``client_session``: the client's pure side (initial requests, applying a response, ACK or NACK).
- ``table``: :class:`~ambit.xds.table.AddressTable` and :class:`~ambit.xds.table.AuthorizationTable`, the
  server's current resources of each type with change notifications.
- ``service``: the ``AggregatedDiscoveryService/DeltaAggregatedResources`` servicer (a reader and a pusher per
  stream); ``server``: the TLS grpc.aio server carrying it. Around them: ``callers`` (authentication's result and
  per-caller views), ``opening_gate`` (opening requests read at once, streams turned away, the trim after a burst),
  ``push_changes`` (a stream's pending changes and their debounce), ``service_metrics`` (observer and counters),
  ``syncz_answers`` (the sync status answered to the debug type).
- ``sync``: the server's per-stream record of what each client was last sent and last answered per type, and the
  sync status document (istiod's ``/debug/syncz``) served as the debug type ``istio.io/debug/syncz``.
- ``sync_client``: reading one control plane's sync status (``ambit proxy-status``).
- ``client``: the node proxy's xDS client (TLS, bearer token, reconnect with back-off keeping its state).
- ``grpc_channel``: the gRPC client channel the xDS and CA clients call through, on the HBONE HTTP/2 engine
  (:mod:`ambit.hbone.grpc_calls` is its sans-IO half); no grpcio in the node proxy. ``grpc_connection``: one
  HTTP/2 connection of that channel, its reader, keepalive timer and calls.
- ``keepalive``: HTTP/2 keepalive of the control-plane connection (istiod's 15 s ping tolerance, 30 s pings with a
  10 s timeout), shared by the xDS server and client and the CA's server and client.
- ``errors``: the package's error tree.
"""

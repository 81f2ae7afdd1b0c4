"""The node proxy's data path (ztunnel's ``proxy``): sockets made inside pod namespaces, byte streams, relays.

Layers, bottom up:

- :mod:`ambit.proxy.sockets`: the socket factory seam. Every socket the proxy opens for a pod is created inside
  that pod's network namespace (a per-pod thread that ``setns()``'d there) and carries ``SO_MARK`` 0x539, so the
  pod's redirection rules let it through; :func:`~ambit.proxy.sockets.connect` opens upstream connections,
  optionally from a spoofed source IP (inbound delivery keeps the client's address).
- :mod:`ambit.proxy.streams`: :class:`~ambit.proxy.streams.ByteStream`, one end of a relay (a TCP socket, or an
  HBONE tunnel), and :class:`~ambit.proxy.streams.SocketStream` over a TCP socket.
- :mod:`ambit.proxy.relay`: :func:`~ambit.proxy.relay.relay` copies two streams into each other until both
  directions are done, keeping half-closes and resets.

Errors are in :mod:`ambit.proxy.errors`.
"""

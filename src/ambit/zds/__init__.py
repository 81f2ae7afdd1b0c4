"""ZDS (spec §3): the node agent hands pod network namespaces to the node proxy over a SEQPACKET Unix socket.

Modules: ``protocol`` (framing and message types, sans-IO), ``events`` and ``commands`` (what sessions return),
``agent`` (server side: ``AgentSession``, ``AgentHub``), ``proxy`` (client side: ``ProxySession``), ``errors``,
and ``transport`` (the asyncio shell; the only module here that touches a socket).
"""

ZDS_SOCKET = "ztunnel.sock"
"""The socket's file name in the node proxy's run directory (``/var/run/ztunnel`` in a pod), as ztunnel names it."""

"""POST the plugin's add event to the node agent: HTTP/1.1 over the agent's UNIX socket.

The agent listens on ``agent_socket`` (default ``/var/run/ambit-cni/pluginevent.sock``, Istio's is
``/var/run/istio-cni/pluginevent.sock``) and serves ``POST /cmdadd``. A 200 means the pod is enrolled (rules
in its netns, node proxy told); anything else fails the ADD, and the runtime retries the sandbox. One attempt
only: retrying is the runtime's job, and the agent's work is not idempotent-cheap.
"""

from __future__ import annotations

import http.client
import json
import socket

from ambit.cni.errors import AgentError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

AGENT_TIMEOUT = 30.0
"""The agent enters the netns, writes rules and waits for the node proxy's ack, so allow it some time."""


class UnixHTTPConnection(http.client.HTTPConnection):
    """An HTTPConnection whose transport is a UNIX stream socket; the Host header says ``localhost``."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.socket_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def post_add_event(socket_path: str, event: dict[str, Any], *, timeout: float = AGENT_TIMEOUT) -> None:
    """Send the event; return on 200, raise :class:`AgentError` otherwise."""
    conn = UnixHTTPConnection(socket_path, timeout)
    try:
        conn.request("POST", "/cmdadd", body=json.dumps(event), headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        body = response.read(4096)
    except (OSError, http.client.HTTPException) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e) or type(e).__name__
        raise AgentError(f"ambit-cni cmdAdd failed to contact the node agent at {socket_path}", reason) from e
    finally:
        conn.close()
    if response.status != 200:
        text = body.decode("utf-8", "replace").strip()
        raise AgentError(f"ambit-cni cmdAdd: the node agent refused the pod (HTTP {response.status})", text)

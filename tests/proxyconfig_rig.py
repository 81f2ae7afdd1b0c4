"""A real node proxy with known state, for ``ambit proxy-config`` tests: its dumps are recorded, never hand-written.

:func:`running_node_proxy` starts :class:`~ambit.inpod.daemon.NodeProxy` (local config file, local CA, kernel-picked
loopback ports), waits until the certificates of its node's workloads are issued, adds one local pod with one live
inbound and one outbound connection, and yields it. :func:`record_dump` gives its ``/config_dump`` as the admin
endpoint serialises it. The state, in the node proxy's local-config form:

- namespace ``apps``: ``client`` (node-1, HBONE, 198.18.16.5), ``server`` (node-2, HBONE, 198.18.17.7, waypoint
  ``waypoint`` by hostname) and ``legacy`` (node-1, TCP, unhealthy, 198.18.16.9); Services ``echo`` (VIP
  198.19.0.20, endpoints ``server`` and ``legacy``) and ``waypoint`` (VIP 198.19.0.30, no endpoints);
- namespace ``istio-system``: ``waypoint-0`` (node-2, 198.18.17.3) behind ``waypoint``'s VIP, named by address;
- policies ``apps/allow-client`` (ALLOW, NAMESPACE) and ``istio-system/deny-all`` (DENY, GLOBAL).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from ambit.inpod.daemon import NodeProxy
from ambit.inpod.settings import NodeProxySettings
from ambit.proxy.context import LocalPod
from ambit.proxy.sockets import HostSocketFactory
from ambit.zds.protocol import WorkloadInfo

LOCAL_CONFIG = """\
workloads:
- uid: Kubernetes//Pod/apps/client
  name: client
  namespace: apps
  workloadIps: [198.18.16.5]
  protocol: HBONE
  serviceAccount: client
  node: node-1
- uid: Kubernetes//Pod/apps/server
  name: server
  namespace: apps
  workloadIps: [198.18.17.7]
  protocol: HBONE
  serviceAccount: server
  node: node-2
  services: {apps/echo.apps.svc.cluster.local: {80: 8080}}
  waypoint: {hostname: waypoint.apps.svc.cluster.local, namespace: apps}
- uid: Kubernetes//Pod/apps/legacy
  name: legacy
  namespace: apps
  workloadIps: [198.18.16.9]
  protocol: TCP
  node: node-1
  status: Unhealthy
  services: {apps/echo.apps.svc.cluster.local: {80: 8080}}
  waypoint: {address: /198.19.0.30}
- uid: Kubernetes//Pod/istio-system/waypoint-0
  name: waypoint-0
  namespace: istio-system
  workloadIps: [198.18.17.3]
  protocol: HBONE
  node: node-2
services:
- name: echo
  namespace: apps
  hostname: echo.apps.svc.cluster.local
  vips: [/198.19.0.20]
  ports: {80: 8080}
  waypoint: {address: /198.19.0.30}
- name: waypoint
  namespace: apps
  hostname: waypoint.apps.svc.cluster.local
  vips: [/198.19.0.30]
  ports: {15008: 15008}
policies:
- name: deny-all
  namespace: istio-system
  scope: GLOBAL
  action: DENY
- name: allow-client
  namespace: apps
  scope: NAMESPACE
  action: ALLOW
  rules: [{clauses: [{matches: [{principals: [cluster.local/ns/apps/sa/client]}]}]}]
"""

POD_UID = "0f6a8c1e-0000-4000-8000-client"
"""The ZDS uid of the one local pod (``client``)."""


def loopback_node_proxy_settings(tmp_path: Path, local_config: str) -> NodeProxySettings:
    """A node proxy of node-1 under ``tmp_path``: ``local_config`` as its config file, a local CA, its ZDS socket
    (and so its admin token, beside it) in ``run/``, and its admin, stats and readiness ports picked by the kernel."""
    (tmp_path / "run").mkdir()
    config = tmp_path / "workloads.yaml"
    config.write_text(local_config)
    return NodeProxySettings(
        node="node-1",
        zds_socket=tmp_path / "run" / "zds.sock",
        config_file=config,
        local_ca_dir=tmp_path / "ca",
        admin_port=0,
        stats_port=0,
        readiness_port=0,
    )


@asynccontextmanager
async def running_node_proxy(tmp_path: Path) -> AsyncIterator[NodeProxy]:
    settings = loopback_node_proxy_settings(tmp_path, LOCAL_CONFIG)
    proxy = NodeProxy(settings)
    await proxy.start()
    try:
        pod = LocalPod(POD_UID, WorkloadInfo("client", "apps", "client"), HostSocketFactory(mark=None), "cluster.local")
        proxy.context.add_pod(pod)
        await wait_for_certificates(proxy, 2)
        with (
            proxy.context.register("inbound", "198.18.17.7:40112", "198.18.16.5:15008", pod),
            proxy.context.register("outbound", "198.18.16.5:51000", "198.19.0.20:80", pod),
        ):
            yield proxy
    finally:
        await proxy.aclose()


async def wait_for_certificates(proxy: NodeProxy, count: int) -> None:
    """Until ``count`` certificates are Available (the local CA signs in a worker thread)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        states = [entry["state"] for entry in proxy.certs.snapshot()]
        if states.count("Available") >= count:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"certificates not issued: {proxy.certs.snapshot()}")


def record_dump(proxy: NodeProxy) -> dict[str, Any]:
    """The proxy's ``/config_dump`` as its admin endpoint serialises it (``json.dumps(..., default=str)``)."""
    dump: dict[str, Any] = json.loads(json.dumps(proxy.config_dump(), default=str))
    return dump


__all__ = ["LOCAL_CONFIG", "POD_UID", "record_dump", "running_node_proxy", "wait_for_certificates"]

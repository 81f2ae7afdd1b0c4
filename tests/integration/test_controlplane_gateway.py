"""Waypoint deployment through the real control plane: a Gateway of class ``istio-waypoint`` gets its
ServiceAccount, Deployment and Service, owned by it; its status says Programmed once the Deployment has a ready
replica; deleting it deletes them; objects it does not own and hostile Gateways get a clear status.

A real API server (subprocess, the CRDs installed; no lab controllers, so the Deployment's status is written by
the test as the Deployment controller would) and the real control plane (no webhook).
"""

from __future__ import annotations

import contextlib
import secrets
import time
from typing import Any

import pytest
from tests.integration.controlplane_rig import eventually
from tests.integration.gateway_rig import condition, get, waypoint

from ambit.controlplane.gateway import GatewayController, GatewayControllerSettings, WaypointTemplateSettings
from ambit.controlplane.process import ControlPlane
from ambit.k8s import KubeClient, KubeNotFoundError, kinds

Obj = dict[str, Any]
OWNED = (kinds.SERVICE_ACCOUNTS, kinds.DEPLOYMENTS, kinds.SERVICES)


@pytest.fixture
def plane_options() -> dict[str, Any]:
    return {"waypoint_xds_address": "198.18.0.1:15012", "waypoint_image_pull_policy": "Never"}


async def programmed(kube: KubeClient, name: str, namespace: str, status: str, reason: str) -> Obj | None:
    gateway = await get(kube, kinds.GATEWAYS, name, namespace)
    found = condition(gateway, "Programmed")
    return gateway if (found.get("status"), found.get("reason")) == (status, reason) else None


async def test_a_waypoint_gateway_gets_its_objects_owned_by_it_and_a_status(
    kube: KubeClient, plane: ControlPlane, namespace: str
) -> None:
    gateway = await kube.create(kinds.GATEWAYS, waypoint("waypoint", namespace, **{"istio.io/waypoint-for": "all"}))
    uid = gateway["metadata"]["uid"]
    for kind in OWNED:
        obj = await eventually(lambda kind=kind: get(kube, kind, "waypoint", namespace))
        (owner,) = obj["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == ("Gateway", "waypoint", uid, True)
        labels = obj["metadata"]["labels"]
        assert labels["gateway.istio.io/managed"] == "istio.io-mesh-controller"
        assert labels["gateway.networking.k8s.io/gateway-name"] == "waypoint"
    service = await kube.get(kinds.SERVICES, "waypoint", namespace)
    assert {(p["name"], p["port"]) for p in service["spec"]["ports"]} == {("status-port", 15021), ("mesh", 15008)}
    gateway = await eventually(lambda: programmed(kube, "waypoint", namespace, "False", "AddressNotAssigned"))
    assert condition(gateway, "Accepted")["status"] == "True"
    assert gateway["metadata"]["labels"]["istio.io/waypoint-for"] == "all"
    assert "addresses" not in gateway["status"]
    gateway_class = await eventually(
        lambda: get(kube, kinds.GATEWAY_CLASSES, "istio-waypoint", None),
    )
    assert gateway_class["spec"]["controllerName"] == "istio.io/mesh-controller"
    accepted = await eventually(
        lambda: _class_accepted(kube),
    )
    assert accepted["message"] == "Handled by Istio controller"


async def _class_accepted(kube: KubeClient) -> Obj:
    return condition(await get(kube, kinds.GATEWAY_CLASSES, "istio-waypoint", None), "Accepted")


async def test_the_gateway_is_programmed_once_its_deployment_has_a_ready_replica_and_then_writes_stop(
    kube: KubeClient, plane: ControlPlane, namespace: str
) -> None:
    await kube.create(kinds.GATEWAYS, waypoint("waypoint", namespace))
    await eventually(lambda: get(kube, kinds.DEPLOYMENTS, "waypoint", namespace))
    await kube.patch_status(kinds.DEPLOYMENTS, "waypoint", {"status": {"replicas": 1, "readyReplicas": 1}}, namespace)
    gateway = await eventually(lambda: programmed(kube, "waypoint", namespace, "True", "Programmed"))
    host = f"waypoint.{namespace}.svc.cluster.local"
    service = await get(kube, kinds.SERVICES, "waypoint", namespace)
    ip = service["spec"]["clusterIP"]
    # as istiod for the waypoint class: the Service's cluster IP first (what `kubectl get gateway` shows), then
    # its hostname
    assert gateway["status"]["addresses"] == [{"type": "IPAddress", "value": ip}, {"type": "Hostname", "value": host}]
    assert condition(gateway, "Programmed")["message"] == f"Resource programmed, assigned to service(s) {host}:15008"
    (listener,) = gateway["status"]["listeners"]
    assert listener["name"] == "mesh" and listener["attachedRoutes"] == 0
    assert plane.gateways is not None
    controller = plane.gateways

    async def quiet() -> bool:  # once the caches have caught up, a pass writes nothing
        before = controller.writes
        await controller.reconcile_once()
        return controller.writes == before

    await eventually(quiet)
    assert await quiet()


async def test_deleting_the_gateway_deletes_its_objects(kube: KubeClient, plane: ControlPlane, namespace: str) -> None:
    await kube.create(kinds.GATEWAYS, waypoint("doomed", namespace))
    for kind in OWNED:
        await eventually(lambda kind=kind: get(kube, kind, "doomed", namespace))
    await kube.delete(kinds.GATEWAYS, "doomed", namespace)
    for kind in OWNED:

        async def gone(kind: kinds.ResourceKind = kind) -> bool:
            return await get(kube, kind, "doomed", namespace) is None

        await eventually(gone)


async def test_a_user_s_replica_count_survives_a_template_update(
    kube: KubeClient, plane: ControlPlane, namespace: str
) -> None:
    await kube.create(kinds.GATEWAYS, waypoint("scaled", namespace))
    await eventually(lambda: get(kube, kinds.DEPLOYMENTS, "scaled", namespace))
    await kube.patch(kinds.DEPLOYMENTS, "scaled", {"spec": {"replicas": 3}}, namespace)
    await kube.patch(kinds.GATEWAYS, "scaled", {"metadata": {"labels": {"team": "payments"}}}, namespace)

    async def relabelled() -> Obj | None:
        deployment = await get(kube, kinds.DEPLOYMENTS, "scaled", namespace)
        return deployment if deployment and deployment["metadata"]["labels"].get("team") == "payments" else None

    deployment = await eventually(relabelled)
    assert deployment["spec"]["replicas"] == 3


async def test_an_existing_deployment_of_that_name_is_not_taken_over(
    kube: KubeClient, plane: ControlPlane, namespace: str
) -> None:
    theirs = {
        "metadata": {"name": "taken", "namespace": namespace, "labels": {"app": "theirs"}},
        "spec": {
            "selector": {"matchLabels": {"app": "theirs"}},
            "template": {
                "metadata": {"labels": {"app": "theirs"}},
                "spec": {"containers": [{"name": "main", "image": "theirs", "command": ["sleep", "1000"]}]},
            },
        },
    }
    before = await kube.create(kinds.DEPLOYMENTS, theirs)
    await kube.create(kinds.GATEWAYS, waypoint("taken", namespace))
    gateway = await eventually(lambda: programmed(kube, "taken", namespace, "False", "Invalid"))
    assert (
        "Deployment 'taken' already exists and is not managed by the mesh controller"
        in (condition(gateway, "Programmed")["message"])
    )
    after = await kube.get(kinds.DEPLOYMENTS, "taken", namespace)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert after["spec"]["template"]["spec"]["containers"][0]["image"] == "theirs"


async def test_hostile_gateways_get_a_clear_status_and_do_not_stop_the_others(
    kube: KubeClient, plane: ControlPlane, namespace: str
) -> None:
    dotted = waypoint("a.b", namespace)
    bad_labels = waypoint("badlabels", namespace)
    bad_labels["spec"]["infrastructure"] = {"labels": {"bad key!": "x" * 100}}
    nonsense = waypoint("nonsense", namespace)
    nonsense["spec"]["listeners"] = [{"name": "mesh", "port": "15008", "protocol": 7}]
    for gateway in (dotted, bad_labels, nonsense):
        await kube.create(kinds.GATEWAYS, gateway)
    await kube.create(kinds.GATEWAYS, waypoint("fine", namespace))
    gateway = await eventually(lambda: programmed(kube, "a.b", namespace, "False", "Invalid"))
    assert "DNS-1035 label" in condition(gateway, "Programmed")["message"]
    gateway = await eventually(lambda: programmed(kube, "badlabels", namespace, "False", "Invalid"))
    message = condition(gateway, "Programmed")["message"]
    assert message.startswith("the API server refused the ServiceAccount 'badlabels'"), message
    assert "\n" not in message and "Traceback" not in message
    gateway = await eventually(lambda: programmed(kube, "nonsense", namespace, "False", "AddressNotAssigned"))
    assert condition(gateway, "Accepted")["reason"] == "ListenersNotValid"
    await eventually(lambda: programmed(kube, "fine", namespace, "False", "AddressNotAssigned"))
    assert await get(kube, kinds.DEPLOYMENTS, "fine", namespace) is not None


# -- ingress gateways (class istio) ---------------------------------------------------------------------------
def ingress(name: str, namespace: str, *listeners: Obj) -> Obj:
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"gatewayClassName": "istio", "listeners": list(listeners)},
    }


def tls_secret(name: str, namespace: str) -> Obj:
    import base64
    import time

    from ambit.tls.certs import issue_server_cert, new_ca

    now = time.time()
    pair = issue_server_cert(
        new_ca("ingress test CA", now=now), common_name="a.example", dns_names=["a.example"], ip_addresses=[], now=now
    )
    return {
        "metadata": {"name": name, "namespace": namespace},
        "type": "kubernetes.io/tls",
        "data": {
            "tls.crt": base64.b64encode(pair.cert_pem).decode(),
            "tls.key": base64.b64encode(pair.key_pem).decode(),
        },
    }


def listener_condition(gateway: Obj | None, listener: str, type_: str) -> Obj:
    for item in ((gateway or {}).get("status") or {}).get("listeners") or ():
        if item.get("name") == listener:
            return next((dict(c) for c in item.get("conditions") or () if c.get("type") == type_), {})
    return {}


async def test_the_istio_gateway_class_is_installed_and_accepted(kube: KubeClient, plane: ControlPlane) -> None:
    async def accepted() -> Obj:
        found = condition(await get(kube, kinds.GATEWAY_CLASSES, "istio", None), "Accepted")
        return found if found.get("status") == "True" else {}

    await eventually(accepted)
    gateway_class = await kube.get(kinds.GATEWAY_CLASSES, "istio")
    assert gateway_class["spec"]["controllerName"] == "istio.io/gateway-controller"


async def test_a_deleted_default_gateway_class_is_created_again_and_accepted(
    kube: KubeClient, plane: ControlPlane
) -> None:
    """istiod's class controller re-creates its classes when they are deleted (upstream TestWaypointStatus
    expects the waypoint class Accepted whatever happened to it)."""
    await eventually(lambda: _class_accepted(kube))
    old = await kube.get(kinds.GATEWAY_CLASSES, "istio-waypoint")
    await kube.delete(kinds.GATEWAY_CLASSES, "istio-waypoint")

    async def recreated() -> Obj | None:
        found = await get(kube, kinds.GATEWAY_CLASSES, "istio-waypoint", None)
        if found is None or found["metadata"]["uid"] == old["metadata"]["uid"]:
            return None
        return found if condition(found, "Accepted").get("status") == "True" else None

    gateway_class = await eventually(recreated)
    assert gateway_class["spec"]["controllerName"] == "istio.io/mesh-controller"


async def test_an_ingress_gateway_gets_a_load_balancer_and_is_programmed_with_its_address(
    kube: KubeClient, plane: ControlPlane, namespace: str
) -> None:
    http = {"name": "http", "port": 8080, "protocol": "HTTP"}
    https = {
        "name": "https",
        "port": 8443,
        "protocol": "HTTPS",
        "tls": {"certificateRefs": [{"name": "edge-cert"}]},
    }
    await kube.create(kinds.GATEWAYS, ingress("edge", namespace, http, https))
    for kind in OWNED:
        obj = await eventually(lambda kind=kind: get(kube, kind, "edge-istio", namespace))
        assert obj["metadata"]["labels"]["gateway.istio.io/managed"] == "istio.io-gateway-controller"
    service = await kube.get(kinds.SERVICES, "edge-istio", namespace)
    assert service["spec"]["type"] == "LoadBalancer"
    assert {p["port"] for p in service["spec"]["ports"]} == {15021, 8080, 8443}
    gateway = await eventually(lambda: programmed(kube, "edge", namespace, "False", "AddressNotAssigned"))
    assert listener_condition(gateway, "https", "ResolvedRefs").get("reason") == "InvalidCertificateRef"
    assert listener_condition(gateway, "http", "Programmed")["status"] == "True"

    await kube.create(kinds.SECRETS, tls_secret("edge-cert", namespace), namespace)

    async def resolved() -> Obj | None:
        found = await get(kube, kinds.GATEWAYS, "edge", namespace)
        return found if listener_condition(found, "https", "ResolvedRefs").get("status") == "True" else None

    await eventually(resolved)
    lb = {"status": {"loadBalancer": {"ingress": [{"ip": "198.18.254.3"}]}}}
    await kube.patch_status(kinds.SERVICES, "edge-istio", lb, namespace)
    gateway = await eventually(lambda: programmed(kube, "edge", namespace, "True", "Programmed"))
    assert gateway["status"]["addresses"] == [{"type": "IPAddress", "value": "198.18.254.3"}]


async def absent(kube: KubeClient, name: str, namespace: str) -> bool:
    """Nothing deployed for the Gateway and no status on it."""
    gateway = await get(kube, kinds.GATEWAYS, name, namespace)
    assert gateway is not None
    assert not (gateway.get("status") or {}).get("conditions"), gateway.get("status")
    for kind in OWNED:
        assert await get(kube, kind, name, namespace) is None, (kind, name)
    return True


async def deployed(kube: KubeClient, name: str, namespace: str) -> Obj | None:
    deployment = await get(kube, kinds.DEPLOYMENTS, name, namespace)
    gateway = await get(kube, kinds.GATEWAYS, name, namespace)
    return deployment if deployment and condition(gateway, "Accepted").get("status") == "True" else None


async def test_gateways_of_another_revision_get_nothing_from_this_control_plane(
    kube: KubeClient, plane: ControlPlane, namespace: str
) -> None:
    """Upstream TestOtherRevisionIgnored: a Gateway labelled (or in a namespace labelled) istio.io/rev=foo gets no
    objects and no status from the default revision; a control plane of revision foo deploys it."""
    other_ns = f"wp-foo-{secrets.token_hex(3)}"
    await kube.create(kinds.NAMESPACES, {"metadata": {"name": other_ns, "labels": {"istio.io/rev": "foo"}}})
    try:
        ingress = waypoint("ingress-foo", namespace, **{"istio.io/rev": "foo"})
        ingress["spec"] = {"gatewayClassName": "istio", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}
        for gateway in (
            waypoint("foo", namespace, **{"istio.io/rev": "foo"}),
            ingress,
            waypoint("unlabelled", other_ns),
            waypoint("mine", other_ns, **{"istio.io/rev": "default"}),
            waypoint("barrier", namespace),
        ):
            await kube.create(kinds.GATEWAYS, gateway)
        # The Gateways of the default revision are deployed (the Gateway's label wins over its namespace's) ...
        await eventually(lambda: deployed(kube, "barrier", namespace))
        await eventually(lambda: deployed(kube, "mine", other_ns))
        # ... and every pass that did so saw the others and left them alone.
        assert await absent(kube, "foo", namespace)
        assert await absent(kube, "ingress-foo", namespace)
        assert await absent(kube, "unlabelled", other_ns)

        # A control plane of revision foo takes exactly those, and labels its pods with its revision.
        foo = GatewayController(
            kube,
            GatewayControllerSettings(
                template=WaypointTemplateSettings(revision="foo", image_pull_policy="Never"),
                debounce=0.05,
                create_class=False,
            ),
            clock=time.time,
        )
        await foo.start()
        try:
            found = await eventually(lambda: deployed(kube, "foo", namespace))
            assert found["spec"]["template"]["metadata"]["annotations"]["istio.io/rev"] == "foo"
            await eventually(lambda: deployed(kube, "unlabelled", other_ns))
            await eventually(lambda: get(kube, kinds.DEPLOYMENTS, "ingress-foo-istio", namespace))
        finally:
            await foo.aclose()
        barrier = await kube.get(kinds.DEPLOYMENTS, "barrier", namespace)
        assert barrier["spec"]["template"]["metadata"]["annotations"]["istio.io/rev"] == "default"

        # Relabelling moves a Gateway to this revision: its own label, or its namespace's.
        await kube.patch(kinds.GATEWAYS, "foo", {"metadata": {"labels": {"istio.io/rev": None}}}, namespace)
        await eventually(lambda: programmed(kube, "foo", namespace, "False", "AddressNotAssigned"))
        await kube.create(kinds.GATEWAYS, waypoint("late", other_ns))
        await kube.create(kinds.GATEWAYS, waypoint("barrier-2", namespace))
        await eventually(lambda: deployed(kube, "barrier-2", namespace))
        assert await absent(kube, "late", other_ns)
        await kube.patch(kinds.NAMESPACES, other_ns, {"metadata": {"labels": {"istio.io/rev": "default"}}})
        await eventually(lambda: deployed(kube, "late", other_ns))
    finally:
        with contextlib.suppress(KubeNotFoundError):
            await kube.delete(kinds.NAMESPACES, other_ns)


async def test_a_listener_set_the_gateway_admits_opens_its_port_and_one_it_does_not_admit_is_refused(
    kube: KubeClient, plane: ControlPlane, namespace: str
) -> None:
    parent = ingress("shared", namespace, {"name": "http", "port": 8080, "protocol": "HTTP", "hostname": "a.example"})
    parent["spec"]["allowedListeners"] = {"namespaces": {"from": "Same"}}
    await kube.create(kinds.GATEWAYS, parent)
    ref = {"name": "shared", "namespace": namespace}
    team = {
        "metadata": {"name": "team", "namespace": namespace},
        "spec": {"parentRef": ref, "listeners": [{"name": "extra", "port": 9090, "protocol": "HTTP"}]},
    }
    await kube.create(kinds.LISTENER_SETS, team, namespace)
    # An XListenerSet in the control plane's namespace: not the Gateway's namespace, so not admitted.
    outsider = {
        "metadata": {"name": f"outsider-{secrets.token_hex(3)}", "namespace": "istio-system"},
        "spec": {"parentRef": ref, "listeners": [{"name": "steal", "port": 9191, "protocol": "HTTP"}]},
    }
    await kube.create(kinds.X_LISTENER_SETS, outsider, "istio-system")

    async def opened() -> Obj | None:
        service = await get(kube, kinds.SERVICES, "shared-istio", namespace)
        ports = {p["port"] for p in (service or {}).get("spec", {}).get("ports") or ()}
        return service if 9090 in ports else None

    service = await eventually(opened)
    assert {p["port"] for p in service["spec"]["ports"]} == {15021, 8080, 9090}

    async def accepted() -> Obj | None:
        found = await get(kube, kinds.LISTENER_SETS, "team", namespace)
        return found if condition(found, "Accepted").get("status") == "True" else None

    found = await eventually(accepted)
    assert [item["name"] for item in found["status"]["listeners"]] == ["extra"]
    gateway = await eventually(
        lambda: _with(get(kube, kinds.GATEWAYS, "shared", namespace), lambda g: g["status"].get("attachedListenerSets"))
    )
    assert gateway["status"]["attachedListenerSets"] == 1
    assert condition(gateway, "ResolvedRefs")["reason"] == "ResolvedRefs"

    async def refused() -> Obj | None:
        found = await get(kube, kinds.X_LISTENER_SETS, outsider["metadata"]["name"], "istio-system")
        return found if condition(found, "Accepted").get("reason") == "NotAllowed" else None

    await eventually(refused)


async def _with(pending: Any, check: Any) -> Obj | None:
    found = await pending
    return found if found and found.get("status") and check(found) else None

"""Dual-stack Services through the embedded API server's REST path (defaults, the Service strategy, merge patches):
a server given two Service ranges hands out a cluster IP per family, upgrades and downgrades by the policy alone,
and refuses what kube-apiserver refuses with a 422 that names the field."""

from __future__ import annotations

from pathlib import Path

from apiserver_client import ApiClient

from ambit.apiserver.server import ApiServer, ApiServerSettings

SERVICES = "/api/v1/namespaces/default/services"
RANGES = "198.19.0.0/16,fd00:ab:ffff::/108"


def service(name: str, **spec: object) -> dict[str, object]:
    return {"metadata": {"name": name}, "spec": {"selector": {"app": name}, "ports": [{"port": 80}], **spec}}


async def test_a_dual_stack_api_server_allocates_upgrades_and_downgrades_services(tmp_path: Path) -> None:
    settings = ApiServerSettings(
        data_dir=tmp_path / "api", port=0, crd_dir=None, service_cidr=RANGES, advertise_address="198.18.0.1"
    )
    async with ApiServer(settings) as server, ApiClient.for_server(server) as api:
        kubernetes = await api.must_get(f"{SERVICES}/kubernetes")
        assert kubernetes["spec"]["clusterIP"] == "198.19.0.1"  # the primary range's first address
        single = await api.create(SERVICES, service("single"))
        assert single["spec"]["ipFamilies"] == ["IPv4"] and single["spec"]["ipFamilyPolicy"] == "SingleStack"
        dual = await api.create(SERVICES, service("dual", ipFamilyPolicy="PreferDualStack"))
        v4, v6 = dual["spec"]["clusterIPs"]
        assert dual["spec"]["clusterIP"] == v4 and v6.startswith("fd00:ab:ffff::")

        upgraded = await api.patch(f"{SERVICES}/single", {"spec": {"ipFamilyPolicy": "RequireDualStack"}})
        assert upgraded.status == 200, upgraded.body
        assert upgraded.body["spec"]["ipFamilies"] == ["IPv4", "IPv6"]
        assert upgraded.body["spec"]["clusterIPs"][0] == single["spec"]["clusterIP"]
        assert upgraded.body["spec"]["clusterIPs"][1] not in (v6, "")
        downgraded = await api.patch(f"{SERVICES}/dual", {"spec": {"ipFamilyPolicy": "SingleStack"}})
        assert downgraded.status == 200, downgraded.body
        assert downgraded.body["spec"]["clusterIPs"] == [v4] and downgraded.body["spec"]["ipFamilies"] == ["IPv4"]

        moved = await api.patch(f"{SERVICES}/dual", {"spec": {"clusterIP": "198.19.0.99", "clusterIPs": None}})
        assert moved.status == 422 and "spec.clusterIP" in str(moved.body)
        wrong = await api.post(SERVICES, service("wrong", clusterIP="fd00:ab:ffff::9", ipFamilies=["IPv4"]))
        assert wrong.status == 422 and "spec.clusterIPs[0]" in str(wrong.body)
        taken = await api.post(SERVICES, service("taken", ipFamilies=["IPv6"], clusterIP=v6))
        assert taken.status == 201, taken.body  # the downgrade released the IPv6 address


async def test_a_single_stack_api_server_refuses_require_dual_stack(tmp_path: Path) -> None:
    settings = ApiServerSettings(data_dir=tmp_path / "api", port=0, crd_dir=None)
    async with ApiServer(settings) as server, ApiClient.for_server(server) as api:
        refused = await api.post(SERVICES, service("require", ipFamilyPolicy="RequireDualStack"))
        assert refused.status == 422 and "not configured for dual-stack" in str(refused.body)
        prefer = await api.create(SERVICES, service("prefer", ipFamilyPolicy="PreferDualStack"))
        assert prefer["spec"]["ipFamilies"] == ["IPv4"] and len(prefer["spec"]["clusterIPs"]) == 1

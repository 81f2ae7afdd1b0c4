"""The API server publishes itself as ``default/kubernetes`` (apiserver/kubernetes_service.py): a Service on the
first address of the range, port 443 to the port it serves on, and an EndpointSlice with the advertised address;
restarted on another port, it brings both back to the new port and keeps what users added."""

from __future__ import annotations

from pathlib import Path

from apiserver_client import ApiClient

from ambit.apiserver.server import ApiServer, ApiServerSettings

SERVICE = "/api/v1/namespaces/default/services/kubernetes"
SLICE = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/kubernetes"


async def test_the_api_server_is_published_as_the_kubernetes_service(tmp_path: Path) -> None:
    settings = ApiServerSettings(data_dir=tmp_path / "api", port=0, crd_dir=None, advertise_address="198.18.0.1")
    async with ApiServer(settings) as server, ApiClient.for_server(server) as api:
        port = int(server.url.rsplit(":", 1)[1])
        service, eps = await api.must_get(SERVICE), await api.must_get(SLICE)
        assert service["spec"]["clusterIP"] == "198.19.0.1" and "selector" not in service["spec"]
        assert [(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [("https", 443, port)]
        assert eps["metadata"]["labels"] == {"kubernetes.io/service-name": "kubernetes"}
        assert eps["endpoints"][0]["addresses"] == ["198.18.0.1"] and eps["ports"][0]["port"] == port
        # A user's label stays; the port the server serves on does not.
        await api.patch(
            SERVICE,
            {
                "metadata": {"labels": {"team": "x"}},
                "spec": {"ports": [{"name": "https", "port": 443, "targetPort": 1}]},
            },
        )
    async with ApiServer(settings) as again, ApiClient.for_server(again) as api:
        port = int(again.url.rsplit(":", 1)[1])
        service, eps = await api.must_get(SERVICE), await api.must_get(SLICE)
        assert service["metadata"]["labels"]["team"] == "x"
        assert [p["targetPort"] for p in service["spec"]["ports"]] == [port] and eps["ports"][0]["port"] == port
        other = await api.create(
            "/api/v1/namespaces/default/services", {"metadata": {"name": "other"}, "spec": {"ports": [{"port": 80}]}}
        )
        assert other["spec"]["clusterIP"] != "198.19.0.1"


async def test_a_server_on_loopback_alone_publishes_nothing(tmp_path: Path) -> None:
    settings = ApiServerSettings(data_dir=tmp_path / "api", port=0, crd_dir=None)
    async with ApiServer(settings) as server, ApiClient.for_server(server) as api:
        assert not await api.exists(SERVICE) and not await api.exists(SLICE)

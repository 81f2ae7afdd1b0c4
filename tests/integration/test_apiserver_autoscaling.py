"""HorizontalPodAutoscalers are served (autoscaling/v2): a manifest that carries one applies, lists and reads back;
nothing in the embedded cluster acts on it."""

from __future__ import annotations

from pathlib import Path

from apiserver_client import ApiClient

from ambit.apiserver.server import ApiServer, ApiServerSettings

HPAS = "/apis/autoscaling/v2/namespaces/default/horizontalpodautoscalers"


async def test_a_horizontal_pod_autoscaler_is_stored_and_listed(tmp_path: Path) -> None:
    settings = ApiServerSettings(data_dir=tmp_path / "api", port=0, crd_dir=None)
    async with ApiServer(settings) as server, ApiClient.for_server(server) as api:
        body = {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "waypoint"},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "waypoint"},
                "minReplicas": 1,
                "maxReplicas": 3,
            },
        }
        created = await api.create(HPAS, body)
        assert created["spec"]["maxReplicas"] == 3
        listed = await api.get(HPAS)
        assert [item["metadata"]["name"] for item in listed.body["items"]] == ["waypoint"]

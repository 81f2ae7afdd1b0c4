"""A running ``ambit controlplane`` reports on its monitoring port (istiod's 15014) exactly what it was asked to do.

The control plane is a subprocess (``python -m ambit.cli controlplane --monitoring-port ...``) against the module's
embedded API server, signing with a plug-in intermediate. The test asks the CA for a certificate as ``shop/web`` and
once with a forged token, opens a delta ADS stream as ztunnel stating its version, creates a pod and a Service,
NACKs one response and ACKs a nonce it never got, and after each step scrapes ``/metrics`` and checks that istiod's
counters moved by exactly that.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc  # type: ignore[import-untyped]
import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from google.protobuf import struct_pb2
from prometheus_client.parser import text_string_to_metric_families
from tests import crl_pki
from tests.cacerts import cacerts_files, write_volume
from tests.harness import ServerProcess, free_port
from tests.integration.controlplane_rig import (
    ADS_METHOD,
    SERVER_NAME,
    account_token,
    control_plane_process,
    make_pod,
)

from ambit import __version__
from ambit.api import discovery_pb2 as dpb
from ambit.identity.caclient import CaError
from ambit.identity.istiod import IstiodCaClient
from ambit.k8s import KubeAlreadyExistsError, KubeClient, kinds
from ambit.model.identity import SpiffeId

NAMESPACE = "shop"
WEB = SpiffeId("cluster.local", NAMESPACE, "web")
ADDRESS = "type.googleapis.com/istio.workload.Address"
AUTHORIZATION = "type.googleapis.com/istio.security.Authorization"
PROXY_VERSION = "1.99.0-monitoring-test"
NOW = time.time()
ROOT = crl_pki.root("Monitoring test root", now=NOW)
INTERMEDIATE = crl_pki.intermediate(ROOT, "Monitoring test intermediate", now=NOW)

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass
class Plane:
    process: asyncio.subprocess.Process
    port: int
    monitoring_port: int
    cacerts: Path

    async def get(self, path: str) -> tuple[int, bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.monitoring_port)
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: istiod\r\nConnection: close\r\n\r\n".encode())
            async with asyncio.timeout(10):
                answer = await reader.read()
        finally:
            writer.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        return int(head.split(b" ", 2)[1]), body

    async def scrape(self) -> Series:
        """Every sample, keyed by (name, sorted labels); counters by their family's name (no ``_total``)."""
        status, body = await self.get("/metrics")
        assert status == 200, body[:500]
        out: Series = {}
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                name = family.name if family.type == "counter" else sample.name
                out[name, tuple(sorted(sample.labels.items()))] = sample.value
        return out


def key(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return name, tuple(sorted(labels.items()))


def moved(before: Series, after: Series, name: str, **labels: str) -> float:
    return after.get(key(name, **labels), 0.0) - before.get(key(name, **labels), 0.0)


async def settles(plane: Plane, check: Callable[[Series], bool], what: str, within: float = 20.0) -> Series:
    """The first scrape for which ``check`` holds (the counters are bumped on the control plane's own schedule)."""
    deadline = time.monotonic() + within
    while True:
        series = await plane.scrape()
        if check(series):
            return series
        assert time.monotonic() < deadline, f"timed out after {within:.0f} s waiting for {what}"
        await asyncio.sleep(0.1)


@pytest.fixture
async def plane(server_process: ServerProcess, kube: KubeClient, tmp_path: Path) -> AsyncIterator[Plane]:
    for namespace in ("istio-system", NAMESPACE):
        with contextlib.suppress(KubeAlreadyExistsError):
            await kube.create(kinds.NAMESPACES, {"metadata": {"name": namespace}})
    cacerts = tmp_path / "cacerts"
    write_volume(cacerts, cacerts_files(INTERMEDIATE, ROOT.cert_pem), 1)
    monitoring_port = free_port()
    args = ("--webhook-port", "0", "--monitoring-port", str(monitoring_port), "--cacerts-dir", str(cacerts))
    async with control_plane_process(server_process.kubeconfig, tmp_path, *args) as (process, port):
        yield Plane(process, port, monitoring_port, cacerts)


class AdsClient:
    """A raw delta ADS stream: the test reads each response and decides whether to ACK or NACK it."""

    def __init__(self, call: object) -> None:
        self.call: object = call
        self.responses: asyncio.Queue[dpb.DeltaDiscoveryResponse] = asyncio.Queue()

    async def write(self, request: dpb.DeltaDiscoveryRequest) -> None:
        await self.call.write(request)  # type: ignore[attr-defined]

    async def next(self, within: float = 20.0) -> dpb.DeltaDiscoveryResponse:
        async with asyncio.timeout(within):
            return await self.responses.get()

    async def ack(self, response: dpb.DeltaDiscoveryResponse) -> None:
        await self.write(dpb.DeltaDiscoveryRequest(type_url=response.type_url, response_nonce=response.nonce))


@contextlib.asynccontextmanager
async def ads_stream(plane: Plane, token: str) -> AsyncIterator[AdsClient]:
    credentials = grpc.ssl_channel_credentials(root_certificates=ROOT.cert_pem)
    options = [("grpc.ssl_target_name_override", SERVER_NAME)]
    async with grpc.aio.secure_channel(f"127.0.0.1:{plane.port}", credentials, options) as channel:
        call = channel.stream_stream(
            ADS_METHOD,
            request_serializer=dpb.DeltaDiscoveryRequest.SerializeToString,
            response_deserializer=dpb.DeltaDiscoveryResponse.FromString,
        )(metadata=(("authorization", f"Bearer {token}"), ("clusterid", "Kubernetes")))
        client = AdsClient(call)

        async def read() -> None:
            while (response := await call.read()) is not grpc.aio.EOF:
                client.responses.put_nowait(response)

        reader = asyncio.create_task(read(), name="delta ADS reader")
        try:
            yield client
        finally:
            call.cancel()
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)


def forged_token() -> str:
    """A well-formed service-account token for ``shop/web`` signed by a key the API server never issued."""
    key_ = ec.generate_private_key(ec.SECP256R1())
    claims = {
        "iss": "https://kubernetes.default.svc.cluster.local",
        "sub": f"system:serviceaccount:{NAMESPACE}:web",
        "aud": ["istio-ca"],
        "exp": int(time.time()) + 3600,
        "kubernetes.io": {"namespace": NAMESPACE, "serviceaccount": {"name": "web", "uid": "0"}},
    }
    return jwt.encode(claims, key_, algorithm="ES256")


def ca_client(plane: Plane, token_file: Path) -> IstiodCaClient:
    return IstiodCaClient(
        f"127.0.0.1:{plane.port}",
        plane.cacerts / "root-cert.pem",
        token_file,
        ttl_seconds=300,
        impersonate=False,
        server_name=SERVER_NAME,
    )


async def test_version_and_the_cas_expiry_are_served(plane: Plane) -> None:
    assert await plane.get("/version") == (200, __version__.encode())
    series = await plane.scrape()
    root = x509.load_pem_x509_certificate(ROOT.cert_pem).not_valid_after_utc.timestamp()
    signer = x509.load_pem_x509_certificate(INTERMEDIATE.cert_pem).not_valid_after_utc.timestamp()
    assert series[key("citadel_server_root_cert_expiry_timestamp")] == root
    assert series[key("citadel_server_cert_chain_expiry_timestamp")] == signer
    assert series[key("istio_build", component="pilot", tag=__version__)] == 1
    assert series[key("process_resident_memory_bytes")] > 0


async def test_ca_requests_are_counted_and_a_forged_token_is_an_authentication_failure(
    plane: Plane, kube: KubeClient, tmp_path: Path
) -> None:
    honest, forged = tmp_path / "token", tmp_path / "forged"
    honest.write_text(await account_token(kube, NAMESPACE, "web"))
    forged.write_text(forged_token())
    before = await plane.scrape()
    async with ca_client(plane, honest) as client:
        await client.fetch_certificate(WEB)
    after = await plane.scrape()
    assert moved(before, after, "citadel_server_csr_count") == 1
    assert moved(before, after, "citadel_server_success_cert_issuance_count") == 1
    assert moved(before, after, "citadel_server_authentication_failure_count") == 0
    async with ca_client(plane, forged) as client:
        with pytest.raises(CaError):
            await client.fetch_certificate(WEB)
    last = await plane.scrape()
    assert moved(after, last, "citadel_server_csr_count") == 1
    assert moved(after, last, "citadel_server_authentication_failure_count") == 1
    assert moved(after, last, "citadel_server_success_cert_issuance_count") == 0
    assert moved(after, last, "citadel_server_csr_parsing_err_count") == 0


async def test_a_delta_xds_client_moves_the_pilot_counters_by_what_it_was_sent(plane: Plane, kube: KubeClient) -> None:
    token = await account_token(kube, "istio-system", "ztunnel")
    metadata = struct_pb2.Struct()
    metadata.update({"ISTIO_VERSION": PROXY_VERSION})
    node = dpb.Node(id="ztunnel~10.0.0.1~ztunnel-1.istio-system~istio-system.svc.cluster.local", metadata=metadata)
    before = await plane.scrape()
    assert key("pilot_xds", version=PROXY_VERSION) not in before
    async with ads_stream(plane, token) as ads:
        await ads.write(dpb.DeltaDiscoveryRequest(type_url=ADDRESS, node=node))
        await ads.write(dpb.DeltaDiscoveryRequest(type_url=AUTHORIZATION))
        first = {(r := await ads.next()).type_url: r for _ in range(2)}
        assert set(first) == {ADDRESS, AUTHORIZATION}
        for response in first.values():
            await ads.ack(response)
        opened = await settles(
            plane,
            lambda s: (
                moved(before, s, "pilot_xds_pushes", type="wds") >= 1
                and moved(before, s, "pilot_xds_pushes", type="wads") >= 1
            ),
            "the first responses to be counted",
        )
        assert opened[key("pilot_xds", version=PROXY_VERSION)] == 1
        assert moved(before, opened, "pilot_xds_pushes", type="wds") == 1
        assert moved(before, opened, "pilot_xds_pushes", type="wads") == 1
        assert moved(before, opened, "pilot_xds_push_time_count", type="wds") == 1
        assert moved(before, opened, "pilot_xds_config_size_bytes_count", type=ADDRESS) == 1
        assert moved(before, opened, "pilot_xds_send_time_count") >= 2
        assert moved(before, opened, "pilot_push_triggers", type="ambient") == 0  # answers to requests, no push

        # A pod appears: the informer counts it, and each push that reaches the stream is counted as it went.
        await make_pod(kube, NAMESPACE, "web-1", "10.1.0.7", {"app": "web"})
        pushed: list[dpb.DeltaDiscoveryResponse] = []
        while not (pushed and _names_pod(pushed[-1])):
            pushed.append(await ads.next())
            if not _names_pod(pushed[-1]):
                await ads.ack(pushed[-1])
        last = pushed[-1]
        assert last.type_url == ADDRESS
        # NACK the push that carried the pod: one reject of wds.
        await ads.write(
            dpb.DeltaDiscoveryRequest(
                type_url=ADDRESS,
                response_nonce=last.nonce,
                error_detail=dpb.Status(code=3, message="rejected by the monitoring test"),
            )
        )
        # An ACK of a nonce this stream was never sent: one expired nonce of wds.
        await ads.write(dpb.DeltaDiscoveryRequest(type_url=ADDRESS, response_nonce="never-sent"))
        # Types the client makes up, opened, NACKed and ACKed: none of them becomes a series.
        for n in range(20):
            forged = f"type.googleapis.com/forged.Type{n}"
            await ads.write(dpb.DeltaDiscoveryRequest(type_url=forged))
            await ads.write(
                dpb.DeltaDiscoveryRequest(type_url=forged, response_nonce="x", error_detail=dpb.Status(code=3))
            )
            await ads.write(dpb.DeltaDiscoveryRequest(type_url=forged, response_nonce="y"))

        def received(series: Series) -> bool:
            """Every push counted is one the stream got (more may still be on their way: the pod's status)."""
            while not ads.responses.empty():
                pushed.append(ads.responses.get_nowait())
            wds = sum(1 for r in pushed if r.type_url == ADDRESS)
            wads = sum(1 for r in pushed if r.type_url == AUTHORIZATION)
            return (
                moved(opened, series, "pilot_xds_pushes", type="wds") == wds
                and moved(opened, series, "pilot_xds_pushes", type="wads") == wads
                and moved(opened, series, "pilot_total_xds_rejects", type="wds") >= 1
                and moved(opened, series, "pilot_xds_expired_nonce", type="wds") >= 1
                and moved(opened, series, "pilot_k8s_reg_events", type="Pods", event="add") >= 1
            )

        during = await settles(plane, received, "the pushes, the NACK, the stale ACK and the pod's add to be counted")
        assert not [k for k in during if any("forged" in value for _, value in k[1])]
        assert moved(opened, during, "pilot_total_xds_rejects", type="wds") == 1
        assert moved(opened, during, "pilot_xds_expired_nonce", type="wds") == 1
        assert moved(opened, during, "pilot_k8s_reg_events", type="Pods", event="add") == 1
        assert moved(opened, during, "pilot_k8s_reg_events", type="Pods", event="update") >= 1  # its status
        rounds = moved(opened, during, "pilot_proxy_convergence_time_count")
        assert 1 <= rounds <= len(pushed)
        assert moved(opened, during, "pilot_push_triggers", type="ambient") >= rounds

        # A Service: pilot_services counts it once the translation has it.
        services = during[key("pilot_services")]
        service = {
            "metadata": {"name": "web", "namespace": NAMESPACE},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]},
        }
        await kube.create(kinds.SERVICES, service, NAMESPACE)
        await settles(plane, lambda s: s[key("pilot_services")] == services + 1, "pilot_services to count it")
    # The stream is gone, and so is its version's series.
    await settles(plane, lambda s: key("pilot_xds", version=PROXY_VERSION) not in s, "the client to be forgotten")


def _names_pod(response: dpb.DeltaDiscoveryResponse) -> bool:
    """Whether the response carries the test pod's workload (its name holds the pod's namespace and name)."""
    return any("web-1" in resource.name for resource in response.resources)


async def test_a_burst_of_changes_is_timed_from_its_first_change_to_its_hand_over(
    plane: Plane, kube: KubeClient
) -> None:
    """``pilot_debounce_time`` (the debounce wait plus the translation, istiod's buckets) and
    ``pilot_pushcontext_init_seconds`` (the translation alone) move when pods appear."""
    before = await plane.scrape()
    for n in range(3):  # one burst, or a few: each is timed once
        await make_pod(kube, NAMESPACE, f"burst-{n}", f"10.1.1.{n + 1}", {"app": "burst"})
    after = await settles(
        plane, lambda s: moved(before, s, "pilot_debounce_time_count") >= 1, "the burst to be handed over"
    )
    bursts = moved(before, after, "pilot_debounce_time_count")
    assert 1 <= bursts <= 3
    assert moved(before, after, "pilot_pushcontext_init_seconds_count") >= bursts
    waited = moved(before, after, "pilot_debounce_time_sum")
    assert waited >= bursts * 0.1 * 0.9  # at least the default debounce (0.1 s) each, the clock's slack aside
    assert moved(before, after, "pilot_debounce_time_bucket", le="0.01") == 0
    assert moved(before, after, "pilot_debounce_time_bucket", le="+Inf") == bursts
    assert key("pilot_debounce_time_bucket", le="30.0") in after
    assert key("pilot_pushcontext_init_seconds_bucket", le="5.0") in after
    assert key("pilot_pushcontext_init_seconds_bucket", le="10.0") not in after

"""The ingress benchmark's gateway config (bench/ingress_loopback.py): one HTTPS listener with the bench's
certificate and a route to the echo Service, as the control plane translates it."""

from __future__ import annotations

import time

from bench.ingress_loopback import SERVER_NAME, content_length, gateway_config, mesh_config

from ambit.model.ingress import ListenerProtocol
from ambit.tls.certs import issue_server_cert, new_ca

CA = new_ca("bench test CA", now=time.time())
SERVER = issue_server_cert(CA, common_name=SERVER_NAME, dns_names=["*.bench.example"], ip_addresses=[], now=time.time())


def test_the_gateway_config_is_one_https_listener_serving_the_bench_certificate() -> None:
    config = gateway_config(18443, SERVER.cert_pem, SERVER.key_pem)
    (listener,) = config.listeners
    assert (listener.port, listener.protocol, listener.hostname) == (18443, ListenerProtocol.HTTPS, "*.bench.example")
    assert [c.cert_pem for c in listener.certificates] == [SERVER.cert_pem]
    (host,) = listener.virtual_hosts
    assert host.http, "the HTTPRoute to echo is attached"


def test_the_mesh_state_holds_the_echo_service_and_its_workload() -> None:
    config = mesh_config()
    assert [s.hostname for s in config.services] == ["echo.bench.svc.cluster.local"]
    assert [w.name for w in config.workloads] == ["echo"]


def test_content_length_is_read_from_a_lower_cased_head() -> None:
    assert content_length(b"http/1.1 200 ok\r\ncontent-length: 1024\r\nx: y") == 1024
    assert content_length(b"http/1.1 204 no content") == 0

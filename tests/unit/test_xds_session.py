"""Delta ADS state machines, both sides, as playbooks: requests in, responses out (and the two joined in memory)."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import replace

import pytest
from google.protobuf import any_pb2

from ambit.api import discovery_pb2 as dpb
from ambit.api import workload_pb2 as pb
from ambit.controlplane.addresses import addresses
from ambit.model.localconfig import LocalConfig
from ambit.model.state import WorkloadState
from ambit.model.workload import HealthStatus, NetworkAddress, PortMapping, Service, Workload
from ambit.xds import client_session
from ambit.xds import session as session_module
from ambit.xds.client_session import MAX_INITIAL_REQUEST_BYTES, ClientSession
from ambit.xds.convert import ADDRESS_TYPE_URL, decode_address
from ambit.xds.resource_set import ResourceSet, XdsResource
from ambit.xds.session import AUTHORIZATION_TYPE_URL, RequestKind, ServerSession
from ambit.xds.table import AddressTable

A = ADDRESS_TYPE_URL


def _pod(name: str, ip: str, node: str = "node-a") -> Workload:
    return Workload(
        uid=f"Kubernetes//Pod/shop/{name}",
        name=name,
        namespace="shop",
        addresses=(ipaddress.ip_address(ip),),
        node=node,
    )


WEB1, WEB2, DB = _pod("web-1", "198.18.200.1"), _pod("web-2", "198.18.200.2"), _pod("db-1", "198.18.200.3")
SVC = Service(
    "web",
    "shop",
    "web.shop.svc.cluster.local",
    vips=(NetworkAddress("", ipaddress.ip_address("198.18.210.1")),),
    ports=(PortMapping(80, 8080),),
)


def _table(*items: Workload | Service) -> AddressTable:
    return AddressTable(addresses(_config(*items)))


def _config(*items: Workload | Service) -> LocalConfig:
    return LocalConfig(
        tuple(i for i in items if isinstance(i, Workload)), tuple(i for i in items if isinstance(i, Service))
    )


def _request(
    type_url: str = A,
    *,
    subscribe: Sequence[str] = (),
    unsubscribe: Sequence[str] = (),
    initial: dict[str, str] | None = None,
    nonce: str = "",
    error: str = "",
) -> dpb.DeltaDiscoveryRequest:
    request = dpb.DeltaDiscoveryRequest(
        type_url=type_url,
        resource_names_subscribe=list(subscribe),
        resource_names_unsubscribe=list(unsubscribe),
        initial_resource_versions=initial or {},
        response_nonce=nonce,
    )
    if error:
        request.error_detail.code, request.error_detail.message = 3, error
    return request


def _names(response: dpb.DeltaDiscoveryResponse) -> list[str]:
    return [r.name for r in response.resources]


# Server session.


def test_a_wildcard_client_gets_everything_then_only_changes() -> None:
    table, session = _table(WEB1, WEB2, SVC), ServerSession()
    opened = session.receive(_request(), table.current)
    assert opened.kind is RequestKind.OPENED
    (snapshot,) = opened.responses
    assert sorted(_names(snapshot)) == sorted([WEB1.uid, WEB2.uid, SVC.key])
    assert snapshot.type_url == A and snapshot.nonce == "n-1"
    assert session.receive(_request(nonce="n-1"), table.current).kind is RequestKind.ACK

    changed = table.replace(addresses(_config(WEB1, _pod("web-2", "198.18.200.22"), SVC, DB)))
    assert changed == {WEB2.uid, DB.uid}
    (push,) = session.push(A, table.current, changed).responses
    assert sorted(_names(push)) == sorted([WEB2.uid, DB.uid]) and not push.removed_resources
    assert session.push(A, table.current, changed).responses == ()  # already held: nothing to resend


def test_removals_are_sent_only_for_resources_the_client_holds() -> None:
    table, session = _table(WEB1, WEB2), ServerSession()
    session.receive(_request(), table.current)
    changed = table.replace(addresses(_config(WEB1)))
    (push,) = session.push(A, table.current, changed).responses
    assert list(push.removed_resources) == [WEB2.uid] and not push.resources
    assert session.push(A, table.current, [WEB2.uid]).responses == ()
    assert set(session.held(A)) == {WEB1.uid}


def test_an_on_demand_client_subscribes_to_nothing_then_looks_up_by_network_ip() -> None:
    table, session = _table(WEB1, WEB2, SVC), ServerSession()
    (empty,) = session.receive(_request(subscribe=["*"], unsubscribe=["*"]), table.current).responses
    assert not empty.resources and not empty.removed_resources  # an answer: the client is in sync

    (found,) = session.receive(_request(subscribe=["/198.18.200.2"]), table.current).responses
    assert _names(found) == [WEB2.uid]
    assert list(found.resources[0].aliases) == ["/198.18.200.2"]
    (vip,) = session.receive(_request(subscribe=["/198.18.210.1"]), table.current).responses
    assert _names(vip) == [SVC.key]

    (missing,) = session.receive(_request(subscribe=["/198.18.250.9"]), table.current).responses
    assert list(missing.removed_resources) == ["/198.18.250.9"] and not missing.resources

    # Changes to resources nobody asked for are not pushed; changes to looked-up ones are.
    changed = table.replace(addresses(_config(_pod("web-1", "198.18.200.11"), _pod("web-2", "198.18.200.2", "b"), SVC)))
    (push,) = session.push(A, table.current, changed).responses
    assert _names(push) == [WEB2.uid]


def test_an_alias_lookup_follows_the_ip_to_a_new_workload() -> None:
    table, session = _table(WEB1), ServerSession()
    session.receive(_request(subscribe=["*"], unsubscribe=["*"]), table.current)
    session.receive(_request(subscribe=["/198.18.200.1"]), table.current)
    reuse = _pod("web-9", "198.18.200.1")
    changed = table.replace(addresses(_config(reuse)))
    (push,) = session.push(A, table.current, changed).responses
    assert _names(push) == [reuse.uid] and list(push.removed_resources) == [WEB1.uid]


def _endpoint(pod: Workload) -> Workload:
    return replace(pod, services={SVC.key: (PortMapping(80, 8080),)})


def _on_demand(table: AddressTable) -> ServerSession:
    session = ServerSession()
    session.receive(_request(subscribe=["*"], unsubscribe=["*"]), table.current)
    return session


def test_a_vip_lookup_answers_with_the_service_and_all_its_endpoints_as_istiod() -> None:
    web1, web2 = _endpoint(WEB1), replace(_endpoint(WEB2), status=HealthStatus.UNHEALTHY)
    table = _table(web1, web2, DB, SVC)
    session = _on_demand(table)
    (vip,) = session.receive(_request(subscribe=["/198.18.210.1"]), table.current).responses
    assert sorted(_names(vip)) == sorted([SVC.key, WEB1.uid, WEB2.uid]), "unhealthy endpoints too; never db-1"
    assert not vip.removed_resources
    # The client now follows those workloads: a change to an endpoint is pushed, one to db-1 is not.
    moved = replace(web2, node="node-b")
    changed = table.replace(addresses(_config(web1, moved, replace(DB, node="node-b"), SVC)))
    (push,) = session.push(A, table.current, changed).responses
    assert _names(push) == [WEB2.uid]


def test_a_hostname_lookup_answers_like_a_vip_lookup() -> None:
    table = _table(_endpoint(WEB1), DB, SVC)
    session = _on_demand(table)
    (found,) = session.receive(_request(subscribe=[SVC.key]), table.current).responses
    assert sorted(_names(found)) == sorted([SVC.key, WEB1.uid])


def test_a_pod_ip_lookup_answers_with_the_workload_only() -> None:
    table = _table(_endpoint(WEB1), SVC)
    session = _on_demand(table)
    (found,) = session.receive(_request(subscribe=["/198.18.200.1"]), table.current).responses
    assert _names(found) == [WEB1.uid] and not found.removed_resources


def test_an_unknown_address_lookup_is_answered_as_removed() -> None:
    table = _table(_endpoint(WEB1), SVC)
    session = _on_demand(table)
    (missing,) = session.receive(_request(subscribe=["net-x/198.18.210.1"]), table.current).responses
    assert not missing.resources and list(missing.removed_resources) == ["net-x/198.18.210.1"]


def test_a_service_whose_endpoint_list_is_stale_answers_only_with_workloads_that_exist() -> None:
    current = ResourceSet.build(
        [
            XdsResource(SVC.key, "1", any_pb2.Any(), aliases=("/198.18.210.1",)),
            XdsResource("gone", "1", any_pb2.Any(), parents=("other/x",)),
        ]
    )
    assert current.lookup("/198.18.210.1") == {SVC.key}
    assert current.lookup("nothing/198.18.1.1") == frozenset()


def test_reconnect_with_initial_versions_resends_only_changes_and_removes_what_is_gone() -> None:
    before = _table(WEB1, WEB2, SVC)
    held = {name: r.version for name, r in before.current.by_name.items()}
    after = _table(WEB1, _pod("web-2", "198.18.200.22"), DB)  # web-2 changed, db new, service gone
    session = ServerSession()
    (resync,) = session.receive(_request(initial=held), after.current).responses
    assert sorted(_names(resync)) == sorted([WEB2.uid, DB.uid])
    assert list(resync.removed_resources) == [SVC.key]


def test_a_nack_is_reported_and_the_session_keeps_serving() -> None:
    table, session = _table(WEB1), ServerSession()
    session.receive(_request(), table.current)
    nack = session.receive(_request(nonce="n-1", error="web-1: bad"), table.current)
    assert nack.kind is RequestKind.NACK and nack.error == "web-1: bad" and nack.responses == ()
    assert session.nonces_in_flight(A) == ()
    changed = table.replace(addresses(_config(WEB1, WEB2)))
    (push,) = session.push(A, table.current, changed).responses
    assert _names(push) == [WEB2.uid]
    assert session.receive(_request(nonce=push.nonce), table.current).kind is RequestKind.ACK


def test_an_ack_of_an_unknown_nonce_is_stale() -> None:
    table, session = _table(WEB1), ServerSession()
    session.receive(_request(), table.current)
    assert session.receive(_request(nonce="n-1"), table.current).kind is RequestKind.ACK
    assert session.receive(_request(nonce="n-1"), table.current).kind is RequestKind.STALE
    assert session.receive(_request(nonce="bogus"), table.current).kind is RequestKind.STALE


def test_unsubscribing_forgets_what_the_client_held() -> None:
    table, session = _table(WEB1, WEB2), ServerSession()
    session.receive(_request(subscribe=["*"], unsubscribe=["*"]), table.current)
    session.receive(_request(subscribe=[WEB1.uid, WEB2.uid]), table.current)
    assert session.receive(_request(unsubscribe=[WEB1.uid]), table.current).responses == ()
    assert set(session.held(A)) == {WEB2.uid}


def test_a_type_without_resources_is_answered_empty() -> None:
    session = ServerSession()
    (response,) = session.receive(_request(AUTHORIZATION_TYPE_URL), ResourceSet.build([])).responses
    assert response.type_url == AUTHORIZATION_TYPE_URL and not response.resources
    assert session.push(A, _table(WEB1).current).responses == ()  # Address never opened: nothing pushed


def test_a_full_comparison_push_finds_every_difference() -> None:
    table, session = _table(WEB1, WEB2), ServerSession()
    session.receive(_request(), table.current)
    table.replace(addresses(_config(WEB1, DB)))
    (push,) = session.push(A, table.current, None).responses
    assert _names(push) == [DB.uid] and list(push.removed_resources) == [WEB2.uid]


# Client session.


def _client(on_demand: bool = False, max_initial_request: int = MAX_INITIAL_REQUEST_BYTES) -> ClientSession:
    return ClientSession({A: decode_address}, on_demand=on_demand, max_initial_request=max_initial_request)


def test_the_client_opens_wildcard_or_on_demand_with_what_it_holds() -> None:
    client = _client()
    (request,) = client.initial_requests()
    assert request.type_url == A and not request.resource_names_subscribe and not request.initial_resource_versions
    (on_demand,) = _client(on_demand=True).initial_requests()
    assert list(on_demand.resource_names_subscribe) == ["*"] == list(on_demand.resource_names_unsubscribe)


def test_the_client_applies_a_response_and_acks_it() -> None:
    table, client = _table(WEB1, SVC), _client()
    (response,) = ServerSession().receive(_request(), table.current).responses
    update = client.apply(response)
    assert dict(update.upserts) == {WEB1.uid: WEB1, SVC.key: SVC}
    assert update.reply.response_nonce == response.nonce and not update.reply.HasField("error_detail")
    assert client.synced and set(client.held(A)) == {WEB1.uid, SVC.key}
    (again,) = client.initial_requests()
    assert dict(again.initial_resource_versions) == dict(client.held(A))


def test_a_malformed_resource_is_nacked_while_the_rest_apply() -> None:
    client = _client()
    bad = pb.Address(workload=pb.Workload(uid="Kubernetes//Pod/shop/bad", name="bad", namespace="shop"))
    bad.workload.addresses.append(b"\x01\x02\x03")
    good = addresses(_config(WEB1))[WEB1.uid]
    response = dpb.DeltaDiscoveryResponse(
        type_url=A,
        nonce="n-7",
        resources=[
            dpb.Resource(name="Kubernetes//Pod/shop/bad", version="1", resource=_pack(bad)),
            dpb.Resource(name=WEB1.uid, version=good[0], resource=_pack(good[1])),
            dpb.Resource(name="no-body", version="1"),
        ],
        removed_resources=["never-held"],
    )
    update = client.apply(response)
    assert [name for name, _ in update.upserts] == [WEB1.uid] and update.removals == ()
    assert update.nacked and update.reply.response_nonce == "n-7"
    assert "Kubernetes//Pod/shop/bad: workload.addresses[0]: expected 4 or 16 bytes, got 3" in (
        update.reply.error_detail.message
    )
    assert "no-body: resource: missing" in update.reply.error_detail.message
    assert set(client.held(A)) == {WEB1.uid}


def test_a_response_of_an_unopened_type_is_nacked() -> None:
    update = _client().apply(dpb.DeltaDiscoveryResponse(type_url="type.googleapis.com/x", nonce="1"))
    assert update.nacked and update.upserts == () and "not subscribed" in update.reply.error_detail.message


def _pack(address: pb.Address) -> any_pb2.Any:
    return any_pb2.Any(type_url=A, value=address.SerializeToString())


# Both sides joined in memory.


def _exchange(server: ServerSession, client: ClientSession, state: WorkloadState, table: AddressTable) -> None:
    """Open a stream: the client's initial requests in, the server's responses applied and ACKed."""
    for request in client.initial_requests():
        for response in server.receive(request, table.current).responses:
            _deliver(server, client, state, table, response)


def _deliver(
    server: ServerSession,
    client: ClientSession,
    state: WorkloadState,
    table: AddressTable,
    response: dpb.DeltaDiscoveryResponse,
) -> None:
    update = client.apply(response)
    for _, value in update.upserts:
        if isinstance(value, Workload):
            state.upsert_workload(value)
        elif isinstance(value, Service):
            state.upsert_service(value)
    for name in update.removals:
        state.remove_workload(name) or state.remove_service(name)
    assert server.receive(update.reply, table.current).kind is RequestKind.ACK


def test_a_client_and_server_pair_stays_in_sync_across_changes_and_a_server_restart() -> None:
    table, client, state = _table(WEB1, WEB2, SVC), _client(), WorkloadState()
    server = ServerSession()
    _exchange(server, client, state, table)
    assert state.find_workload(WEB2.uid) == WEB2 and state.services() == [SVC]

    changed = table.replace(addresses(_config(WEB1, SVC, DB)))
    for response in server.push(A, table.current, changed).responses:
        _deliver(server, client, state, table, response)
    assert state.find_workload(WEB2.uid) is None and state.find_workload(DB.uid) == DB

    # A restarted control plane: a fresh session and table; the client keeps its state and resyncs.
    restarted = _table(WEB1, DB, _pod("web-3", "198.18.200.4"))
    fresh = ServerSession(prefix="r")
    (resync,) = fresh.receive(client.initial_requests()[0], restarted.current).responses
    assert _names(resync) == ["Kubernetes//Pod/shop/web-3"] and list(resync.removed_resources) == [SVC.key]
    _deliver(fresh, client, state, restarted, resync)
    assert state.services() == [] and state.find_workload("Kubernetes//Pod/shop/web-3") is not None


def test_a_client_holding_too_many_resources_to_name_reopens_without_versions_and_drops_what_is_gone() -> None:
    """Rule 5 of the client: 20,000 held workloads make an opening request of ~1 MiB (over a limit of 768 KiB,
    ours before): the client opens without versions, gets the whole state, and removes what the server no longer
    has. With the default limit (under our server's 16 MiB) the same client names them all."""
    pods = [_pod(f"p-{i:05d}", f"198.18.{i // 250}.{i % 250 + 1}") for i in range(20_000)]
    table, client, state = _table(*pods, SVC), _client(max_initial_request=768 * 1024), WorkloadState()
    _exchange(ServerSession(), client, state, table)
    assert len(client.held(A)) == 20_001
    default = _client()
    _exchange(ServerSession(), default, WorkloadState(), table)
    (named,) = default.initial_requests()
    assert len(named.initial_resource_versions) == 20_001 and 768 * 1024 < named.ByteSize() <= MAX_INITIAL_REQUEST_BYTES
    (in_sync,) = ServerSession().receive(named, table.current).responses
    assert not in_sync.resources and not in_sync.removed_resources  # nothing resent to a client in sync

    (request,) = client.initial_requests()
    assert request.ByteSize() <= 768 * 1024
    assert dict(request.initial_resource_versions) == {} and client.resyncing == (A,)

    # Meanwhile the control plane restarted without the Service and two pods, and with one new pod.
    gone = {pods[0].uid, pods[7].uid, SVC.key}
    new = _pod("late", "198.19.0.1")
    restarted = _table(*[p for p in pods if p.uid not in gone], new)
    fresh = ServerSession(prefix="r")
    (resync,) = fresh.receive(request, restarted.current).responses
    _deliver(fresh, client, state, restarted, resync)
    assert client.resyncing == ()
    assert set(client.held(A)) == {p.uid for p in pods if p.uid not in gone} | {new.uid}
    assert state.services() == [] and state.find_workload(pods[0].uid) is None and state.find_workload(new.uid) == new
    assert state.find_workload(pods[1].uid) == pods[1]

    # Fewer resources again: the next opening names them.
    small = _client()
    _exchange(ServerSession(), small, WorkloadState(), _table(WEB1, SVC))
    (reopen,) = small.initial_requests()
    assert set(reopen.initial_resource_versions) == {WEB1.uid, SVC.key} and small.resyncing == ()


# On demand: client session rule 6, server session rules 3 and 9.


def test_an_on_demand_pair_answers_each_demand_and_follows_what_was_asked_across_a_restart() -> None:
    web1, web2 = _endpoint(WEB1), _endpoint(WEB2)
    table, client, state = _table(web1, web2, DB, SVC), _client(on_demand=True), WorkloadState()
    server = ServerSession()
    _exchange(server, client, state, table)
    assert state.workloads() == [] and client.synced  # subscribed to nothing, in sync

    request = client.demand(A, ["/198.18.210.1", "/198.18.250.9", "/198.18.210.1"])
    assert request is not None and list(request.resource_names_subscribe) == ["/198.18.210.1", "/198.18.250.9"]
    assert client.pending(A) == {"/198.18.210.1", "/198.18.250.9"}
    assert client.demand(A, ["/198.18.210.1"]) is None  # asked already: nothing more to send
    (answer,) = server.receive(request, table.current).responses
    update = client.apply(answer)
    assert update.answered == {"/198.18.210.1", "/198.18.250.9"} and client.pending(A) == frozenset()
    assert server.receive(update.reply, table.current).kind is RequestKind.ACK
    for _, value in update.upserts:
        state.upsert_workload(value) if isinstance(value, Workload) else state.upsert_service(value)  # type: ignore[arg-type]
    assert {w.uid for w in state.workloads()} == {WEB1.uid, WEB2.uid} and state.services() == [SVC]

    # Server rule 3: a pod that becomes an endpoint of the Service looked up is pushed too; db-1 never.
    web3 = _endpoint(_pod("web-3", "198.18.200.4"))
    changed = table.replace(addresses(_config(web1, web2, web3, replace(DB, node="node-b"), SVC)))
    (push,) = server.push(A, table.current, changed).responses
    assert _names(push) == [web3.uid]
    _deliver(server, client, state, table, push)

    # A restarted control plane: the opening request subscribes to what was asked again, so changes still come.
    (reopen,) = client.initial_requests()
    assert list(reopen.resource_names_subscribe) == ["*", "/198.18.210.1", "/198.18.250.9"]
    assert list(reopen.resource_names_unsubscribe) == ["*"]
    fresh = ServerSession(prefix="r")
    restarted = _table(web1, web2, web3, _pod("db-2", "198.18.200.9"), SVC)
    (resync,) = fresh.receive(reopen, restarted.current).responses
    assert _names(resync) == [] and not resync.removed_resources  # held at the same versions
    _deliver(fresh, client, state, restarted, resync)
    moved = replace(web2, node="node-c")
    changed = restarted.replace(addresses(_config(web1, moved, web3, _pod("db-2", "198.18.200.9", "b"), SVC)))
    (push,) = fresh.push(A, restarted.current, changed).responses
    assert _names(push) == [WEB2.uid]


def test_a_demand_made_while_disconnected_is_answered_by_the_next_opening() -> None:
    table, client = _table(WEB1), _client(on_demand=True)
    _exchange(ServerSession(), client, WorkloadState(), table)
    assert client.demand(A, ["/198.18.200.1"]) is not None  # the stream broke before it was written
    (reopen,) = client.initial_requests()
    assert "/198.18.200.1" in reopen.resource_names_subscribe
    (opening,) = ServerSession(prefix="r").receive(reopen, table.current).responses
    update = client.apply(opening)
    assert update.answered == {"/198.18.200.1"} and [name for name, _ in update.upserts] == [WEB1.uid]


def test_a_wildcard_client_demands_nothing_and_the_demanded_names_are_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _client().demand(A, ["/198.18.200.1"]) is None
    monkeypatch.setattr(client_session, "MAX_DEMANDED", 3)
    client = _client(on_demand=True)
    first = client.demand(A, ["/a", "/b"])
    assert first is not None and list(first.resource_names_subscribe) == ["/a", "/b"]
    second = client.demand(A, ["/c", "/d", "/e"])
    assert second is not None and list(second.resource_names_subscribe) == ["/c"]
    assert client.demand(A, ["/f"]) is None and client.pending(A) == {"/a", "/b", "/c"}


def test_the_server_answers_names_beyond_its_bound_as_absent_and_does_not_keep_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(session_module, "MAX_NAMES", 3)  # each alias asked for and the workload it found count
    table = _table(WEB1, WEB2, DB)
    server = _on_demand(table)
    (answer,) = server.receive(
        _request(subscribe=["/198.18.200.1", "/198.18.200.2", "/198.18.200.3"]), table.current
    ).responses
    assert sorted(_names(answer)) == sorted([WEB1.uid, WEB2.uid])
    assert list(answer.removed_resources) == ["/198.18.200.3"]
    changed = table.replace(addresses(_config(WEB1, WEB2, replace(DB, node="node-b"))))
    assert server.push(A, table.current, changed).responses == ()  # db-1 was never kept

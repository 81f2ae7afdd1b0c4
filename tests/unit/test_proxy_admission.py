"""Connection admission at the listeners (:mod:`ambit.proxy.admission`): the rules, table by table, and a
hypothesis run that the counts always match the tickets held."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.proxy.admission import (
    AdmissionSettingsError,
    ListenerGate,
    ListenerLimits,
    NodeBudget,
    Refusal,
    RefusalLog,
    Ticket,
    refusal_reporter,
)


def gate(
    *,
    connections: int = 8,
    pending: int = 4,
    per_peer: int = 2,
    budget: NodeBudget | None = None,
    handshake: bool = True,
) -> ListenerGate:
    limits = ListenerLimits(max_connections=connections, max_pending=pending, max_pending_per_peer=per_peer)
    return ListenerGate("hbone", limits, budget or NodeBudget(1000, 100), handshake=handshake)


def admitted(result: Ticket | Refusal) -> Ticket:
    assert isinstance(result, Ticket), result
    return result


def test_one_peer_gets_at_most_its_pending_handshakes_and_another_peer_still_gets_in() -> None:
    g = gate()
    first = [admitted(g.admit("10.0.0.1")) for _ in range(2)]
    assert g.admit("10.0.0.1") is Refusal.PEER_PENDING
    admitted(g.admit("10.0.0.2"))
    first[0].established()  # its handshake is done: no longer counted against the peer's pending handshakes
    admitted(g.admit("10.0.0.1"))


def test_the_listener_s_pending_bound_refuses_every_peer_until_a_handshake_ends() -> None:
    g = gate(pending=4, per_peer=1)
    tickets = [admitted(g.admit(f"10.0.0.{i}")) for i in range(4)]
    assert g.admit("10.0.0.99") is Refusal.PENDING
    tickets[1].release()  # a handshake that failed or timed out frees its place
    admitted(g.admit("10.0.0.99"))


def test_a_newcomer_evicts_the_oldest_handshake_when_the_listener_s_are_all_taken() -> None:
    seen: list[tuple[str, Refusal]] = []
    g = gate(pending=4, per_peer=1, budget=NodeBudget(100, 10, lambda kind, reason: seen.append((kind, reason))))
    closed: list[int] = []
    tickets = []
    for i in range(4):
        ticket = admitted(g.admit(f"10.0.0.{i}"))
        ticket.on_evict(lambda i=i: closed.append(i))
        tickets.append(ticket)
    tickets[0].established()  # no longer pending: never evicted
    admitted(g.admit("10.0.0.98")).on_evict(lambda: closed.append(98))
    newcomer = admitted(g.admit("10.0.0.99"))
    assert closed == [1]  # the oldest still in its handshake
    assert not tickets[1].pending and g.pending == 4 and "10.0.0.1" not in g.pending_by_peer
    assert seen == [("hbone", Refusal.EVICTED)]
    tickets[1].release()  # the evicted connection's task ends later: nothing more is given back
    assert (g.connections, g.budget.connections) == (5, 5)
    assert newcomer.pending


def test_the_process_s_pending_bound_evicts_the_oldest_handshake_of_any_listener() -> None:
    budget = NodeBudget(max_connections=100, max_pending=2)
    one, two = gate(budget=budget), gate(budget=budget)
    closed: list[str] = []
    admitted(one.admit("a")).on_evict(lambda: closed.append("a"))
    admitted(two.admit("b")).on_evict(lambda: closed.append("b"))
    admitted(two.admit("c"))
    assert closed == ["a"] and (one.pending, two.pending, budget.pending) == (0, 2, 2)


def test_one_peer_holds_at_most_its_share_of_the_process_over_every_listener() -> None:
    budget = NodeBudget(max_connections=100, max_pending=50, max_connections_per_peer=3)
    one, two = gate(budget=budget), gate(budget=budget, handshake=False)
    held = [admitted(one.admit("p")), admitted(two.admit("p"))]
    held[0].established()
    held.append(admitted(one.admit("p")))
    assert one.admit("p") is Refusal.NODE_PEER_CONNECTIONS
    assert two.admit("p") is Refusal.NODE_PEER_CONNECTIONS
    admitted(two.admit("q"))  # another address has its own share
    held[0].release()
    admitted(two.admit("p"))
    assert budget.by_peer == {"p": 3, "q": 1}


def test_established_connections_keep_their_places_and_bound_new_ones() -> None:
    g = gate(connections=3, pending=3, per_peer=3)
    for _ in range(3):
        admitted(g.admit("10.0.0.1")).established()
    assert (g.connections, g.pending) == (3, 0)
    assert g.admit("10.0.0.2") is Refusal.CONNECTIONS


def test_a_handshake_that_completes_always_has_its_place() -> None:
    g = gate(connections=2, pending=2, per_peer=2)
    a, b = admitted(g.admit("p")), admitted(g.admit("p"))
    a.established()
    b.established()
    assert (g.connections, g.pending, g.pending_by_peer) == (2, 0, {})


def test_the_node_budget_is_shared_by_every_listener() -> None:
    budget = NodeBudget(max_connections=4, max_pending=2)
    one, two = gate(budget=budget), gate(budget=budget)
    admitted(one.admit("a"))
    admitted(two.admit("b"))
    assert one.admit("c") is Refusal.NODE_PENDING  # two handshakes in progress in the process
    plain = gate(budget=budget, handshake=False)
    admitted(plain.admit("d"))
    admitted(plain.admit("d"))
    assert budget.connections == 4
    assert two.admit("e") is Refusal.NODE_CONNECTIONS  # its own bounds are far away: the process's is reached


def test_a_listener_without_a_handshake_bounds_connections_only() -> None:
    g = gate(connections=2, pending=1, per_peer=1, handshake=False)
    a = admitted(g.admit("p"))
    admitted(g.admit("p"))  # the per-peer pending bound does not apply
    assert not a.pending and g.pending == 0
    assert g.admit("p") is Refusal.CONNECTIONS


def test_release_is_idempotent_from_either_state_and_established_after_release_does_nothing() -> None:
    budget = NodeBudget(10, 5)
    g = gate(budget=budget)
    pending, established = admitted(g.admit("p")), admitted(g.admit("q"))
    established.established()
    for ticket in (pending, established):
        ticket.release()
        ticket.release()
        ticket.established()
    assert (g.connections, g.pending, g.pending_by_peer, budget.connections, budget.pending) == (0, 0, {}, 0, 0)


@pytest.mark.parametrize(
    ("connections", "pending", "per_peer", "timeout"),
    [(0, 1, 1, 10.0), (4, 8, 1, 10.0), (8, 4, 5, 10.0), (8, 4, 2, 0.0), (8, 4, 2, float("inf")), (8, 0, 1, 1.0)],
)
def test_limits_that_cannot_work_are_refused_with_a_clear_error(
    connections: int, pending: int, per_peer: int, timeout: float
) -> None:
    with pytest.raises(AdmissionSettingsError):
        ListenerLimits(connections, pending, per_peer, timeout)


def test_a_node_budget_that_cannot_hold_its_pending_handshakes_is_refused() -> None:
    with pytest.raises(AdmissionSettingsError):
        NodeBudget(max_connections=4, max_pending=8)
    with pytest.raises(AdmissionSettingsError):
        NodeBudget(max_connections=4, max_pending=2, max_connections_per_peer=5)


def test_every_refusal_is_reported_with_the_listener_and_the_reason() -> None:
    seen: list[tuple[str, Refusal]] = []
    g = gate(per_peer=1, budget=NodeBudget(100, 10, lambda kind, reason: seen.append((kind, reason))))
    admitted(g.admit("p"))
    g.admit("p")
    g.admit("p")
    assert seen == [("hbone", Refusal.PEER_PENDING)] * 2


def test_the_refusal_log_says_one_line_per_interval_with_the_count_held_back() -> None:
    log = RefusalLog(interval=10.0)
    assert log.note("hbone", Refusal.PENDING, 100.0) == 1
    assert [log.note("hbone", Refusal.PENDING, 100.0 + i) for i in range(1, 6)] == [0] * 5
    assert log.note("hbone", Refusal.PEER_PENDING, 101.0) == 1  # another reason has its own line
    assert log.note("hbone", Refusal.PENDING, 110.0) == 6


def test_the_reporter_counts_every_refusal_and_logs_at_a_bounded_rate(caplog: pytest.LogCaptureFixture) -> None:
    counted: list[tuple[str, str]] = []
    now = [0.0]
    logger = logging.getLogger("tests.admission")
    report = refusal_reporter(lambda kind, reason: counted.append((kind, reason)), lambda: now[0], logger)
    with caplog.at_level(logging.WARNING, logger="tests.admission"):
        for i in range(1000):
            now[0] = i * 0.01  # 10 s of refusals
            report("hbone", Refusal.PEER_PENDING)
    assert len(counted) == 1000 and counted[0] == ("hbone", "peer_pending")
    lines = [r.getMessage() for r in caplog.records]
    assert 1 <= len(lines) <= 2, lines
    assert "refused or evicted 1 connection(s) (peer_pending)" in lines[0]


@given(
    st.lists(
        st.tuples(st.sampled_from(["admit", "establish", "release"]), st.integers(0, 5), st.integers(0, 30)),
        max_size=200,
    )
)
def test_counts_always_match_the_tickets_held_and_never_exceed_the_bounds(
    steps: list[tuple[str, int, int]],
) -> None:
    budget = NodeBudget(max_connections=12, max_pending=6)
    gates = [gate(connections=8, pending=4, per_peer=2, budget=budget) for _ in range(2)]
    held: list[tuple[int, str, Ticket]] = []

    def evicted(ticket: Ticket) -> None:
        assert not ticket.pending
        held[:] = [entry for entry in held if entry[2] is not ticket]

    for action, peer, index in steps:
        which = index % 2
        if action == "admit":
            result = gates[which].admit(f"10.0.0.{peer}")
            if isinstance(result, Ticket):
                held.append((which, f"10.0.0.{peer}", result))
                if index % 3:  # most can be evicted; some cannot (their newcomers are refused instead)
                    result.on_evict(lambda ticket=result: evicted(ticket))
        elif held:
            _, _, ticket = held[index % len(held)]
            if action == "establish":
                ticket.established()
            else:
                ticket.release()
                held.remove(held[index % len(held)])
        for number, g in enumerate(gates):
            mine = [(p, t) for w, p, t in held if w == number]
            pending = [p for p, t in mine if t.pending]
            assert g.connections == len(mine) <= 8
            assert g.pending == len(pending) <= 4
            assert g.pending_by_peer == {p: pending.count(p) for p in set(pending)}
            assert all(n <= 2 for n in g.pending_by_peer.values())
        assert budget.connections == len(held) <= 12
        peers = [p for _, p, _ in held]
        assert budget.by_peer == {p: peers.count(p) for p in set(peers)}
        assert budget.pending == sum(t.pending for _, _, t in held) <= 6

"""SPIFFE ids: strict parsing, rendering, ordering, and workload identities with proto3 defaults."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.errors import AmbitError
from ambit.model.identity import DEFAULT_TRUST_DOMAIN, IdentityError, SpiffeId
from ambit.model.workload import IDENTITIES_CACHED, Workload, _identity

trust_domains = st.from_regex(r"[a-z0-9._-]{1,40}", fullmatch=True)
segments = st.from_regex(r"[A-Za-z0-9._-]{1,40}", fullmatch=True).filter(lambda s: s not in {".", ".."})
spiffe_ids = st.builds(SpiffeId, trust_domains, segments, segments)


def test_a_well_formed_id_parses_into_its_parts() -> None:
    parsed = SpiffeId.parse("spiffe://cluster.local/ns/apps/sa/web")
    assert parsed == SpiffeId("cluster.local", "apps", "web")
    assert parsed.trust_domain == "cluster.local"
    assert parsed.namespace == "apps"
    assert parsed.service_account == "web"


def test_an_id_renders_as_its_uri() -> None:
    assert str(SpiffeId("td.example", "ns-1", "sa_2")) == "spiffe://td.example/ns/ns-1/sa/sa_2"


def test_ids_sort_by_trust_domain_then_namespace_then_service_account() -> None:
    ids = [SpiffeId("b", "a", "a"), SpiffeId("a", "b", "a"), SpiffeId("a", "a", "b"), SpiffeId("a", "a", "a")]
    assert sorted(ids) == [ids[3], ids[2], ids[1], ids[0]]


def test_ids_are_hashable_values() -> None:
    assert len({SpiffeId("a", "b", "c"), SpiffeId.parse("spiffe://a/ns/b/sa/c")}) == 1


def test_the_default_trust_domain_is_cluster_local() -> None:
    assert DEFAULT_TRUST_DOMAIN == "cluster.local"


def test_identity_error_is_an_ambit_error() -> None:
    assert issubclass(IdentityError, AmbitError)


@pytest.mark.parametrize(
    "uri",
    [
        "",
        "spiffe://",
        "spiffe://cluster.local",
        "spiffe://cluster.local/",
        "spiffe://cluster.local/ns/apps",
        "spiffe://cluster.local/ns/apps/sa",
        "spiffe://cluster.local/ns/apps/sa/",
        "spiffe://cluster.local/ns//sa/web",
        "spiffe:///ns/apps/sa/web",
        "spiffe://cluster.local/ns/apps/sa/web/",
        "spiffe://cluster.local/ns/apps/sa/web/extra",
        "spiffe://cluster.local/sa/web/ns/apps",
        "spiffe://cluster.local/NS/apps/sa/web",
        "spiffe://cluster.local//ns/apps/sa/web",
        "SPIFFE://cluster.local/ns/apps/sa/web",
        "https://cluster.local/ns/apps/sa/web",
        "spiffe:/cluster.local/ns/apps/sa/web",
        "cluster.local/ns/apps/sa/web",
        " spiffe://cluster.local/ns/apps/sa/web",
        "spiffe://cluster.local/ns/apps/sa/web ",
        "spiffe://cluster.local/ns/apps/sa/web?x=1",
        "spiffe://cluster.local/ns/apps/sa/web#frag",
        "spiffe://cluster.local:8080/ns/apps/sa/web",
        "spiffe://user@cluster.local/ns/apps/sa/web",
        "spiffe://Cluster.Local/ns/apps/sa/web",
        "spiffe://cluster.local/ns/a%2Fb/sa/web",
        "spiffe://cluster.local/ns/./sa/web",
        "spiffe://cluster.local/ns/apps/sa/..",
        "spiffe://clüster.local/ns/apps/sa/web",
        "spiffe://cluster.local/ns/apps/sa/wéb",
        "spiffe://cluster.local/ns/ap ps/sa/web",
        "spiffe://cluster.local/ns/apps/sa/web\n",
        "spiffe://" + "a" * 256 + "/ns/apps/sa/web",
        "spiffe://cluster.local/ns/apps/sa/" + "w" * 2100,
    ],
)
def test_malformed_ids_are_rejected(uri: str) -> None:
    with pytest.raises(IdentityError):
        SpiffeId.parse(uri)


def test_a_non_string_is_rejected_with_an_identity_error() -> None:
    with pytest.raises(IdentityError, match="must be a string"):
        SpiffeId.parse(b"spiffe://a/ns/b/sa/c")  # type: ignore[arg-type]


def test_the_error_message_names_the_bad_part_and_the_input() -> None:
    with pytest.raises(IdentityError, match=r"namespace 'a b'.*spiffe://td/ns/a b/sa/c"):
        SpiffeId.parse("spiffe://td/ns/a b/sa/c")


def test_constructing_an_id_with_a_bad_part_is_rejected_too() -> None:
    with pytest.raises(IdentityError, match="service account is empty"):
        SpiffeId("cluster.local", "apps", "")
    with pytest.raises(IdentityError, match="trust domain"):
        SpiffeId("Bad/Domain", "apps", "web")


def test_a_workload_identity_uses_its_trust_domain_namespace_and_service_account() -> None:
    workload = Workload(
        "uid", "web-0", "apps", (ipaddress.ip_address("198.18.1.5"),), trust_domain="td", service_account="web"
    )
    assert workload.identity == SpiffeId("td", "apps", "web")


def test_a_workload_with_empty_proto3_defaults_gets_the_mesh_defaults() -> None:
    workload = Workload("uid", "web-0", "apps", (), trust_domain="", service_account="")
    assert str(workload.identity) == "spiffe://cluster.local/ns/apps/sa/default"


def test_workloads_of_one_identity_share_one_checked_id() -> None:
    first = Workload("uid-1", "web-0", "apps", (), trust_domain="td", service_account="web")
    second = Workload("uid-2", "web-1", "apps", (), trust_domain="td", service_account="web")
    assert first.identity is second.identity  # made and checked once, not per connection
    assert first.identity == SpiffeId("td", "apps", "web")


def test_a_workload_whose_parts_make_no_id_raises_each_time() -> None:
    workload = Workload("uid", "web-0", "Bad Namespace", (), trust_domain="td", service_account="web")
    for _ in range(2):  # nothing cached for it
        with pytest.raises(IdentityError):
            _ = workload.identity


def test_the_workload_identity_cache_is_bounded() -> None:
    for i in range(IDENTITIES_CACHED + 100):
        workload = Workload(f"uid-{i}", "web-0", f"ns-{i}", (), trust_domain="td", service_account="web")
        assert workload.identity == SpiffeId("td", f"ns-{i}", "web")
    assert _identity.cache_info().currsize <= IDENTITIES_CACHED


@given(spiffe_ids)
def test_every_id_round_trips_through_its_string(spiffe_id: SpiffeId) -> None:
    assert SpiffeId.parse(str(spiffe_id)) == spiffe_id


@given(st.text())
def test_random_text_either_parses_or_raises_identity_error(text: str) -> None:
    try:
        parsed = SpiffeId.parse(text)
    except IdentityError:
        return
    assert str(parsed) == text


@given(trust_domains, segments, segments, st.sampled_from("/?#%@: \t\x00é"), st.integers(0, 200))
def test_ids_with_a_stray_character_anywhere_are_rejected(td: str, ns: str, sa: str, char: str, at: int) -> None:
    uri = str(SpiffeId(td, ns, sa))
    at = len("spiffe://") + at % (len(uri) - len("spiffe://") + 1)
    with pytest.raises(IdentityError):
        SpiffeId.parse(uri[:at] + char + uri[at:])


@given(st.binary())
def test_random_bytes_decoded_either_parse_or_raise_identity_error(data: bytes) -> None:
    uri = "spiffe://" + data.decode("utf-8", errors="replace")
    try:
        parsed = SpiffeId.parse(uri)
    except IdentityError:
        return
    assert str(parsed) == uri

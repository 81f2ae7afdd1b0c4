"""A ResourceSet updated by changes equals one built from scratch over the result (issue 22: tables are updated
per change instead of rebuilt), aliases and members included; the set it came from is left as it was."""

from __future__ import annotations

import pytest
from google.protobuf import any_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from ambit.xds.resource_set import EMPTY, ResourceSet, XdsResource

NAMES = st.sampled_from([f"r{i}" for i in range(6)])
KEYS = st.lists(st.sampled_from(["a", "b", "c", "r0", "r1"]), max_size=3, unique=True).map(tuple)
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), NAMES, st.integers(0, 3), KEYS, KEYS),
        st.tuples(st.just("remove"), NAMES, st.just(0), st.just(()), st.just(())),
    ),
    max_size=25,
)


def _resource(name: str, version: int, aliases: tuple[str, ...], parents: tuple[str, ...]) -> XdsResource:
    return XdsResource.built(name, str(version), any_pb2.Any(type_url="t", value=name.encode()), aliases, parents)


@settings(max_examples=200, deadline=None)
@given(STEPS)
def test_an_updated_set_equals_one_built_over_the_same_resources(
    steps: list[tuple[str, str, int, tuple[str, ...], tuple[str, ...]]],
) -> None:
    current, truth = EMPTY, {}
    for kind, name, version, aliases, parents in steps:
        previous, before = current, (dict(current.by_name), dict(current.by_alias), dict(current.members))
        if kind == "put":
            resource = _resource(name, version, aliases, parents)
            truth[name] = resource
            current = current.updated([resource], ())
        else:
            truth.pop(name, None)
            current = current.updated((), [name])
        built = ResourceSet.build(truth.values())
        assert dict(current.by_name) == dict(built.by_name)
        assert dict(current.by_alias) == dict(built.by_alias)
        assert dict(current.members) == dict(built.members)
        for held in truth:
            assert current.lookup(held) == built.lookup(held)
        assert (dict(previous.by_name), dict(previous.by_alias), dict(previous.members)) == before
    assert dict(EMPTY.by_name) == {} and dict(EMPTY.by_alias) == {}


def test_a_built_resource_keeps_its_encoding_and_reads_as_the_one_made_from_its_body() -> None:
    body = any_pb2.Any(type_url="t", value=b"address")
    built = XdsResource.built("a", "1", body, ("/10.0.0.1",), ("ns/svc",))
    plain = XdsResource("a", "1", body, ("/10.0.0.1",), ("ns/svc",))
    assert built == plain and plain == built and hash(built) == hash(plain)
    assert built.body == body and built.to_wire() == plain.to_wire()
    assert built.wire == plain.wire == plain.to_wire().SerializeToString()
    assert built != XdsResource.built("a", "1", body, ("/10.0.0.1",), ("ns/other",))
    assert built != XdsResource.built("a", "1", any_pb2.Any(type_url="t", value=b"other"), ("/10.0.0.1",))
    with pytest.raises(AttributeError):
        built.version = "2"  # type: ignore[misc]

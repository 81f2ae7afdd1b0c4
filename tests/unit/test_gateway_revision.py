"""Which Gateways a control plane revision controls (ambit.controlplane.gateway.revision): the rules as a table,
and a hypothesis property over hostile metadata."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.controlplane.gateway.revision import gateway_revision, is_ours, our_revisions


def obj(labels: Any = None) -> dict[str, Any]:
    return {"metadata": {"name": "x", "labels": labels}} if labels is not None else {"metadata": {"name": "x"}}


@pytest.mark.parametrize(
    ("gateway_labels", "namespace", "revision", "expected"),
    [
        (None, obj(), "default", True),
        (None, obj({"istio.io/rev": "foo"}), "default", False),
        (None, obj({"istio.io/rev": "foo"}), "foo", True),
        ({"istio.io/rev": "foo"}, obj(), "default", False),
        ({"istio.io/rev": "foo"}, obj(), "", False),
        ({"istio.io/rev": "default"}, obj({"istio.io/rev": "foo"}), "default", True),
        ({"istio.io/rev": ""}, obj({"istio.io/rev": "foo"}), "default", True),
        (None, None, "default", True),
        (None, None, "foo", True),
        ({"istio.io/rev": "foo"}, None, "default", False),
        (None, obj(), "foo", False),
        ({"istio.io/rev": "default"}, obj(), "foo", False),
        (None, obj(), "", True),
    ],
    ids=[
        "unlabelled",
        "namespace-other",
        "namespace-ours",
        "gateway-other",
        "gateway-other-empty-revision",
        "gateway-label-wins",
        "empty-label-is-default",
        "namespace-unknown",
        "namespace-unknown-other-revision",
        "gateway-other-namespace-unknown",
        "unlabelled-is-not-a-named-revisions",
        "default-is-not-a-named-revisions",
        "empty-revision-is-default",
    ],
)
def test_a_gateway_is_ours_by_its_label_else_its_namespace_s(
    gateway_labels: Any, namespace: Any, revision: str, expected: bool
) -> None:
    assert is_ours(obj(gateway_labels), namespace, revision) is expected


def test_our_revisions_are_the_revision_and_default_only_for_default() -> None:
    assert our_revisions("") == our_revisions("default") == {"default"}
    assert our_revisions("canary") == {"canary"}


JUNK = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=3),
    max_leaves=8,
)
METADATA = st.fixed_dictionaries(
    {},
    optional={
        "metadata": st.fixed_dictionaries(
            {}, optional={"labels": st.dictionaries(st.sampled_from(["istio.io/rev", "app"]), JUNK) | JUNK}
        )
        | JUNK
    },
)


@given(METADATA, st.none() | METADATA, st.sampled_from(["default", "", "foo"]))
def test_hostile_metadata_never_raises_and_the_answer_follows_the_revision(
    gateway: dict[str, Any], namespace: dict[str, Any] | None, revision: str
) -> None:
    chosen = gateway_revision(gateway, namespace)
    assert is_ours(gateway, namespace, revision) is (chosen is None or chosen in our_revisions(revision))
    assert chosen is None or chosen != ""

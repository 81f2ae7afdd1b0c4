"""istioctl's boolean flag spellings (ambit.cli.istioctl_args): table tests and a hypothesis property."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.cli.istioctl_args import FALSE_WORDS, TRUE_WORDS, BoolFlagError, read_bool_flags

FLAGS = {"--wait": "--wait", "-w": "--wait", "--enroll-namespace": "--enroll-namespace", "-A": "--all-namespaces"}


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["apply", "--wait"], ["apply", "--wait"]),
        (["apply", "--enroll-namespace", "true", "--wait"], ["apply", "--enroll-namespace", "--wait"]),
        (["apply", "--enroll-namespace", "false"], ["apply", "--no-enroll-namespace"]),
        (["apply", "--enroll-namespace=false", "-w"], ["apply", "--no-enroll-namespace", "--wait"]),
        (["apply", "--wait=T", "-w=0"], ["apply", "--wait", "--no-wait"]),
        (["list", "-A=true"], ["list", "--all-namespaces"]),
        (["delete", "-w", "w1", "true"], ["delete", "--wait", "w1", "true"]),
        (["apply", "--name", "true"], ["apply", "--name", "true"]),
        (["apply", "--wait", "TRUE"], ["apply", "--wait", "TRUE"]),
        (["apply", "--", "--wait=false", "true"], ["apply", "--", "--wait=false", "true"]),
        (["apply", "--wait", "--", "true"], ["apply", "--wait", "--", "true"]),
        (["apply", "--other=false"], ["apply", "--other=false"]),
    ],
    ids=[
        "alone",
        "following-true",
        "following-false",
        "equals-false",
        "go-words",
        "short-equals",
        "not-following",
        "not-a-bool-flag",
        "only-lower-case-following",
        "after-double-dash",
        "double-dash-after-flag",
        "unknown-flag",
    ],
)
def test_istioctl_bool_spellings_become_click_flags(args: list[str], expected: list[str]) -> None:
    assert read_bool_flags(args, FLAGS) == expected


def test_a_bool_flag_with_a_value_that_is_not_a_bool_is_refused_with_the_flag_named() -> None:
    with pytest.raises(BoolFlagError, match="invalid argument 'soon' for '--wait' flag: expected true or false"):
        read_bool_flags(["apply", "--wait=soon"], FLAGS)


WORDS = st.sampled_from(
    ["--wait", "-w", "--enroll-namespace", "-A", "true", "false", "--", "w1", "--name", "-n", "ns", "--wait="]
    + [f"--wait={w}" for w in sorted(TRUE_WORDS | FALSE_WORDS)]
) | st.text(max_size=12)


OURS = {"--wait", "--no-wait", "--enroll-namespace", "--no-enroll-namespace", "--all-namespaces", "--no-all-namespaces"}


@given(st.lists(WORDS, max_size=12))
def test_reading_is_total_and_only_rewrites_bool_flags(args: list[str]) -> None:
    try:
        out = read_bool_flags(args, FLAGS)
    except BoolFlagError as exc:
        assert "expected true or false" in str(exc)
        return
    cut = args.index("--") if "--" in args else len(args)
    # After "--" nothing changes.
    assert out[len(out) - (len(args) - cut) :] == args[cut:]
    before, out_before = args[:cut], out[: len(out) - (len(args) - cut)]
    # Before it, every word that is neither one of our flags nor a true/false word survives, in order.
    assert [w for w in out_before if w not in OURS | {"true", "false"}] == [
        w for w in before if w.partition("=")[0] not in FLAGS and w not in {"true", "false"}
    ]
    assert len(out) <= len(args)

"""The runc shell's own decisions (:mod:`ambit.lab.runtime.oci_apply`) without running runc: a missing runc, runc's
error log, missing cgroup controllers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambit.lab.cluster.lifecycle import LabError, LabSettings, lab_up
from ambit.lab.runtime.oci_apply import (
    RuncMissingError,
    error_reason,
    find_runc,
    runc_error,
    unavailable_controllers,
)


def test_a_missing_runc_is_a_clear_error_naming_the_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuncMissingError, match=r"apt-get install runc"):
        find_runc()


def test_lab_up_without_runc_fails_before_making_anything(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    with pytest.raises(LabError, match="runc is not installed"):
        lab_up(LabSettings(tmp_path / "lab"))
    assert not (tmp_path / "lab").exists()


def test_runc_s_last_error_is_found_among_other_lines(tmp_path: Path) -> None:
    log = tmp_path / "runc.log"
    lines = [
        json.dumps({"level": "warning", "msg": "cgroup: a warning"}),
        "not json at all",
        json.dumps({"level": "error", "msg": 'runc run failed: unable to start container process: exec: "x"'}),
        '{"level": "error", "msg": "torn',
    ]
    log.write_text("\n".join(lines))
    message = runc_error(log)
    assert message == 'runc run failed: unable to start container process: exec: "x"'
    assert error_reason(message) == "RunContainerError"
    assert error_reason("runc run failed: cgroup: permission denied") == "CreateContainerError"
    assert runc_error(tmp_path / "missing.log") == ""


@given(st.lists(st.text(max_size=40), max_size=8))
def test_any_log_content_yields_a_message_or_nothing(lines: list[str]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        log = Path(directory) / "runc.log"
        log.write_text("\n".join(lines))
        assert isinstance(runc_error(log), str)


def test_controllers_without_a_hierarchy_are_reported_unavailable(tmp_path: Path) -> None:
    for name in ("memory", "pids"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "cgroup.procs").write_text("")
    assert unavailable_controllers(tmp_path) == frozenset({"cpu"})

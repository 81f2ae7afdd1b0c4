"""The lab share's two streams (tests/lab_streams.py): each module is taken by one stream only, whole, in the
stream's order; pytest is told the next test it will really run; the secondary stream never takes the modules that
make or sweep dead and orphaned labs."""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from tests import lab_streams

ROOT = Path("/repo")


@dataclass
class _Hook:
    ran: list[tuple[str, str | None]] = field(default_factory=list)

    def pytest_runtest_protocol(self, item: _Item, nextitem: _Item | None) -> None:
        self.ran.append((item.name, nextitem.name if nextitem is not None else None))


@dataclass
class _Config:
    hook: _Hook


@dataclass
class _Item:
    name: str
    path: Path
    config: _Config


@dataclass
class _Session:
    items: list[Any]
    shouldfail: bool = False
    shouldstop: bool = False


def _session(*names: str) -> tuple[_Session, _Hook]:
    """Items named ``<module>::<test>``; the module ``m`` lives at ``tests/e2e/m.py``."""
    hook = _Hook()
    config = _Config(hook)
    items = [_Item(name, ROOT / "tests" / "e2e" / f"{name.split('::')[0]}.py", config) for name in names]
    return _Session(items), hook


def test_a_module_is_taken_once(tmp_path: Path) -> None:
    queue = tmp_path / "queue"
    assert lab_streams.take(queue, "tests/e2e/a.py")
    assert not lab_streams.take(queue, "tests/e2e/a.py")
    assert lab_streams.take(queue, "tests/e2e/b.py")
    assert queue.read_text().splitlines() == ["tests/e2e/a.py", "tests/e2e/b.py"]


def _take_all(queue: Path, modules: list[str], out: Any) -> None:
    out.put([m for m in modules if lab_streams.take(queue, m)])


def test_streams_taking_at_once_share_the_modules_without_overlap(tmp_path: Path) -> None:
    queue = tmp_path / "queue"
    modules = [f"tests/e2e/m{i}.py" for i in range(200)]
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    workers = [context.Process(target=_take_all, args=(queue, modules, out)) for _ in range(4)]
    for worker in workers:
        worker.start()
    taken = [out.get(timeout=30) for _ in workers]
    for worker in workers:
        worker.join(timeout=30)
    flat = [m for part in taken for m in part]
    assert sorted(flat) == sorted(modules), "every module taken exactly once"


def test_the_stream_runs_whole_modules_it_took_and_names_the_next_test_it_really_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(lab_streams.STREAM_VARIABLE, raising=False)
    queue = tmp_path / "queue"
    assert lab_streams.take(queue, "tests/e2e/b.py")  # the other stream has b
    session, hook = _session("a::1", "a::2", "b::1", "b::2", "c::1", "d::1")
    lab_streams.run_from_queue(session, queue, ROOT)  # type: ignore[arg-type]
    assert hook.ran == [("a::1", "a::2"), ("a::2", "c::1"), ("c::1", "d::1"), ("d::1", None)]
    assert queue.read_text().splitlines() == ["tests/e2e/b.py", "tests/e2e/a.py", "tests/e2e/c.py", "tests/e2e/d.py"]


def test_a_stream_that_finds_every_module_taken_runs_nothing(tmp_path: Path) -> None:
    queue = tmp_path / "queue"
    for module in ("a", "b"):
        lab_streams.take(queue, f"tests/e2e/{module}.py")
    session, hook = _session("a::1", "b::1")
    lab_streams.run_from_queue(session, queue, ROOT)  # type: ignore[arg-type]
    assert hook.ran == []


def test_the_secondary_stream_leaves_the_primary_only_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(lab_streams.STREAM_VARIABLE, "secondary")
    monkeypatch.setenv(lab_streams.QUEUE_VARIABLE, str(tmp_path / "queue"))
    assert lab_streams.is_secondary()
    hook = _Hook()
    config = _Config(hook)
    sweep = ROOT / "tests" / "netns" / "test_dead_lab_sweep.py"
    session = _Session([_Item("a::1", ROOT / "tests" / "e2e" / "a.py", config), _Item("sweep::1", sweep, config)])
    lab_streams.run_from_queue(session, tmp_path / "queue", ROOT)  # type: ignore[arg-type]
    assert hook.ran == [("a::1", None)]
    assert "tests/netns/test_dead_lab_sweep.py" in lab_streams.PRIMARY_ONLY
    assert lab_streams.take(tmp_path / "queue", "tests/netns/test_dead_lab_sweep.py"), "left for the primary"


def test_the_secondary_stream_takes_modules_from_the_end_backwards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(lab_streams.STREAM_VARIABLE, "secondary")
    queue = tmp_path / "queue"
    assert lab_streams.take(queue, "tests/e2e/a.py")  # the primary has a
    session, hook = _session("a::1", "b::1", "b::2", "c::1", "c::2")
    lab_streams.run_from_queue(session, queue, ROOT)  # type: ignore[arg-type]
    assert hook.ran == [("c::1", "c::2"), ("c::2", "b::1"), ("b::1", "b::2"), ("b::2", None)]


def test_a_stream_name_other_than_the_two_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(lab_streams.STREAM_VARIABLE, "tertiary")
    with pytest.raises(pytest.UsageError, match="primary, secondary"):
        lab_streams.stream()

"""The fault suite's fixtures: root and kubectl (as tests/e2e), and the fault table printed at the end of the run.

Each fault test appends its row to :data:`tests.faults.report.ROWS`; the terminal summary
prints them as a table whatever the outcome, so a failed run still shows what each fault did.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from tests.e2e.lab_driver import release_shared_lab
from tests.faults.report import ROWS, markdown_table


@pytest.fixture(autouse=True, scope="session")
def _needs_root_and_kubectl() -> None:
    for what, ok in (("root (network namespaces)", os.geteuid() == 0), ("kubectl", shutil.which("kubectl"))):
        if not ok:
            if os.environ.get("CI"):
                pytest.fail(f"the fault suite needs {what}, and CI has it")
            pytest.skip(f"needs {what}")


@pytest.fixture(autouse=True, scope="session")
def _shared_lab_down() -> Iterator[None]:
    """The shared mesh lab, if a module here brought it up (test_rollout_soak.py), goes down with the session (as in
    tests/e2e; idempotent when both directories ran)."""
    yield
    release_shared_lab()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if ROWS:
        terminalreporter.section("fault suite (tests/faults)")
        terminalreporter.write(markdown_table(ROWS))

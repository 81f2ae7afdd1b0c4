"""End-to-end fixtures: a real 2-node lab per test module (see :mod:`tests.e2e.lab_driver`), a namespace per test.

They need root and kubectl; without them the tests skip, except under ``CI`` (CI runs as root), where they fail.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator

import pytest
from tests.e2e.lab_driver import Lab, module_on_shared_lab, release_shared_lab, running_lab


def _needs(what: str, ok: bool) -> None:
    if not ok:
        if os.environ.get("CI"):
            pytest.fail(f"e2e tests need {what}, and CI has it")
        pytest.skip(f"needs {what}")


@pytest.fixture(autouse=True, scope="session")
def _needs_root_and_kubectl() -> None:
    _needs("root (network namespaces)", os.geteuid() == 0)
    _needs("kubectl", shutil.which("kubectl") is not None)


@pytest.fixture(autouse=True, scope="session")
def _shared_lab_down() -> Iterator[None]:
    """The shared mesh lab (lab_driver.shared_mesh_lab), if a module brought it up, goes down with the session."""
    yield
    release_shared_lab()


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Lab]:
    """A 2-node lab for the test module (tests use namespaces of their own in it): the shared mesh lab when the
    module says it can run there (``SHARES_THE_MESH_LAB``), else a lab of its own without the mesh."""
    if getattr(request.module, "SHARES_THE_MESH_LAB", False):
        with module_on_shared_lab(tmp_path_factory) as shared:
            yield shared
        return
    with running_lab(tmp_path_factory.mktemp("e2e")) as up:
        yield up


@pytest.fixture
def namespace(lab: Lab, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace of the test's own, deleted (without waiting) afterwards."""
    words = re.sub(r"[^a-z0-9]+", "-", request.node.name.removeprefix("test_").lower())
    name = "e2e-" + words[:40].strip("-")
    lab.namespace(name)
    try:
        yield name
    finally:
        lab.delete_namespace(name)

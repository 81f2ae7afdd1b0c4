"""The layer contract (pyproject's ``[tool.importlinter]``, run by ``make lint``): kept by the tree as it is,
broken by a lower layer importing a higher one.

Each case runs ``lint-imports`` on a copy of ``src/ambit`` (found first on ``PYTHONPATH``), so the contract judged is
the project's own, and the copy may be edited to break it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.timeout(120)


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "src" / "ambit", tmp_path / "ambit", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_the_tree_keeps_the_layer_contract(tree: Path) -> None:
    done = lint_imports(tree)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("module", "wrong_import", "broken"),
    [
        ("model/probe.py", "from ambit.cli import main", "ambit.model is not allowed to import ambit.cli"),
        ("tls/probe.py", "import ambit.identity.manager", "ambit.tls is not allowed to import ambit.identity"),
        ("proxy/probe.py", "from ambit.inpod import settings", "ambit.proxy is not allowed to import ambit.inpod"),
        ("hbone/probe.py", "from ambit.proxy import errors", "ambit.hbone is not allowed to import ambit.proxy"),
    ],
)
def test_a_lower_layer_importing_a_higher_one_breaks_the_contract(
    tree: Path, module: str, wrong_import: str, broken: str
) -> None:
    (tree / "ambit" / module).write_text(f'"""A deliberately wrong import."""\n\n{wrong_import}\n')
    done = lint_imports(tree)
    assert done.returncode != 0
    assert broken in done.stdout


def test_independent_packages_of_one_layer_may_not_import_each_other(tree: Path) -> None:
    (tree / "ambit" / "hbone" / "probe.py").write_text("from ambit.zds import protocol\n")
    done = lint_imports(tree)
    assert done.returncode != 0
    assert "ambit.hbone is not allowed to import ambit.zds" in done.stdout

"""The committed generated modules in src/ambit/api match what scripts/gen_proto.sh makes from proto/ now."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
API = REPO / "src" / "ambit" / "api"


def test_generated_protobuf_modules_are_fresh(tmp_path: Path) -> None:
    subprocess.run(
        ["bash", str(REPO / "scripts" / "gen_proto.sh"), str(tmp_path)],
        check=True,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
    )
    generated = sorted(p.name for p in tmp_path.iterdir())
    assert generated, "gen_proto.sh produced nothing"
    committed = sorted(p.name for p in API.iterdir() if p.name.endswith(("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")))
    assert generated == committed, "run scripts/gen_proto.sh: generated file set differs"
    stale = [name for name in generated if (tmp_path / name).read_bytes() != (API / name).read_bytes()]
    assert not stale, f"stale generated modules {stale}: run scripts/gen_proto.sh"

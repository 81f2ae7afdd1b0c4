#!/usr/bin/env bash
# Regenerate the committed protobuf modules in src/ambit/api from proto/*.proto.
# Uses the pinned grpcio-tools from the project virtualenv (protoc bundled with it), so the output is reproducible.
# Usage: scripts/gen_proto.sh [OUT_DIR]   (default: src/ambit/api; tests/unit/test_proto_fresh.py passes a tmp dir)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/src/ambit/api}"
python="${PYTHON:-$root/.venv/bin/python}"
mkdir -p "$out"
cd "$root/proto"
# Relative paths keep the generated descriptors free of absolute paths.
"$python" -m grpc_tools.protoc -I. --python_out="$out" --pyi_out="$out" ./*.proto

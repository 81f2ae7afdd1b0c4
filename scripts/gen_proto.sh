#!/usr/bin/env bash
# Regenerate the committed protobuf and gRPC modules in src/ambit/api from proto/*.proto.
# Uses the pinned grpcio-tools from the project virtualenv (protoc bundled with it), so the output is reproducible.
# The .proto files are compiled as ambit/api/<name>.proto so that generated cross-file imports read
# `from ambit.api import workload_pb2` (protoc derives import paths from the proto path).
# Usage: scripts/gen_proto.sh [OUT_DIR]   (default: src/ambit/api; tests/unit/test_proto_fresh.py passes a tmp dir)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/src/ambit/api}"
python="${PYTHON:-$root/.venv/bin/python}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$out" "$work/in/ambit/api" "$work/out"
cp "$root"/proto/*.proto "$work/in/ambit/api/"
cd "$work/in"
# grpc_tools' __main__ adds the bundled well-known types (google/protobuf/*.proto) to the include path.
"$python" -m grpc_tools.protoc -I. --python_out="$work/out" --pyi_out="$work/out" --grpc_python_out="$work/out" \
  ambit/api/*.proto
# Keep only gRPC modules that define a service (protoc writes an empty stub for every file).
for f in "$work"/out/ambit/api/*_pb2_grpc.py; do
  grep -q "Stub\b" "$f" || rm -f "$f"
done
cp "$work"/out/ambit/api/* "$out/"

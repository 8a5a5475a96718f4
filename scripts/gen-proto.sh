#!/usr/bin/env bash
# Regenerates the Python code for proto/kiln/v1/*.proto in place.
# With --check, fails when the committed generated code is stale.
set -euo pipefail
cd "$(dirname "$0")/.."
out=proto
if [ "${1:-}" = "--check" ]; then
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
python -m grpc_tools.protoc -I proto --python_out="$out" --pyi_out="$out" \
  --grpc_python_out="$out" proto/kiln/v1/*.proto
if [ "${1:-}" = "--check" ]; then
  stale=0
  for f in "$out"/kiln/v1/*_pb2*.py*; do
    rel=${f#"$out"/}
    if ! cmp -s "$f" "proto/$rel"; then
      echo "stale generated code: proto/$rel (run scripts/gen-proto.sh)" >&2
      stale=1
    fi
  done
  for f in proto/kiln/v1/*_pb2*.py*; do
    [ -e "$out/${f#proto/}" ] || { echo "generated file without a .proto: $f" >&2; stale=1; }
  done
  exit $stale
fi

#!/usr/bin/env bash
# The whole suite as `make test` runs it: two shares at once (tests/conftest.py, AMBIT_TEST_SHARE).
#   machine: the tests that use the machine itself (labs, network namespaces, root), one after the other;
#   rest:    every other test, spread over pytest-xdist workers.
# Each share's lines are prefixed with its name; the exit status is non-zero when either share fails.
# Usage: scripts/run_suite.sh [extra pytest arguments, given to both shares]
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
pytest="${PYTEST:-$root/.venv/bin/pytest}"
workers="${AMBIT_TEST_WORKERS:-2}"
base="$(mktemp -d /tmp/as.XXXXXX)"  # short: lab unix sockets live under it (108-byte AF_UNIX limit)
trap 'rm -rf "$base"' EXIT

# --durations: the slowest tests of each share are printed at the end, where the CI log's tail shows them.
(AMBIT_TEST_SHARE=machine "$pytest" -q --durations=60 --durations-min=5 --basetemp="$base/machine" tests "$@" 2>&1 | sed -u 's/^/[machine] /') &
machine=$!
(AMBIT_TEST_SHARE=rest "$pytest" -q -n "$workers" --durations=10 --durations-min=5 --basetemp="$base/rest" tests "$@" 2>&1 | sed -u 's/^/[rest] /') &
rest=$!
wait "$machine"; machine_status=$?
wait "$rest"; rest_status=$?
echo "suite: machine share exit ${machine_status}, rest share exit ${rest_status}"
[ "$machine_status" -eq 0 ] && [ "$rest_status" -eq 0 ]

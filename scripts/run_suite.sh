#!/usr/bin/env bash
# The whole suite as `make test` runs it, in shares (tests/conftest.py, AMBIT_TEST_SHARE), two lines at once:
#   lab:  the tests that bring up a lab or take the machine-wide lab lock, one after the other;
#   rest: every other test that does not use the machine, spread over pytest-xdist workers, then
#   host: the machine's other tests (namespaces, links and tables of their own names; root), one after the other,
#   and beside it, from the rest share's end, lab2: as root, a second stream of the lab share, in a network
#         namespace with a /run/netns and /run/lock of its own; the two lab streams take the lab share's modules from
#         one queue (tests/lab_streams.py).
# Each share's lines are prefixed with its name; the exit status is non-zero when any share fails.
# Usage: scripts/run_suite.sh [extra pytest arguments, given to every share]
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
pytest="${PYTEST:-$root/.venv/bin/pytest}"
workers="${AMBIT_TEST_WORKERS:-2}"
base="$(mktemp -d /tmp/as.XXXXXX)"  # short: lab unix sockets live under it (108-byte AF_UNIX limit)
trap 'rm -rf "$base"' EXIT

# --durations: the slowest tests of each share are printed at the end, where the CI log's tail shows them.
streams=()
if [ "$(id -u)" -eq 0 ]; then
  streams=(env AMBIT_LAB_QUEUE="$base/lab.queue")
fi
(AMBIT_TEST_SHARE=lab "${streams[@]}" "$pytest" -q --durations=40 --durations-min=5 --basetemp="$base/lab" tests "$@" 2>&1 | sed -u 's/^/[lab] /' | tee "$base/lab.out") &
lab=$!
(
  AMBIT_TEST_SHARE=rest "$pytest" -q -n "$workers" --durations=10 --durations-min=5 --basetemp="$base/rest" tests "$@" 2>&1 | sed -u 's/^/[rest] /' | tee "$base/rest.out"
  rest_status=${PIPESTATUS[0]}
  lab2=""
  if [ "${#streams[@]}" -gt 0 ]; then
    mkdir -p /run/netns
    # A machine of its own as far as labs go: loopback, bridge and routes in a new network namespace, named
    # namespaces and the lab lock on tmpfs in a new mount namespace (gone with the stream).
    (
      unshare --net --mount --propagation private sh -c 'mount -t tmpfs -o mode=0755 lab2 /run/netns &&
        mount -t tmpfs -o mode=1777 lab2 /run/lock && ip link set lo up && exec "$@"' lab2 \
        "${streams[@]}" AMBIT_LAB_STREAM=secondary AMBIT_TEST_SHARE=lab \
        "$pytest" -q --durations=40 --durations-min=5 --basetemp="$base/lab2" tests "$@" 2>&1 | sed -u 's/^/[lab2] /' | tee "$base/lab2.out"
      exit "${PIPESTATUS[0]}"
    ) &
    lab2=$!
  fi
  AMBIT_TEST_SHARE=host "$pytest" -q --durations=20 --durations-min=5 --basetemp="$base/host" tests "$@" 2>&1 | sed -u 's/^/[host] /' | tee "$base/host.out"
  host_status=${PIPESTATUS[0]}
  echo "suite: rest share exit ${rest_status}, host share exit ${host_status}"
  lab2_status=0
  if [ -n "$lab2" ]; then
    wait "$lab2"; lab2_status=$?
    echo "suite: second lab stream exit ${lab2_status}"
  fi
  [ "$rest_status" -eq 0 ] && [ "$host_status" -eq 0 ] && [ "$lab2_status" -eq 0 ]
) &
others=$!
wait "$lab"; lab_status=$?
wait "$others"; others_status=$?
# The shares interleave and the lab's ends last, so a failure in another share would scroll out of a log's tail:
# every share's failures and result line are repeated here, at the end.
echo "suite: summary of every share"
for share in rest host lab lab2; do
  [ -f "$base/$share.out" ] || continue
  grep -E "^\[$share\] (FAILED|ERROR) |^\[$share\] =* ?[0-9]+ (passed|failed|error)|^\[$share\] .*(Interrupted|INTERNALERROR|no tests ran)" "$base/$share.out" | tail -n 60
done
echo "suite: lab share exit ${lab_status}; rest and host shares and the second lab stream exit ${others_status}"
[ "$lab_status" -eq 0 ] && [ "$others_status" -eq 0 ]

#!/usr/bin/env bash
# npm test: build, type-check, lint (format, eslint, layering, unused code), unit tests (node:test), then the bats
# suites against the built bin/latch.
# Root-only tests skip themselves with a message when not root; CI runs as root so they run there.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/node_modules/.bin:$PATH:/usr/sbin:/sbin"

npm run --silent build
echo "== self-contained build (bin/latch-sea, ~10 s)"
npm run --silent build:sea
export LATCH_REQUIRE_SEA=1 # install.bats fails instead of skipping its bin/latch-sea tests
echo "== type check"
tsc --noEmit -p .
echo "== lint"
npm run --silent lint
echo "== unit tests"
# The files on a one-host Ceph cluster (those that import test/ceph/cluster.ts) run one at a time beside the others:
# each starts a cluster of its own on free ports and checks only its own mounts, loop devices and processes, and
# they spend most of their time waiting on the cluster (start-up, faults, watch timeouts). Their output is printed
# after the others'.
mapfile -t ceph_tests < <(grep -l 'ceph/cluster.js' test/unit/*.test.ts)
mapfile -t other_tests < <(grep -L 'ceph/cluster.js' test/unit/*.test.ts)
ceph_log=$(mktemp)
node --import tsx --test --test-reporter=spec --test-concurrency=1 "${ceph_tests[@]}" >"$ceph_log" 2>&1 &
ceph_pid=$!
# Stops them if this script ends first (interrupted, or set -e). `|| true`: under set -e a failing command in the
# trap would make the script's exit status 1.
trap 'kill "$ceph_pid" 2>/dev/null || true; rm -f "$ceph_log"' EXIT
# One shared etcd member for the ledger suite's etcd run (its worker processes must all reach the same one);
# with-etcd.ts stops it afterwards, even on failure. Tests that need their own etcd (a cluster, restarts) start
# and stop it themselves. Without etcd installed, the etcd tests skip with a message.
others=0
node --import tsx test/etcd/with-etcd.ts -- \
  node --import tsx --test --test-reporter=spec --test-concurrency=1 "${other_tests[@]}" || others=$?
ceph=0
wait "$ceph_pid" || ceph=$?
echo "== unit tests on a Ceph cluster (run beside the others)"
cat "$ceph_log"
trap - EXIT
rm -f "$ceph_log"
if ((others != 0 || ceph != 0)); then
  echo "unit tests failed (exit $others; on a Ceph cluster: exit $ceph)"
  exit 1
fi
echo "== bats suites"
node_modules/bats/bin/bats --print-output-on-failure test/bats
echo "== the protocol suite again, against the self-contained build"
LATCH_BIN="$PWD/bin/latch-sea" node_modules/bats/bin/bats --print-output-on-failure test/bats/protocol.bats

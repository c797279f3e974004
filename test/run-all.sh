#!/usr/bin/env bash
# npm test: build; then, beside each other, the static checks (type check, format, eslint, layering, unused code), the
# Ceph tests, the bats suites that set volumes up on the host, and in the foreground the unit tests, the integration
# tests, the protocol suite against bin/latch and its process-level tests against bin/latch-sea. docs/testing.md says
# what runs where and why, with the time of each part.
# Root-only tests skip themselves with a message when not root; CI runs as root so they run there.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/node_modules/.bin:$PATH:/usr/sbin:/sbin"
started=$SECONDS

# Says how long a part took, so that a run's output shows where its time went.
took() {
  echo "== $1: $(($2)) s"
}

t=$SECONDS
npm run --silent build
echo "== self-contained build (bin/latch-sea, ~10 s)"
npm run --silent build:sea
export LATCH_REQUIRE_SEA=1 # install.bats fails instead of skipping its bin/latch-sea tests
took "builds" "SECONDS - t"

# Beside everything else from here on, their output printed at the end:
# - the static checks, which need nothing but the source;
# - the Ceph tests (test/ceph/), which spend most of their time waiting on their cluster (start-up, faults, watch
#   timeouts). Each file starts a cluster of its own on free ports and checks only its own mounts, loop devices and
#   processes, so they run beside the others, two at a time among themselves (test/ceph/run.sh);
# - the bats suites but the protocol suite: they wait on mkfs, mounts and the driver's polls more than they compute, and
#   each test works in a temp dir of its own and checks only its own loop devices and mounts.
work=$(mktemp -d)
pids=()
# Stops them if this script ends first (interrupted, or set -e): job control puts each in a process group of its own,
# so that the whole group (bats, node and the tests' children) is stopped. `|| true`: under set -e a failing command in
# the trap would make the script's exit status 1.
set -m
trap 'for p in "${pids[@]}"; do kill -- "-$p" 2>/dev/null || true; done; rm -rf "$work"' EXIT
background() {
  local name=$1
  shift
  (
    s=$SECONDS
    rc=0
    "$@" || rc=$?
    took "$name (exit $rc)" "SECONDS - s"
    exit "$rc"
  ) >"$work/$name.log" 2>&1 &
  pids+=("$!")
}
static_checks() {
  echo "== type check"
  tsc --noEmit -p .
  echo "== lint"
  npm run --silent lint
}
# resize.bats runs in a mount namespace of its own, made before the Ceph tests mount anything: mkfs.btrfs looks at the
# backing file of every loop device in its mount table, and fails (ENOTCONN) or hangs on one over a FUSE mount that a
# Ceph test has cut off or fenced on purpose. In its own namespace it sees only its own mounts; the Ceph tests wait
# the moment it takes to make it.
host_suites() {
  local rc=0
  # shellcheck disable=SC2016 # $0 is expanded by the inner shell
  unshare --mount --propagation private -- bash -c ': >"$0"; exec node_modules/bats/bin/bats --print-output-on-failure test/bats/resize.bats' \
    "$work/resize-namespace" || rc=$?
  mapfile -t others < <(ls test/bats/*.bats | grep -v -e '/protocol\.bats$' -e '/resize\.bats$')
  node_modules/bats/bin/bats --print-output-on-failure "${others[@]}" || rc=$?
  return "$rc"
}
ceph_tests() {
  until [[ -e $work/resize-namespace ]]; do sleep 0.2; done
  npm run --silent test:ceph
}
background "static checks" static_checks
background "bats suites" host_suites
background "Ceph tests" ceph_tests

echo "== unit tests (test/unit/, every file at once)"
t=$SECONDS
npm run --silent test:unit
took "unit tests" "SECONDS - t"

# Two files at a time: each works in temp dirs, loop devices, ports and processes of its own (docs/testing.md).
# One shared etcd member for the ledger suite's etcd run (its worker processes must all reach the same one);
# with-etcd.ts stops it afterwards, even on failure. Tests that need their own etcd (a cluster, restarts) start
# and stop it themselves. Without etcd installed, the etcd tests skip with a message.
echo "== integration tests (test/integration/, root, the kernel, etcd, child processes, the built executables)"
t=$SECONDS
npm run --silent test:integration
took "integration tests" "SECONDS - t"

echo "== the protocol suite (test/bats/protocol.bats) against bin/latch"
t=$SECONDS
node_modules/bats/bin/bats --print-output-on-failure test/bats/protocol.bats
took "protocol suite" "SECONDS - t"

# bin/latch-sea runs the same bundled JavaScript as bin/latch for each call's arguments and options (build.mjs bundles
# src/ for both); what differs is the process around it: the loader and its code cache, the control plane's own
# bundle, the native helper's turn, where the configuration is found, stdout and stderr, signals and the log line.
# So this pass runs the protocol suite's tests of that: every op once with valid input (each of both bundles), init,
# unknown ops, the configuration, the log, secrets, 100 KB arguments, signals, the human side, stray output and the
# single executable's own. The matrix of malformed arguments and options runs once, against bin/latch, above.
echo "== the protocol suite's process-level tests again, against the self-contained build"
t=$SECONDS
LATCH_BIN="$PWD/bin/latch-sea" node_modules/bats/bin/bats --print-output-on-failure \
  --filter '^(init:|unknown op|attach-mode ops|[a-z]+: valid minimal input|config:|log:|secrets:|options: 100 KB|SIGTERM|latch (--help|version)|output:|configuration:|single executable:)' \
  test/bats/protocol.bats
took "protocol suite against bin/latch-sea" "SECONDS - t"

status=0
for i in "${!pids[@]}"; do
  wait "${pids[i]}" || status=1
done
pids=()
for name in "static checks" "bats suites" "Ceph tests"; do
  echo "== $name (run beside the rest)"
  cat "$work/$name.log"
done
took "npm test" "SECONDS - started"
if ((status != 0)); then
  echo "npm test failed: see the static checks, the Ceph tests or the bats suites above"
  exit 1
fi

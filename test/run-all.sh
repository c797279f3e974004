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
# One shared etcd member for the ledger suite's etcd run (its worker processes must all reach the same one);
# with-etcd.ts stops it afterwards, even on failure. Tests that need their own etcd (a cluster, restarts) start
# and stop it themselves. Without etcd installed, the etcd tests skip with a message.
node --import tsx test/etcd/with-etcd.ts -- \
  node --import tsx --test --test-reporter=spec --test-concurrency=1 test/unit/*.test.ts
echo "== bats suites"
node_modules/bats/bin/bats --print-output-on-failure test/bats
echo "== the protocol suite again, against the self-contained build"
LATCH_BIN="$PWD/bin/latch-sea" node_modules/bats/bin/bats --print-output-on-failure test/bats/protocol.bats

#!/usr/bin/env bash
# npm run test:ceph: the Ceph files, two at a time. Each starts a cluster of its own on free ports and checks only its
# own mounts, loop devices and processes, so two can run side by side; more would starve their clusters (watch and
# beacon timeouts of a few seconds) on a 2-core machine. The longest files go first, so that the two lanes end
# together (docs/testing.md, "Where the time goes"); every other file follows in name order.
set -euo pipefail
cd "$(dirname "$0")/../.."
longest=(driver-rbd-faults nemesis driver-cephfs shared-jobs backend-rbd backup-s3)
files=()
for name in "${longest[@]}"; do files+=("test/ceph/$name.test.ts"); done
for file in test/ceph/*.test.ts; do
  [[ " ${files[*]} " == *" $file "* ]] || files+=("$file")
done
exec node --import tsx --test --test-reporter=spec --test-concurrency=2 "${files[@]}"

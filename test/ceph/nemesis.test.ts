// The nemesis suite's short fixed schedule (test/nemesis/run.ts, docs/reliability.md): each fault kind once against
// latch on the rig (nodes, Ceph and a 3-member etcd each in their own network namespace), then three pairs of
// overlapping faults, with the checker's six properties decided after every round from the history alone. Every
// property must hold in every round.
// Needs root, iproute2, nftables, curl, Debian's ceph packages, etcd and bin/latch; skips with a message otherwise.
// It imports the Ceph fixture, so test/run-all.sh runs it with the other Ceph files (one at a time).
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { describe, it } from 'node:test';
import { cephSkipReason } from '../ceph/cluster.js';
import { runNemesis } from '../nemesis/run.js';
import { rigSkipReason } from '../nemesis/rig.js';

const skip = cephSkipReason() ?? rigSkipReason();
const SEED = 35;

describe('the nemesis suite (fixed schedule)', { skip }, () => {
  it('keeps every property through each fault kind', { timeout: 600_000 }, async (t) => {
    const lines: string[] = [];
    // Faults of 6 s (10 s by default): about 4 minutes in all.
    const result = await runNemesis({ seed: SEED, seconds: 0, fixed: true, faultMs: 6_000, log: (line) => lines.push(line) });
    for (const line of lines) t.diagnostic(line);
    assert.equal(result.rounds, 14, 'every fault kind ran alone, then the three pairs');
    assert.equal(result.overlaps, 3, 'three rounds had two faults at once');
    assert.equal(result.counts.faults, 17);
    assert.ok(result.counts.records > 0, 'the writers acknowledged records');
    assert.deepEqual(result.failures, [], `the checker found violations (history in ${result.historyFile})`);
    assert.equal(result.failed, 0);
    rmSync(result.historyFile); // kept when the test fails, for the diagnosis
  });
});

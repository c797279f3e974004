// `latch demo --backend rbd` (the README's demo of the move and the fence) on a throwaway one-host Ceph cluster, as
// `npm run demo:rbd` runs it: exit 0, the fence shown before the move, and nothing left behind in the cluster or on
// the host. Needs root, Debian's ceph packages and bin/latch; skips with a message otherwise.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { run } from '../../src/sys/run.js';
import { cephSkipReason, startCephCluster, type CephCluster } from '../ceph/cluster.js';

const LATCH = resolve(__dirname, '../../bin/latch');
const skip = cephSkipReason() ?? (existsSync(LATCH) ? undefined : 'bin/latch is missing: run npm run build first');

describe('latch demo --backend rbd', { skip }, () => {
  let ceph: CephCluster;
  before(async () => {
    ceph = await startCephCluster();
  });
  after(async () => {
    await ceph?.stop();
  });

  it('moves the volume from node-a to node-b through a fence, and leaves nothing behind', { timeout: 300_000 }, async () => {
    const args = ['demo', '--backend', 'rbd', '--ceph-conf', ceph.confPath, '--ceph-keyring', ceph.adminKeyring, '--pool', ceph.pool];
    const { stdout, exitCode } = await run(process.execPath, [LATCH, ...args], { okExitCodes: [1], timeoutMs: 280_000 });
    assert.equal(exitCode, 0, stdout);
    const fenced = stdout.indexOf("node node-a fenced off (the Ceph cluster's OSD blocklist refuses its client(s) 127.0.0.1:0/");
    const moved = stdout.indexOf('[pod on node-b] read hello.txt: written on node-a');
    assert.ok(fenced > 0 && moved > fenced, 'node-a is fenced, then node-b reads what it wrote');
    assert.match(stdout, /its next write to data\.bin is refused by the cluster/);
    assert.match(stdout, /fence of node node-a lifted/);
    assert.doesNotMatch(stdout, /NOT AS EXPECTED/);
    // Nothing of the demo in the cluster: no image, no identity, no blocklist entry.
    assert.equal((await ceph.rbd(['ls', ceph.pool])).stdout.trim(), '');
    assert.doesNotMatch((await ceph.ceph(['auth', 'ls'])).stdout, /latch-demo-/);
    assert.equal((await ceph.ceph(['osd', 'blocklist', 'ls'])).stdout.trim(), '');
    const work = /Everything else lives in (\/tmp\/latch-demo-[A-Za-z0-9]+)/.exec(stdout)?.[1];
    assert.ok(work && !existsSync(join(work)), 'its directory is gone');
  });
});

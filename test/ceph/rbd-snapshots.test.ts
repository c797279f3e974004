// rbd snapshots (the block at the end of src/backend/rbd.ts) on a one-host Ceph cluster (test/ceph/cluster.ts), as a
// node's own least-privilege identity: create, list with space, a name that is taken, the snapshot read back through
// its export while the image moves on, a backup of it restored byte for byte, delete (repeatable).
// Needs root and Debian's ceph packages (scripts/setup.sh); skips with a message otherwise.
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { RbdBackend } from '../../src/backend/rbd.js';
import { createBackup } from '../../src/backup/create.js';
import { restoreBackup } from '../../src/backup/restore.js';
import { BLOCK, block, readBlock, writeBlock } from '../fixtures/blocks.js';
import { cephSkipReason, startCephCluster, type CephCluster } from '../ceph/cluster.js';

const MiB = 1024 * 1024;

describe('rbd snapshots on a one-host Ceph cluster', { skip: cephSkipReason() }, () => {
  let ceph: CephCluster;
  let backend: RbdBackend;
  let work = '';

  before(
    async () => {
      ceph = await startCephCluster();
      const client = await ceph.createClient('node-a');
      backend = new RbdBackend({
        pool: ceph.pool,
        cephConf: client.confPath,
        clientId: client.id,
        keyring: client.keyringPath,
        mountDir: join(ceph.dir, 'mnt', 'node-a'),
        maxSize: 1024 * MiB,
        timeoutMs: 30_000,
      });
      work = mkdtempSync(join(tmpdir(), 'latch-rbd-snap-'));
    },
    { timeout: 120_000 },
  );

  after(async () => {
    await backend?.release('vol').catch(() => undefined);
    await ceph?.stop();
    if (work) rmSync(work, { recursive: true, force: true });
  });

  it('takes, lists, reads back, backs up and deletes a snapshot', { timeout: 300_000 }, async () => {
    await backend.create('vol', 32 * MiB);
    const device = await backend.attach('vol');
    await writeBlock(device, 10, 'before the snapshot');

    const info = await backend.createSnapshot('vol', 's1');
    assert.equal(info.sharing, 'native');
    assert.equal(info.sizeBytes, 32 * MiB);
    assert.ok(!Number.isNaN(Date.parse(info.createdAt)), `a creation time: ${info.createdAt}`);
    await assert.rejects(backend.createSnapshot('vol', 's1'), /already has a snapshot named s1/);
    await writeBlock(device, 10, 'after the snapshot');
    await backend.release('vol');

    const listed = await backend.listSnapshots('vol');
    assert.deepEqual(
      listed.map((s) => s.name),
      ['s1'],
    );
    assert.ok((listed[0]?.allocatedBytes ?? 0) > 0, 'rbd du reports its space');
    await assert.rejects(backend.delete('vol'), /has snapshot\(s\) s1/);

    const image = await backend.openSnapshot('vol', 's1');
    let exported: Buffer;
    try {
      exported = readFileSync(image.path);
      assert.equal(exported.length, 32 * MiB);
      assert.equal(exported.subarray(10 * BLOCK, 11 * BLOCK).toString(), block('before the snapshot'));
      const target = { type: 'dir' as const, path: join(work, 'target') };
      mkdirSync(target.path);
      await createBackup({ target, source: image.path, volume: 'vol', name: 'from-rbd', sourceDescription: image.description });
      await restoreBackup({ target, name: 'from-rbd', destination: join(work, 'restored.img') });
      assert.ok(readFileSync(join(work, 'restored.img')).equals(exported), 'the backup restores the snapshot byte for byte');
    } finally {
      await image.release();
    }
    assert.equal(existsSync(image.path), false, 'the export is removed on release');

    const again = await backend.attach('vol');
    assert.equal(await readBlock(again, 10), block('after the snapshot'), 'the image moved on');
    await backend.release('vol');

    await backend.deleteSnapshot('vol', 's1');
    await backend.deleteSnapshot('vol', 's1');
    assert.deepEqual(await backend.listSnapshots('vol'), []);
    await assert.rejects(backend.openSnapshot('vol', 's1'), /has no snapshot named s1/);
    await backend.delete('vol');
  });
});

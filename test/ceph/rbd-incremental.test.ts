// Incremental backups of rbd volumes read from Ceph itself (src/node/backup.ts, src/backup/delta.ts, rbd export-diff)
// on a one-host cluster (test/ceph/cluster.ts): the first backup reads only the allocated extents, the second only
// the changed ones (bytes counted), the base snapshot is kept across a failed backup and removed after the next
// success, and a restore onto a fresh image writes only the data (the image stays thin), checksums equal.
// Needs root and Debian's ceph packages (scripts/setup.sh); skips with a message otherwise.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { closeSync, fsyncSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { RbdBackend } from '../../src/backend/rbd.js';
import type { BackupTarget } from '../../src/backup/layout.js';
import { restoreBackup } from '../../src/backup/restore.js';
import { parseConfig } from '../../src/config.js';
import { createContext, type Context } from '../../src/context.js';
import { baseSnapshotName, incrementalBackup } from '../../src/node/backup.js';
import { backupCreate } from '../../src/cli/backup/create.js';
import { backupList } from '../../src/cli/backup/list.js';
import type { CommandIO } from '../../src/cli/io.js';
import { readWholeLog } from '../../src/agent/call-log.js';
import { LatchMetrics } from '../../src/agent/metrics.js';
import { withJobRunner } from '../fixtures/job-runner.js';
import { MemoryStore } from '../fixtures/memory-store.js';
import { cephSkipReason, startCephCluster, type CephCluster } from '../ceph/cluster.js';

const MiB = 1024 * 1024;
const SIZE = 64 * MiB;

describe('incremental rbd backups from Ceph', { skip: cephSkipReason() }, () => {
  let ceph: CephCluster;
  let backend: RbdBackend;
  let ctx: Context;
  let work = '';
  let io: CommandIO;
  let printed = '';
  let target: BackupTarget = { type: 'dir', path: '' };
  /** What the volume holds, as written. */
  const model = Buffer.alloc(SIZE);

  /** Writes `bytes` random bytes at `offset` through the node's mapping (attached, written, synced, released). */
  async function write(volume: string, offset: number, bytes: number, into = model): Promise<void> {
    const device = await backend.attach(volume);
    const data = randomBytes(bytes);
    const fd = openSync(device, 'r+');
    try {
      writeSync(fd, data, 0, bytes, offset);
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    data.copy(into, offset);
    await backend.release(volume);
  }

  async function snapshots(volume: string): Promise<string[]> {
    return (await backend.listSnapshots(volume)).map((s) => s.name);
  }

  async function restoredBytes(name: string): Promise<Buffer> {
    const file = join(work, `${name}.img`);
    await restoreBackup({ target, name, destination: file, overwriteFile: true });
    return readFileSync(file);
  }

  before(
    async () => {
      ceph = await startCephCluster();
      const client = await ceph.createClient('node-a');
      work = mkdtempSync(join(tmpdir(), 'latch-rbd-incr-'));
      const keyFile = join(work, 'backup.key');
      writeFileSync(keyFile, `${randomBytes(48).toString('base64')}\n`, { mode: 0o600 });
      // With the key, as the job runner's backups below are made: each backup builds on the one before.
      target = { type: 'dir', path: join(work, 'target'), keyFile };
      mkdirSync(target.path);
      backend = new RbdBackend({
        pool: ceph.pool,
        cephConf: client.confPath,
        clientId: client.id,
        keyring: client.keyringPath,
        mountDir: join(ceph.dir, 'mnt', 'node-a'),
        maxSize: 1024 * MiB,
        timeoutMs: 30_000,
      });
      const raw = {
        nodeName: 'node-a',
        poolDir: join(work, 'pool'),
        stateDir: join(work, 'state'),
        logFile: join(work, 'latch.log'),
        backupTarget: { type: 'dir', path: target.path, keyFile },
      };
      const file = join(work, 'config.json');
      writeFileSync(file, JSON.stringify(raw));
      const store = new MemoryStore();
      ctx = createContext(parseConfig(raw, file), { store, backend });
      io = { out: (text) => (printed += text), env: { LATCH_CONFIG: file }, context: (c) => createContext(c, { store, backend }) };
      await ctx.ledger.createVolume('vol', { sizeBytes: SIZE, fsType: 'ext4' });
      await backend.create('vol', SIZE);
    },
    { timeout: 180_000 },
  );

  after(async () => {
    await backend?.release('vol').catch(() => undefined);
    await backend?.release('fresh').catch(() => undefined);
    await ceph?.stop();
    if (work) rmSync(work, { recursive: true, force: true });
  });

  const backup = (name: string, signal?: AbortSignal) => incrementalBackup(ctx, { target, volume: 'vol', name, node: 'node-a', signal });

  it('reads only the allocated extents on the first backup', { timeout: 300_000 }, async () => {
    await write('vol', 8 * MiB, 3 * MiB);
    await write('vol', 40 * MiB + 4096, MiB);
    const made = await backup('b1');
    assert.deepEqual(made.base, { none: 'the first backup of the volume in this target' });
    // What was written, and not the 60 MiB that never were (a little more: the filesystem-less writes are exact).
    assert.ok(made.bytesRead >= 4 * MiB && made.bytesRead <= 4 * MiB + 64 * 1024, `read ${made.bytesRead} bytes`);
    assert.equal(made.manifest.stats.dataChunks, 2, 'chunks 2 and 10');
    assert.ok((await snapshots('vol')).includes(baseSnapshotName('b1')), 'its base snapshot is kept');
    assert.ok((await restoredBytes('b1')).equals(model), 'it restores what was written');
  });

  it('reads only the changed extents on the next backup, and carries the rest over', { timeout: 300_000 }, async () => {
    await write('vol', 9 * MiB, 256 * 1024);
    const made = await backup('b2');
    assert.deepEqual(made.base, { parent: 'b1' });
    assert.equal(made.manifest.parent, 'b1');
    assert.ok(made.bytesRead >= 256 * 1024 && made.bytesRead <= 512 * 1024, `read ${made.bytesRead} bytes for 256 KiB changed`);
    assert.equal(made.manifest.stats.newChunks, 1, 'one chunk changed');
    const names = await snapshots('vol');
    assert.ok(names.includes(baseSnapshotName('b2')), 'its base is kept');
    assert.ok(!names.includes(baseSnapshotName('b1')), 'the previous base goes once this backup is published');
    assert.ok((await restoredBytes('b2')).equals(model), 'the incremental backup restores the whole volume');
  });

  it('keeps the previous base when a backup fails, and builds on it next time', { timeout: 300_000 }, async () => {
    // Inside an object that exists: an object the change creates is read from its start (Ceph reports it whole).
    await write('vol', 10 * MiB, 128 * 1024);
    const stop = new AbortController();
    stop.abort(new Error('stopped for the test'));
    await assert.rejects(backup('b3', stop.signal), /stopped for the test/);
    let names = await snapshots('vol');
    assert.ok(names.includes(baseSnapshotName('b2')), 'the previous base is still there');
    assert.ok(!names.includes(baseSnapshotName('b3')), "the failed backup's snapshot is removed");
    const made = await backup('b4');
    assert.deepEqual(made.base, { parent: 'b2' });
    assert.ok(made.bytesRead >= 128 * 1024 && made.bytesRead <= 256 * 1024, `read ${made.bytesRead} bytes`);
    names = await snapshots('vol');
    assert.deepEqual(
      names.filter((n) => n.startsWith('latch-base-')),
      [baseSnapshotName('b4')],
    );
    assert.ok((await restoredBytes('b4')).equals(model));
  });

  it('restores onto a fresh image writing only the data extents', { timeout: 300_000 }, async () => {
    await backend.create('fresh', SIZE);
    assert.equal(await backend.isUnwritten('fresh'), true, 'a new image has nothing written');
    const device = await backend.attach('fresh');
    let report;
    try {
      report = await restoreBackup({ target, name: 'b4', destination: device, fresh: true });
    } finally {
      await backend.release('fresh');
    }
    assert.equal(report.dataChunks, 2);
    assert.equal(report.bytesWritten, 2 * 4 * MiB, 'the data chunks only');
    const du = JSON.parse((await ceph.rbd(['du', '--format', 'json', `${ceph.pool}/fresh`])).stdout) as {
      images: { used_size: number }[];
    };
    const used = du.images[0]?.used_size ?? -1;
    assert.equal(await backend.isUnwritten('fresh'), false, 'a restore redone now would zero the holes');
    assert.ok(used > 0 && used <= 2 * 4 * MiB, `the image uses ${used} bytes, no more than the data chunks`);
    const copy = join(work, 'fresh.img');
    await ceph.rbd(['export', '--no-progress', `${ceph.pool}/fresh`, copy]);
    assert.ok(readFileSync(copy).equals(model), 'the fresh image holds the backup, byte for byte');
  });

  it(
    'a backup job of the idle volume, through the job runner, reads only the change and counts in the metrics',
    { timeout: 300_000 },
    async () => {
      await write('vol', 41 * MiB, 64 * 1024);
      printed = '';
      await withJobRunner(ctx, () => backupCreate({ volume: 'vol', name: 'j1', output: 'json' }, io));
      const job = (await ctx.ledger.get('vol'))?.status.jobs?.at(-1);
      assert.equal(job?.status.state, 'succeeded', job?.status.message);
      assert.equal(job?.status.result?.incrementalFrom, 'b4', JSON.stringify(job?.status.result));
      assert.equal(job?.status.result?.consistency, 'idle', 'the device was set up for the job only');
      const read = Number(job?.status.result?.bytesRead);
      assert.ok(read >= 64 * 1024 && read <= 128 * 1024, `read ${read} bytes`);
      assert.ok((await restoredBytes('j1')).equals(model));

      const metrics = await LatchMetrics.create();
      await readWholeLog(join(work, 'latch.log'), (line) => metrics.ingest(line));
      const text = await metrics.text();
      assert.match(text, /^latch_backup_runs_total\{kind="backup",trigger="manual",outcome="succeeded"\} 1$/m);
      assert.match(text, new RegExp(`^latch_backup_read_bytes_total\\{kind="backup",trigger="manual"\\} ${read}$`, 'm'));

      printed = '';
      await backupList({ output: 'table' }, io);
      assert.match(printed, /\nVOLUME\s+LAST OUTCOME\s+AT\s+BACKUP\s+NODE\s+MESSAGE\nvol\s+succeeded\s+\S+\s+j1\s+node-a/);
    },
  );

  it('deletes the base snapshots with the volume, and refuses while another snapshot is there', { timeout: 120_000 }, async () => {
    await backend.createSnapshot('vol', 'mine');
    await assert.rejects(backend.delete('vol'), /has snapshot\(s\) latch-base-j1, mine/);
    await backend.deleteSnapshot('vol', 'mine');
    await backend.delete('vol');
    assert.equal(await backend.size('vol'), undefined, 'the image is gone');
  });
});

// Incremental backups of rbd volumes read from Ceph itself (src/node/backup.ts, src/backup/delta.ts, rbd export-diff)
// on a one-host cluster (test/ceph/cluster.ts): the first backup reads only the allocated extents, the second only
// the changed ones (bytes counted), the base snapshot is kept across a failed backup and removed after the next
// success, and a restore onto a fresh image writes only the data (the image stays thin), checksums equal. Clones
// (src/node/jobs/clone-copy.ts) read the same way: only the allocated extents, nothing written under mountDir, the
// new image as thin as the data, byte for byte; onto an image holding other bytes (a repeat after a kill) too.
// Needs root and Debian's ceph packages (scripts/setup.sh); skips with a message otherwise.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import {
  closeSync,
  fsyncSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  readSync,
  rmSync,
  statSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
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
import { volumeClone } from '../../src/cli/volume/clone.js';
import { copyOnto, openCloneSource, verifyCopy } from '../../src/node/jobs/clone-copy.js';
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

  /** Writes `data` at `offset` through the node's mapping, into `model` too. */
  async function writeData(volume: string, offset: number, data: Buffer, model: Buffer): Promise<void> {
    const device = await backend.attach(volume);
    const fd = openSync(device, 'r+');
    try {
      writeSync(fd, data, 0, data.length, offset);
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    data.copy(model, offset);
    await backend.release(volume);
  }

  /** Every byte of the volume, read through a mapping of it set up now (and released). */
  async function readVolume(volume: string): Promise<Buffer> {
    const device = await backend.attach(volume);
    try {
      const size = (await backend.size(volume)) ?? 0;
      const bytes = Buffer.alloc(size);
      const fd = openSync(device, 'r');
      try {
        for (let done = 0; done < size;) done += readSync(fd, bytes, done, size - done, done);
      } finally {
        closeSync(fd);
      }
      return bytes;
    } finally {
      await backend.release(volume);
    }
  }

  /** `rbd du`: the bytes the image's objects take. */
  async function usedBytes(volume: string): Promise<number> {
    const du = JSON.parse((await ceph.rbd(['du', '--format', 'json', `${ceph.pool}/${volume}`])).stdout) as {
      images: { used_size: number }[];
    };
    return du.images[0]?.used_size ?? -1;
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
    for (const volume of ['csrc', 'c1', 'c1d', 'c-empty', 'c2', 'c3']) await backend?.release(volume).catch(() => undefined);
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

  describe('clones read the allocated extents straight from the cluster', () => {
    const snapModel = Buffer.alloc(SIZE);
    const liveModel = Buffer.alloc(SIZE);
    const mountDir = () => join(ceph.dir, 'mnt', 'node-a');
    /** The 1 MiB blocks of `bytes` that are not all zeros, and the 4 MiB objects that hold them. */
    const dataOf = (bytes: Buffer) => {
      const blocks = new Set<number>();
      for (let b = 0; b < bytes.length / MiB; b++) if (bytes.subarray(b * MiB, (b + 1) * MiB).some((x) => x !== 0)) blocks.add(b);
      return { blocks: blocks.size, objects: new Set([...blocks].map((b) => Math.floor(b / 4))).size };
    };

    /** Bytes allocated under mountDir but outside the rbd-fuse mount points, and whether an export file was seen. */
    function localUse(dir: string): { bytes: number; exports: string[] } {
      const out = { bytes: 0, exports: [] as string[] };
      const walk = (path: string, top: boolean) => {
        let entries;
        try {
          entries = readdirSync(path, { withFileTypes: true });
        } catch {
          return;
        }
        for (const e of entries) {
          // A mount point (a non-dot directory right below mountDir) holds the image's rbd-fuse file: not local disk.
          if (top && e.isDirectory() && !e.name.startsWith('.')) continue;
          if (e.name.includes('.export-')) out.exports.push(e.name);
          try {
            if (e.isDirectory()) walk(join(path, e.name), false);
            else if (e.isFile()) out.bytes += statSync(join(path, e.name)).blocks * 512;
          } catch {
            /* gone meanwhile */
          }
        }
      };
      walk(dir, true);
      return out;
    }

    /** Runs a clone through the job runner while sampling mountDir every 20 ms; its job's status and the samples. */
    async function clone(name: string, fromSnapshot?: string) {
      const before = localUse(mountDir()).bytes;
      let peak = before;
      const exports = new Set<string>();
      const sample = () => {
        const use = localUse(mountDir());
        peak = Math.max(peak, use.bytes);
        for (const e of use.exports) exports.add(e);
      };
      const timer = setInterval(sample, 20);
      const started = performance.now();
      try {
        await withJobRunner(ctx, () =>
          volumeClone({ source: 'csrc', name, ...(fromSnapshot !== undefined && { fromSnapshot }), wait: true }, io),
        );
      } finally {
        clearInterval(timer);
      }
      const ms = performance.now() - started;
      sample();
      const job = (await ctx.ledger.get(name))?.status.jobs?.at(-1);
      return { job, ms, grewBytes: peak - before, exports: [...exports] };
    }

    before(async () => {
      await ctx.ledger.createVolume('csrc', { sizeBytes: SIZE, fsType: 'ext4' });
      await backend.create('csrc', SIZE);
      // Scattered: the first and last bytes, inside objects, across block and object boundaries, and a block of
      // zeros written (its object exists: the clone leaves it a hole).
      await writeData('csrc', 0, randomBytes(4096), snapModel);
      await writeData('csrc', 5 * MiB + 123, randomBytes(10_000), snapModel);
      await writeData('csrc', 16 * MiB - 100, randomBytes(3 * MiB + 200), snapModel);
      await writeData('csrc', 30 * MiB, Buffer.alloc(MiB), snapModel);
      await writeData('csrc', 44 * MiB, randomBytes(3 * MiB), snapModel);
      await writeData('csrc', SIZE - 4096, randomBytes(4096), snapModel);
      await backend.createSnapshot('csrc', 'cs1');
      snapModel.copy(liveModel);
      // After the snapshot: block 0 back to zeros, one range rewritten, a new one.
      await writeData('csrc', 0, Buffer.alloc(4096), liveModel);
      await writeData('csrc', 5 * MiB, randomBytes(MiB), liveModel);
      await writeData('csrc', 50 * MiB + 7, randomBytes(MiB), liveModel);
    });

    it('clones a snapshot byte for byte, thin, with nothing written under mountDir', { timeout: 300_000 }, async (t) => {
      const { job, ms, grewBytes, exports } = await clone('c1', 'cs1');
      assert.equal(job?.status.state, 'succeeded', job?.status.message);
      const result = job?.status.result ?? {};
      assert.match(String(result.read), /its allocated extents, read with rbd export-diff/);
      const expected = dataOf(snapModel);
      assert.equal(result.dataBytes, expected.blocks * MiB, 'the blocks holding data were written, the block of zeros was not');
      assert.deepEqual(exports, [], 'no export of the snapshot under mountDir');
      let listed = 0;
      for await (const extent of backend.allocatedExtents('c1')) listed += extent.length;
      assert.equal(listed, expected.objects * 4 * MiB, 'rbd diff of the clone lists the objects of the data, whole');
      assert.ok(
        Number(result.verifiedBytes) > 0 && Number(result.verifiedBytes) <= listed,
        `the check read ${String(result.verifiedBytes)} bytes: those of the clone's allocated objects only, of ${SIZE}`,
      );
      assert.ok(grewBytes < MiB, `mountDir grew by ${grewBytes} bytes outside the mount points during the clone`);
      assert.ok((await readVolume('c1')).equals(snapModel), 'the clone holds the snapshot, byte for byte');
      const used = await usedBytes('c1');
      assert.ok(
        used > 0 && used <= expected.objects * 4 * MiB,
        `the clone uses ${used} bytes for ${expected.objects} objects of data (not the source's object of zeros)`,
      );

      // The same snapshot read in full by `rbd export` to /dev/null (the old way's first step), for comparison.
      const nul = openSync('/dev/null', 'w');
      const exportStarted = performance.now();
      try {
        const r = spawnSync('rbd', ['--conf', ceph.confPath, '--id', 'admin', 'export', '--no-progress', `${ceph.pool}/csrc@cs1`, '-'], {
          stdio: ['ignore', nul, 'pipe'],
          timeout: 120_000,
        });
        assert.equal(r.status, 0, r.stderr?.toString());
      } finally {
        closeSync(nul);
      }
      const exportMs = performance.now() - exportStarted;
      // The copy and its check alone (no job runner, no polls), onto a fresh image like the job's.
      await backend.create('c1d', SIZE);
      const device = await backend.attach('c1d');
      const signal = new AbortController().signal;
      const copyStarted = performance.now();
      let checkStarted = copyStarted;
      try {
        const source = await openCloneSource(ctx, 'csrc', 'cs1');
        try {
          const copied = await copyOnto(source, device, { fresh: true, signal });
          checkStarted = performance.now();
          await verifyCopy(device, copied, signal, backend.allocatedExtents('c1d'));
        } finally {
          await source.release();
        }
      } finally {
        await backend.release('c1d');
      }
      const checkMs = performance.now() - checkStarted;
      const copyMs = checkStarted - copyStarted;
      // Where the storage lists nothing allocated the check reads nothing; without the listing it reads the holes too: how
      // fast, on an empty 512 MiB image (which checks as empty both ways).
      await backend.create('c-empty', 512 * MiB);
      const empty = await backend.attach('c-empty');
      let emptyMs = 0;
      let listedMs = 0;
      try {
        const nothing = createHash('sha256').digest('hex');
        const report = { sizeBytes: 512 * MiB, deviceBytes: 512 * MiB, dataBytes: 0, contentSha256: nothing };
        const listedStarted = performance.now();
        assert.equal(await verifyCopy(empty, report, signal, backend.allocatedExtents('c-empty')), 0, 'nothing allocated, nothing read');
        listedMs = performance.now() - listedStarted;
        const emptyStarted = performance.now();
        assert.equal(await verifyCopy(empty, report, signal), 512 * MiB);
        emptyMs = performance.now() - emptyStarted;
      } finally {
        await backend.release('c-empty');
      }
      const s = (n: number) => `${(n / 1000).toFixed(2)} s`;
      t.diagnostic(
        `clone of a ${SIZE / MiB} MiB snapshot with ${expected.blocks} MiB of data: the job ${s(ms)} (with the runner's polls and ` +
          `mappings); its copy alone ${s(copyMs)}, its check ${s(checkMs)}; rbd export of the same snapshot to /dev/null: ` +
          `${s(exportMs)}; the check of an empty 512 MiB image ${s(emptyMs)} reading it (${(512 / (emptyMs / 1000)).toFixed(0)} MiB/s ` +
          `of holes), ${s(listedMs)} with the storage's listing`,
      );
    });

    it(
      "clones the volume itself through a temporary snapshot, removed after, with a dead run's leftover",
      { timeout: 300_000 },
      async () => {
        // What a clone killed on this node leaves: a temporary snapshot named after a process that is gone.
        const dead = spawnSync('true').pid;
        const leftover = `latch-backup-node-a-${dead}-0a0b0c`;
        await backend.createSnapshot('csrc', leftover);
        const { job, exports } = await clone('c2');
        assert.equal(job?.status.state, 'succeeded', job?.status.message);
        assert.equal(job?.status.result?.consistency, 'crash-consistent', 'set up for the clone, not mounted');
        assert.deepEqual(exports, []);
        assert.deepEqual(await snapshots('csrc'), ['cs1'], "the leftover and the clone's own temporary snapshot are gone");
        assert.ok((await readVolume('c2')).equals(liveModel), 'the clone holds the volume as it was, byte for byte');
        assert.ok((await usedBytes('c2')) <= dataOf(liveModel).objects * 4 * MiB);

        // A copy that fails (stopped before its first block) removes its temporary snapshot all the same.
        const source = await openCloneSource(ctx, 'csrc', undefined);
        assert.equal(source.consistency, 'idle');
        assert.equal((await snapshots('csrc')).length, 2, 'its temporary snapshot is there while it is read');
        const device = await backend.attach('c2');
        const stop = new AbortController();
        stop.abort(new Error('stopped for the test'));
        try {
          await assert.rejects(copyOnto(source, device, { fresh: false, signal: stop.signal }), /stopped for the test/);
        } finally {
          await source.release();
          await backend.release('c2');
        }
        assert.deepEqual(await snapshots('csrc'), ['cs1'], 'and gone after');
        assert.ok((await readVolume('c2')).equals(liveModel), 'nothing was written');
      },
    );

    it(
      'copies onto an image holding other bytes and larger than the source, and the check catches any difference',
      { timeout: 300_000 },
      async (t) => {
        // A repeat after a kill: NEW holds part of a copy and bytes where the source has zeros; and it is 8 MiB larger.
        await backend.create('c3', SIZE + 8 * MiB);
        const junk = Buffer.alloc(SIZE + 8 * MiB);
        await writeData('c3', 44 * MiB, snapModel.subarray(44 * MiB, 45 * MiB), junk);
        await writeData('c3', 30 * MiB + 5, randomBytes(3 * MiB), junk);
        await writeData('c3', SIZE + MiB, randomBytes(4096), junk);
        const signal = new AbortController().signal;
        const device = await backend.attach('c3');
        try {
          assert.equal(await backend.isUnwritten('c3'), false);
          const source = await openCloneSource(ctx, 'csrc', 'cs1');
          let copied;
          const started = performance.now();
          try {
            copied = await copyOnto(source, device, { fresh: false, allocated: backend.allocatedExtents('c3'), signal });
          } finally {
            await source.release();
          }
          const copiedAt = performance.now();
          assert.equal(copied.deviceBytes, SIZE + 8 * MiB);
          const read = await verifyCopy(device, copied, signal, backend.allocatedExtents('c3'));
          assert.ok(read < SIZE, `the check read ${read} bytes, those of c3's allocated objects`);
          t.diagnostic(
            `onto an image already written: the copy (holes zeroed) ${((copiedAt - started) / 1000).toFixed(2)} s, the check ` +
              `${((performance.now() - copiedAt) / 1000).toFixed(2)} s; rbd du then ${await usedBytes('c3')} bytes`,
          );

          // One byte off where the source has zeros, then past its size: each refused.
          const fd = openSync(device, 'r+');
          try {
            writeSync(fd, Buffer.from([1]), 0, 1, 31 * MiB);
            fsyncSync(fd);
            await assert.rejects(
              verifyCopy(device, copied, signal, backend.allocatedExtents('c3')),
              /does not read back as what was written/,
            );
            await assert.rejects(verifyCopy(device, copied, signal), /does not read back as what was written/);
            writeSync(fd, Buffer.from([0]), 0, 1, 31 * MiB);
            writeSync(fd, Buffer.from([1]), 0, 1, SIZE + 2 * MiB);
            fsyncSync(fd);
            await assert.rejects(
              verifyCopy(device, copied, signal, backend.allocatedExtents('c3')),
              new RegExp(`holds data at byte ${SIZE + 2 * MiB}, past the source's ${SIZE}`),
            );
            writeSync(fd, Buffer.from([0]), 0, 1, SIZE + 2 * MiB);
            fsyncSync(fd);
          } finally {
            closeSync(fd);
          }
          await verifyCopy(device, copied, signal);

          // Sources that make no sense are refused before anything is written past them.
          const fake = (pieces: ({ offset: number; data: Buffer } | { offset: number; zeros: number })[], sizeBytes = SIZE) => ({
            sizeBytes,
            consistency: 'snapshot' as const,
            reading: 'a test',
            pieces: (async function* () {
              yield* pieces;
            })(),
            release: async () => undefined,
          });
          await assert.rejects(copyOnto(fake([], SIZE + 16 * MiB), device, { fresh: false, signal }), /less than the source's/);
          await assert.rejects(
            copyOnto(fake([{ offset: MiB, data: Buffer.alloc(MiB, 1) }]), device, { fresh: false, signal }),
            /the clone's source gave 1048576 bytes at 1048576, where 0 of/,
          );
          await assert.rejects(
            copyOnto(fake([{ offset: 0, data: Buffer.alloc(1000, 1) }]), device, { fresh: false, signal }),
            /gave 1000 bytes at 0/,
          );
          await assert.rejects(copyOnto(fake([{ offset: 0, zeros: SIZE - MiB }]), device, { fresh: false, signal }), /ended at byte/);
        } finally {
          await backend.release('c3');
        }
        const bytes = await readVolume('c3');
        assert.ok(bytes.subarray(0, SIZE).equals(snapModel), 'the snapshot, byte for byte');
        assert.ok(
          bytes.subarray(SIZE).every((x) => x === 0),
          'zeros past it',
        );
        // Only what was there was zeroed: the objects of the data and of the earlier bytes, not all of the image.
        const objects = new Set<number>();
        for (const model of [snapModel, junk]) {
          for (let o = 0; o < model.length / (4 * MiB); o++)
            if (model.subarray(o * 4 * MiB, (o + 1) * 4 * MiB).some((x) => x !== 0)) objects.add(o);
        }
        const used = await usedBytes('c3');
        assert.ok(used <= objects.size * 4 * MiB, `the image uses ${used} bytes, at most its ${objects.size} objects written`);
      },
    );
  });

  it(
    'builds only on the very snapshot its previous backup was read from, not on one of its name taken again since',
    { timeout: 300_000 },
    async () => {
      const first = await backup('twin');
      const ids = await backend.snapshotIds('vol');
      assert.match(first.manifest.baseSnapshot?.id ?? '', /^[0-9a-f]+@\d+$/, 'the image ID and the snapshot ID');
      assert.deepEqual(first.manifest.baseSnapshot, { name: baseSnapshotName('twin'), id: ids.get(baseSnapshotName('twin')) });
      // Changed before a backup of the same name goes to another target: it takes the base of that name again.
      await write('vol', 30 * MiB, 64 * 1024);
      const other: BackupTarget = { type: 'dir', path: join(work, 'other-target'), keyFile: join(work, 'backup.key') };
      mkdirSync(other.path);
      const twin = await incrementalBackup(ctx, { target: other, volume: 'vol', name: 'twin', node: 'node-a' });
      assert.notEqual(twin.manifest.baseSnapshot?.id, first.manifest.baseSnapshot?.id, 'the base was taken again');
      await write('vol', 44 * MiB, 64 * 1024);
      // Built on the first twin through the second's snapshot, it would miss the change at 30 MiB.
      const next = await backup('after-twin');
      assert.ok('none' in next.base, JSON.stringify(next.base));
      assert.match(next.base.none, /snapshot latch-base-twin is not the one the previous backup twin was read from/);
      assert.ok((await restoredBytes('after-twin')).equals(model), 'it holds both changes');
    },
  );

  it('deletes the base snapshots with the volume, and refuses while another snapshot is there', { timeout: 120_000 }, async () => {
    await backend.createSnapshot('vol', 'mine');
    await assert.rejects(backend.delete('vol'), /has snapshot\(s\) latch-base-after-twin, mine/);
    await backend.deleteSnapshot('vol', 'mine');
    await backend.delete('vol');
    assert.equal(await backend.size('vol'), undefined, 'the image is gone');
  });
});

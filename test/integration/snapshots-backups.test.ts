// Snapshots and backups on real loop devices and filesystems (root): reflink snapshots on an xfs pool share space
// with their volume, sparse copies on ext4; a snapshot of a mounted volume taken while a writer runs is cut with the
// filesystem frozen, and is mountable and fsck-clean; `latch backup create` of a mounted volume (here, at once) and
// of an idle one (through a backup ticket and an in-process job runner), restored onto another node's loop device
// byte for byte; a volume in use on another node: a snapshot here is refused, a backup is asked of that node. With a
// backup key configured, as a cluster would have it: every manifest made through these paths is authenticated.
import assert from 'node:assert/strict';
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import {
  closeSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readFileSync,
  rmSync,
  statfsSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { LoopBackend } from '../../src/backend/loop.js';
import { listBackups, readManifest } from '../../src/backup/manifest.js';
import { restoreBackup } from '../../src/backup/restore.js';
import { verifyBackup } from '../../src/backup/verify.js';
import { backupCreate } from '../../src/cli/backup/create.js';
import { backupList } from '../../src/cli/backup/list.js';
import type { CommandIO } from '../../src/cli/io.js';
import { snapshotList } from '../../src/cli/snapshot/list.js';
import { parseConfig } from '../../src/config.js';
import { createContext, type Context } from '../../src/context.js';
import { StoreError } from '../../src/errors.js';
import { MAX_FINISHED_JOBS } from '../../src/ledger/arbitrate.js';
import { jobTicketId } from '../../src/ledger/ids.js';
import type { FinishedJob } from '../../src/ledger/types.js';
import { snapshotVolume } from '../../src/node/snapshot.js';
import { parseFilefrag } from '../../src/sys/clone.js';
import { withJobRunner } from '../fixtures/job-runner.js';
import { MemoryStore } from '../fixtures/memory-store.js';
import { trackChild } from '../fixtures/tracked-children.js';

const MiB = 1024 * 1024;
const notRoot = process.getuid?.() !== 0 ? 'needs root, loop devices and mkfs.xfs' : false;
const noXfs = !existsSync('/usr/sbin/mkfs.xfs') && !existsSync('/sbin/mkfs.xfs') ? 'needs mkfs.xfs (xfsprogs)' : false;

describe('parseFilefrag', () => {
  it('adds up extents and the shared ones in bytes', () => {
    const text = [
      'Filesystem type is: 58465342',
      'File size of b.img is 67108864 (65536 blocks of 1024 bytes)',
      ' ext:     logical_offset:        physical_offset: length:   expected: flags:',
      '   0:        0..    2047:         96..      2143:   2048:             shared',
      '   1:     2048..    3071:       2144..      3167:   1024:       536: ',
      '   2:     3072..    8191:       3168..      8287:   5120:             last,shared',
      'b.img: 1 extent found',
    ].join('\n');
    assert.deepEqual(parseFilefrag(text), { allocated: 8192 * 1024, shared: 7168 * 1024 });
    assert.equal(parseFilefrag('garbage'), undefined);
  });
});

/** Mounted scratch filesystems and loop devices, all under one temp dir, undone in reverse order. */
class Scratch {
  private made: string | undefined;
  private readonly mounts: string[] = [];

  /** Made on first use, so that a skipped suite leaves nothing behind. */
  get root(): string {
    this.made ??= mkdtempSync(`/tmp/latch-snapbak-${randomBytes(3).toString('hex')}-`);
    return this.made;
  }

  /** A fresh filesystem of `fsType` in a sparse file, mounted (through an autoclear loop device) at a new dir. */
  filesystem(name: string, fsType: 'xfs' | 'ext4', size = 1024 * MiB): string {
    const image = join(this.root, `${name}.fs`);
    writeFileSync(image, '');
    execFileSync('truncate', ['-s', String(size), image]);
    execFileSync(`mkfs.${fsType}`, fsType === 'xfs' ? ['-q', image] : ['-q', '-F', image]);
    const dir = join(this.root, name);
    mkdirSync(dir);
    this.mount(['-o', 'loop', image, dir], dir);
    return dir;
  }

  mount(args: string[], dir: string): void {
    execFileSync('mount', args);
    this.mounts.push(dir);
  }

  isMounted(dir: string): boolean {
    return this.mounts.includes(dir);
  }

  umount(dir: string): void {
    execFileSync('umount', [dir]);
    this.mounts.splice(this.mounts.indexOf(dir), 1);
  }

  cleanup(): void {
    if (this.made === undefined) return;
    // Best effort, every one of them: a mount a test already undid must not keep the others mounted.
    const attempt = (command: string, args: string[]) => {
      try {
        execFileSync(command, args, { stdio: 'ignore' });
        return true;
      } catch {
        return false;
      }
    };
    for (const dir of [...this.mounts].reverse()) {
      attempt('fsfreeze', ['--unfreeze', dir]);
      if (!attempt('umount', [dir])) attempt('umount', ['-l', dir]);
    }
    rmSync(this.root, { recursive: true, force: true });
  }
}

/** Writes random data at `offsetMiB` into a file, in place. */
function writeRandom(path: string, offsetMiB: number, lengthMiB: number): Buffer {
  const data = randomBytes(lengthMiB * MiB);
  const fd = openSync(path, 'r+');
  writeSync(fd, data, 0, data.length, offsetMiB * MiB);
  closeSync(fd);
  return data;
}

function usedBytes(dir: string): number {
  const s = statfsSync(dir);
  return (s.blocks - s.bfree) * s.bsize;
}

describe('loop snapshots', { skip: notRoot || noXfs }, () => {
  const scratch = new Scratch();
  after(() => scratch.cleanup());

  it('on an xfs pool: a reflink that costs only what changes afterwards, and reads back the old bytes', async () => {
    const pool = join(scratch.filesystem('xfs-pool', 'xfs'), 'pool');
    const backend = new LoopBackend({ poolDir: pool, maxSize: 1024 * MiB });
    await backend.create('vol', 256 * MiB);
    const before = writeRandom(backend.imagePath('vol'), 8, 32);
    execFileSync('sync', ['-f', pool]);
    const used0 = usedBytes(pool);

    const info = await backend.createSnapshot('vol', 'first');
    execFileSync('sync', ['-f', pool]);
    assert.equal(info.sharing, 'reflink');
    assert.equal(info.sizeBytes, 256 * MiB);
    assert.ok(usedBytes(pool) - used0 < 2 * MiB, `the snapshot took ${usedBytes(pool) - used0} bytes of the pool`);
    assert.ok((info.allocatedBytes ?? 0) >= 32 * MiB, 'it has the data allocated');
    assert.ok((info.exclusiveBytes ?? Infinity) < MiB, `all of it shared at first: ${info.exclusiveBytes}`);

    writeRandom(backend.imagePath('vol'), 8, 8);
    execFileSync('sync', ['-f', pool]);
    const [later] = await backend.listSnapshots('vol');
    const exclusive = later?.exclusiveBytes ?? 0;
    assert.ok(exclusive >= 8 * MiB && exclusive < 10 * MiB, `8 MiB rewritten in the volume are now the snapshot's alone: ${exclusive}`);
    const snapBytes = readFileSync(join(backend.snapshotDir('vol'), 'first.img'));
    assert.ok(snapBytes.subarray(8 * MiB, 40 * MiB).equals(before), 'the snapshot keeps the bytes of its moment');

    await assert.rejects(backend.createSnapshot('vol', 'first'), /already has a snapshot named first/);
    await assert.rejects(backend.delete('vol'), /has snapshot\(s\) first; delete them first/);
    await backend.deleteSnapshot('vol', 'first');
    await backend.deleteSnapshot('vol', 'first');
    assert.deepEqual(await backend.listSnapshots('vol'), []);
    await backend.delete('vol');
  });

  it('on an ext4 pool: a sparse copy, said so', async () => {
    const pool = join(scratch.filesystem('ext4-pool', 'ext4', 512 * MiB), 'pool');
    const backend = new LoopBackend({ poolDir: pool, maxSize: 1024 * MiB });
    await backend.create('vol', 128 * MiB);
    writeRandom(backend.imagePath('vol'), 4, 16);
    const info = await backend.createSnapshot('vol', 's1');
    assert.equal(info.sharing, 'copy');
    const allocated = info.allocatedBytes ?? 0;
    assert.ok(allocated >= 16 * MiB && allocated < 18 * MiB, `sparse: ${allocated} bytes allocated for 16 MiB of data in 128 MiB`);
    assert.equal(info.exclusiveBytes, allocated);
    assert.ok(readFileSync(join(backend.snapshotDir('vol'), 's1.img')).equals(readFileSync(backend.imagePath('vol'))));
    await backend.deleteSnapshot('vol', 's1');
  });
});

describe('snapshots and backups of volumes in use', { skip: notRoot || noXfs }, () => {
  const scratch = new Scratch();
  const store = new MemoryStore();
  let pool = '';
  let otherPool = '';
  let targetDir = '';
  // Every backup here is made and read with a backup key, as a configured cluster's are: through the CLI, a ticket
  // and the job runner, its manifest is authenticated.
  let keyFile = '';
  let mnt = '';
  let device = '';
  let ctx: Context;
  let io: CommandIO;
  let printed = '';

  const configFor = (node: string, poolDir: string) => {
    const dir = join(scratch.root, `state-${node}`);
    mkdirSync(dir, { recursive: true });
    const raw = {
      nodeName: node,
      poolDir,
      stateDir: dir,
      logFile: join(dir, 'latch.log'),
      backupTarget: { type: 'dir', path: targetDir, keyFile },
    };
    const file = join(dir, 'config.json');
    writeFileSync(file, JSON.stringify(raw));
    return { config: parseConfig(raw, file), file };
  };

  before(async () => {
    const fs = scratch.filesystem('xfs-pool', 'xfs');
    pool = join(fs, 'pool');
    otherPool = join(fs, 'pool-b');
    targetDir = join(scratch.root, 'target');
    mkdirSync(targetDir);
    keyFile = join(scratch.root, 'backup.key');
    writeFileSync(keyFile, `${randomBytes(48).toString('base64')}\n`, { mode: 0o600 });
    const { config, file } = configFor('node-a', pool);
    ctx = createContext(config, { store });
    io = {
      out: (text) => (printed += text),
      env: { LATCH_CONFIG: file },
      context: (c) => createContext(c, { store }),
    };
    await ctx.ledger.createVolume('vol', { sizeBytes: 256 * MiB, fsType: 'ext4' });
    await ctx.backend.create('vol', 256 * MiB);
    device = await ctx.backend.attach('vol');
    execFileSync('mkfs.ext4', ['-q', device]);
    mnt = join(scratch.root, 'mnt');
    mkdirSync(mnt);
    scratch.mount([device, mnt], mnt);
    writeFileSync(join(mnt, 'before.txt'), 'written before the snapshot\n');
    await setHolder('node-a', device);
  });
  after(async () => {
    // The mounts first (the volume's own among them), then its loop device, then the pool's filesystem.
    if (mnt && scratch.isMounted(mnt)) scratch.umount(mnt);
    await ctx?.backend.release('vol').catch(() => undefined);
    scratch.cleanup();
  });

  const readManifestOf = (name: string) => readManifest({ type: 'dir', path: targetDir, keyFile }, name);

  async function setHolder(node: string | undefined, dev?: string): Promise<void> {
    await ctx.ledger.update('vol', (doc) => {
      if (!doc) return doc;
      const nodes = node
        ? { [node]: { phase: 'attached' as const, readOnly: false, since: new Date().toISOString(), ...(dev && { device: dev }) } }
        : {};
      return { ...doc, status: { ...doc.status, state: node ? 'attached' : 'detached', currentNodes: node ? [node] : [], nodes } };
    });
  }

  it('a snapshot taken while a writer runs is frozen, mountable and fsck-clean; a leftover freeze is thawed first', async () => {
    const writer = spawn(
      'sh',
      ['-c', `i=0; while true; do i=$((i+1)); dd if=/dev/urandom of=${mnt}/w$((i%20)) bs=64k count=8 status=none; done`],
      {
        stdio: 'ignore',
      },
    );
    trackChild(writer);
    try {
      await new Promise((r) => setTimeout(r, 300));
      const { info, consistency } = await snapshotVolume(ctx, 'vol', 'busy');
      assert.equal(consistency, 'frozen');
      assert.equal(info.sharing, 'reflink');

      // A snapshot call killed while frozen leaves the filesystem frozen: the next one thaws it first.
      execFileSync('fsfreeze', ['--freeze', mnt]);
      const second = await snapshotVolume(ctx, 'vol', 'after-leftover');
      assert.equal(second.consistency, 'frozen');
      writeFileSync(join(mnt, 'after.txt'), 'the filesystem takes writes again\n');
    } finally {
      writer.kill('SIGKILL');
    }
    const snap = join(ctx.backend instanceof LoopBackend ? ctx.backend.snapshotDir('vol') : '', 'busy.img');
    const check = join(scratch.root, 'check.img');
    execFileSync('cp', ['--sparse=always', snap, check]);
    execFileSync('e2fsck', ['-fn', check], { stdio: 'ignore' });
    const look = join(scratch.root, 'look');
    mkdirSync(look);
    scratch.mount(['-o', 'loop,ro', check, look], look);
    assert.equal(readFileSync(join(look, 'before.txt'), 'utf8'), 'written before the snapshot\n');
    scratch.umount(look);

    printed = '';
    await snapshotList({ volume: 'vol', output: 'table' }, io);
    assert.match(printed, /busy\s+256 ?Mi\S*\s+reflink/);
  });

  it('backup create of the mounted volume goes through a frozen snapshot, which it removes; restored on another node byte for byte', async () => {
    // What a backup SIGKILLed on this node leaves: its temporary snapshot, named after its (now gone) process.
    const deadPid = spawnSync('true').pid;
    await (ctx.backend as LoopBackend).createSnapshot('vol', `latch-backup-node-a-${deadPid}-abcdef`);
    await (ctx.backend as LoopBackend).createSnapshot('vol', `latch-backup-node-b-${deadPid}-abcdef`);
    printed = '';
    await backupCreate({ volume: 'vol', name: 'online', output: 'table' }, io);
    assert.match(printed, /backup online of volume vol created .*\(frozen, from snapshot latch-backup-/);
    const snapshots = await (ctx.backend as LoopBackend).listSnapshots('vol');
    assert.deepEqual(
      snapshots.filter((s) => s.name.startsWith('latch-backup-')).map((s) => s.name),
      [`latch-backup-node-b-${deadPid}-abcdef`],
      "its own temporary snapshot and this node's dead one are gone; another node's is not this node's to judge",
    );
    await (ctx.backend as LoopBackend).deleteSnapshot('vol', `latch-backup-node-b-${deadPid}-abcdef`);
    const verified = await verifyBackup({ target: { type: 'dir', path: targetDir, keyFile }, name: 'online' });
    assert.deepEqual([verified.ok, verified.authenticated], [true, true]);
  });

  it('backup create beside the pod records its outcome in the ledger: a failure (a full target), then a success; backup list shows each; the history stays bounded', async () => {
    const full = join(scratch.root, 'full-target');
    mkdirSync(full);
    scratch.mount(['-t', 'tmpfs', '-o', 'size=256k,mode=0700', 'latch-test-full', full], full);
    const state = join(scratch.root, 'state-node-a');
    const fullFile = join(state, 'config-full.json');
    const logFile = join(state, 'latch.log');
    const raw = { nodeName: 'node-a', poolDir: pool, stateDir: state, logFile, backupTarget: { type: 'dir', path: full, keyFile } };
    writeFileSync(fullFile, JSON.stringify(raw));
    const beside: CommandIO = { ...io, env: { LATCH_CONFIG: fullFile } };
    // More than the 256 KiB target holds, whatever the earlier tests left on the volume.
    writeFileSync(join(mnt, 'incompressible.bin'), randomBytes(2 * MiB));
    // The history is full already: the oldest entry goes for each new one.
    const old = (i: number): FinishedJob => ({
      ticket: `backup-old-${i}`,
      type: 'backup',
      node: 'node-b',
      job: { kind: 'backup', backup: `old-${i}` },
      status: { state: 'succeeded', node: 'node-b', startedAt: '2026-01-01T00:00:00.000Z', attempts: 1, message: 'old' },
    });
    await ctx.ledger.update(
      'vol',
      (d) => d && { ...d, status: { ...d.status, jobs: Array.from({ length: MAX_FINISHED_JOBS }, (_, i) => old(i)) } },
    );
    const history = async () => (await ctx.ledger.get('vol'))?.status.jobs ?? [];
    const brief = (j: FinishedJob | undefined) =>
      j && [j.ticket, j.type, j.node, j.job, j.status.state, j.status.node, j.status.attempts, j.direct];

    await assert.rejects(backupCreate({ volume: 'vol', name: 'beside-1', output: 'table' }, beside), /backup target .* is full/);
    let jobs = await history();
    assert.equal(jobs.length, MAX_FINISHED_JOBS);
    assert.equal(jobs[0]?.ticket, 'backup-old-1');
    assert.deepEqual(brief(jobs.at(-1)), [
      jobTicketId('backup', 'vol', 'beside-1'),
      'backup',
      'node-a',
      { kind: 'backup', backup: 'beside-1' },
      'failed',
      'node-a',
      1,
      true,
    ]);
    assert.match(jobs.at(-1)?.status.message ?? '', /is full/);
    printed = '';
    await backupList({ output: 'table' }, beside);
    assert.match(printed, /^vol\s+failed\s+\S+\s+beside-1\s+node-a\s+.*is full/m);

    // Room for the whole 256 MiB volume: the writer test above leaves as much random data in its image as it had
    // time to write (ext4 writes its rewrites to other blocks), 64 MiB once the machine was idle enough.
    execFileSync('mount', ['-o', 'remount,size=320m', full]);
    printed = '';
    await backupCreate({ volume: 'vol', name: 'beside-2', output: 'table' }, beside);
    assert.match(printed, /backup beside-2 of volume vol created/);
    assert.doesNotMatch(printed, /not in the ledger/);
    jobs = await history();
    assert.equal(jobs.length, MAX_FINISHED_JOBS);
    assert.deepEqual(
      jobs.slice(-2).map((j) => [j.job, j.status.state, j.direct]),
      [
        [{ kind: 'backup', backup: 'beside-1' }, 'failed', true],
        [{ kind: 'backup', backup: 'beside-2' }, 'succeeded', true],
      ],
    );
    assert.equal(jobs.at(-1)?.status.result?.backup, 'beside-2');
    printed = '';
    await backupList({ output: 'table' }, beside);
    assert.match(printed, /^vol\s+succeeded\s+\S+\s+beside-2\s+node-a\s*$/m);

    // The ledger cannot be written once the backup is done: a success stands and says so, a failure fails with its
    // own message; both are logged.
    store.beforeWrite = (key) => {
      if (key === 'volumes/vol') throw new StoreError('the ledger is out of reach');
    };
    try {
      printed = '';
      await backupCreate({ volume: 'vol', name: 'beside-3', output: 'table' }, beside);
      assert.match(printed, /backup beside-3 of volume vol created/);
      assert.match(printed, /its outcome is not in the ledger's job history: the ledger is out of reach/);
      await assert.rejects(
        backupCreate({ volume: 'vol', name: 'beside-4', fromSnapshot: 'no-such-snapshot', output: 'table' }, beside),
        (err: Error) => /no-such-snapshot/.test(err.message) && !/ledger/.test(err.message),
      );
    } finally {
      store.beforeWrite = undefined;
    }
    const logged = readFileSync(logFile, 'utf8');
    assert.match(
      logged,
      /"backup":"beside-3","outcome":"succeeded","error":"its outcome could not be recorded in the ledger: the ledger is out of reach"/,
    );
    assert.match(logged, /"backup":"beside-4","outcome":"failed","error":"its outcome could not be recorded/);
    assert.equal((await history()).at(-1)?.status.result?.backup, 'beside-2', 'nothing was recorded while the ledger was out of reach');
    rmSync(join(mnt, 'incompressible.bin'));
    scratch.umount(full);
  });

  it('backup create of the idle volume (through a ticket: the agent reads the device it set up); a second one moves only the change; restore onto a loop device', async () => {
    scratch.umount(mnt);
    await ctx.backend.release('vol');
    await setHolder(undefined);
    const target = { type: 'dir' as const, path: targetDir, keyFile };

    printed = '';
    await withJobRunner(ctx, () => backupCreate({ volume: 'vol', name: 'idle-1', output: 'json' }, io));
    const first = JSON.parse(printed) as { outcome: string; job: { status: { state: string; result: { consistency: string } } } };
    assert.equal(first.outcome, 'finished');
    assert.equal(first.job.status.state, 'succeeded');
    assert.equal(first.job.status.result.consistency, 'idle');
    assert.match((await readManifestOf('idle-1')).source, /device \/dev\/loop\d+ of volume vol \(set up for this backup only\)/);
    assert.equal(await ctx.backend.findDevice('vol'), undefined, 'the device the agent set up is released');

    const image = (ctx.backend as LoopBackend).imagePath('vol');
    writeRandom(image, 100, 1);
    printed = '';
    await withJobRunner(ctx, () => backupCreate({ volume: 'vol', name: 'idle-2', output: 'json' }, io));
    const second = (JSON.parse(printed) as { job: { status: { result: { newChunks: number; newBytesStored: number } } } }).job.status
      .result;
    assert.equal(second.newChunks, 1, 'one 4 MiB chunk changed');
    assert.ok(second.newBytesStored <= 4.1 * MiB, `${second.newBytesStored} bytes written for a 1 MiB change`);

    // "Another node": its own pool, a volume of the same size set up as a loop device, restored onto the device.
    const other = new LoopBackend({ poolDir: otherPool, maxSize: 1024 * MiB });
    await other.create('copy', 256 * MiB);
    writeRandom(other.imagePath('copy'), 0, 8);
    const otherDevice = await other.attach('copy');
    try {
      const report = await restoreBackup({ target, name: 'idle-2', destination: otherDevice });
      assert.ok(report.holeChunks > 0);
      assert.equal(report.authenticated, true);
    } finally {
      await other.release('copy');
    }
    assert.ok(readFileSync(other.imagePath('copy')).equals(readFileSync(image)), 'byte for byte');
    execFileSync('e2fsck', ['-fn', other.imagePath('copy')], { stdio: 'ignore' });
    assert.deepEqual(
      (await listBackups(target, 'vol')).map((b) => [b.name, b.authenticated]),
      [
        ['online', true],
        ['idle-1', true],
        ['idle-2', true],
      ],
    );
  });

  it('refuses a volume in use on another node here (backup create asks that node), and a volume that does not exist', async () => {
    await setHolder('node-b', '/dev/loop99');
    await assert.rejects(snapshotVolume(ctx, 'vol', 'x'), /in use on node node-b: run "latch snapshot create vol x" on node node-b/);
    printed = '';
    await backupCreate({ volume: 'vol', name: 'for-b', output: 'table', wait: false }, io);
    assert.match(printed, /asked node node-b for it: ticket backup-[0-9a-f]{64}/);
    const asked = Object.values((await ctx.ledger.get('vol'))?.spec.tickets ?? {});
    assert.deepEqual(
      asked.map((t) => [t.type, t.nodeID, t.job]),
      [['backup', 'node-b', { kind: 'backup', backup: 'for-b' }]],
    );
    await ctx.ledger.removeTicket('vol', asked[0]?.id ?? '');
    await assert.rejects(snapshotVolume(ctx, 'nope', 'x'), /volume nope does not exist/);
    await setHolder(undefined);
  });
});

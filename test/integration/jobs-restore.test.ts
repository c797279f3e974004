// Restore, clone and manual attach through job tickets, done by real node agents (`node bin/latch agent`, one process
// per simulated node: node-a and node-b share the file-store ledger, the pool and the backup target) on real loop
// devices and ext4 filesystems (root): a backup taken on node-a restored on node-b byte for byte, a workload waiting
// while the restore runs; the restoring agent SIGKILLed midway and restarted; a corrupted chunk; clones from an idle
// volume, a snapshot and a volume in use (frozen); a manual attach with a mount; and the refusals.
import assert from 'node:assert/strict';
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { after, before, describe, it } from 'node:test';
import { LoopBackend } from '../../src/backend/loop.js';
import { chunkPath } from '../../src/backup/layout.js';
import { readManifest } from '../../src/backup/manifest.js';
import { backupCreate } from '../../src/cli/backup/create.js';
import type { CommandIO } from '../../src/cli/io.js';
import { volumeAttach, volumeDetach } from '../../src/cli/volume/attach.js';
import { volumeClone } from '../../src/cli/volume/clone.js';
import { volumeDelete } from '../../src/cli/volume/delete.js';
import { volumeRestore } from '../../src/cli/volume/restore.js';
import { parseConfig, type Config } from '../../src/config.js';
import { createContext, type Context } from '../../src/context.js';
import { finishedJob, isSatisfied } from '../../src/ledger/arbitrate.js';
import { jobTicketId } from '../../src/ledger/ids.js';
import type { VolumeDoc } from '../../src/ledger/types.js';
import { cloneTicketIds } from '../../src/node/jobs/clone.js';
import { trackChild } from '../fixtures/tracked-children.js';

const MiB = 1024 * 1024;
const BIN = resolve(__dirname, '..', '..', 'bin', 'latch');
const notRoot = process.getuid?.() !== 0 ? 'needs root, loop devices and mkfs.ext4' : false;
/** A safety net only (a hung agent must not hang the suite); nothing here asserts how long anything takes. */
const PATIENCE_MS = 120_000;

type Node = 'node-a' | 'node-b';

/** Two simulated nodes over one temp dir: their configs, their agents, and everything to undo. */
class TwoNodes {
  readonly root = mkdtempSync('/tmp/latch-jobs-restore-');
  readonly pool = join(this.root, 'pool');
  readonly target = join(this.root, 'target');
  /** Where a manual attach mounts on either node: <manualRoot>/<volume>. */
  readonly manualRoot = join(this.root, 'manual');
  private readonly files = new Map<Node, string>();
  private readonly configs = new Map<Node, Config>();
  private readonly agents = new Map<Node, ChildProcess>();
  private readonly mounts: string[] = [];
  printed = '';

  constructor() {
    mkdirSync(this.target);
    // The pool on xfs, which reflinks: a snapshot of a mounted volume is then cut at once, frozen (on a pool that
    // cannot reflink it is a whole-image copy, never made under freeze: crash-consistent).
    const poolImage = join(this.root, 'pool.xfs');
    writeFileSync(poolImage, '');
    execFileSync('truncate', ['-s', String(2048 * MiB), poolImage]);
    execFileSync('mkfs.xfs', ['-q', poolImage]);
    mkdirSync(this.pool);
    execFileSync('mount', ['-o', 'loop', poolImage, this.pool]);
    for (const node of ['node-a', 'node-b'] as const) {
      const raw = {
        nodeName: node,
        oneHost: true, // simulated nodes on one host: they share the pool and the ledger
        poolDir: this.pool,
        stateDir: join(this.root, 'state'),
        logFile: join(this.root, `${node}.log`),
        backupTarget: { type: 'dir', path: this.target },
        agent: { listen: '127.0.0.1:0', intervalSeconds: 1 },
        manualAttach: { mountRoot: this.manualRoot },
      };
      const file = join(this.root, `${node}.json`);
      writeFileSync(file, JSON.stringify(raw));
      this.files.set(node, file);
      this.configs.set(node, parseConfig(raw, file));
    }
  }

  ctx(node: Node = 'node-a'): Context {
    return createContext(this.configs.get(node) as Config);
  }

  /** A command's I/O as run on `node` (its configuration; what it prints goes to `printed`). */
  io(node: Node = 'node-a'): CommandIO {
    return { out: (text) => (this.printed += text), env: { LATCH_CONFIG: this.files.get(node) }, context: (c) => createContext(c) };
  }

  image(volume: string): string {
    return join(this.pool, `${volume}.img`);
  }

  startAgent(node: Node): ChildProcess {
    const child = spawn(process.execPath, [BIN, 'agent'], {
      env: { ...process.env, LATCH_CONFIG: this.files.get(node) },
      stdio: 'ignore',
    });
    trackChild(child);
    this.agents.set(node, child);
    return child;
  }

  agentOf(node: Node): ChildProcess {
    const child = this.agents.get(node);
    assert.ok(child, `no agent runs for ${node}`);
    return child;
  }

  async killAgent(node: Node, signal: NodeJS.Signals = 'SIGKILL'): Promise<void> {
    const child = this.agents.get(node);
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((r) => child.once('exit', r));
    child.kill(signal);
    await exited;
    this.agents.delete(node);
  }

  mount(args: string[], dir: string): void {
    mkdirSync(dir, { recursive: true });
    execFileSync('mount', [...args, dir]);
    this.mounts.push(dir);
  }

  umount(dir: string): void {
    execFileSync('umount', [dir]);
    this.mounts.splice(this.mounts.indexOf(dir), 1);
  }

  /** A volume with an ext4 filesystem holding `files` (made directly: the fixture, not what is tested). */
  async volumeWithFiles(name: string, sizeBytes: number, files: Record<string, Buffer | string>): Promise<void> {
    const ctx = this.ctx();
    await ctx.ledger.createVolume(name, { sizeBytes, fsType: 'ext4' });
    await ctx.backend.create(name, sizeBytes);
    const device = await ctx.backend.attach(name);
    try {
      // No lazy initialisation: nothing may write to the filesystem behind our back once it is unmounted.
      execFileSync('mkfs.ext4', ['-q', '-E', 'lazy_itable_init=0,lazy_journal_init=0', device]);
      const dir = join(this.root, `fill-${name}`);
      this.mount([device], dir);
      for (const [file, data] of Object.entries(files)) writeFileSync(join(dir, file), data);
      this.umount(dir);
    } finally {
      await ctx.backend.release(name);
    }
    await ctx.ledger.recordFilesystem(name, 'ext4');
  }

  /** Mounts a volume's image read-only (through its own loop device) and returns the file's bytes. */
  readFromImage(image: string, file: string): Buffer {
    const dir = join(this.root, `look-${randomBytes(3).toString('hex')}`);
    this.mount(['-o', 'loop,ro', image], dir);
    try {
      return readFileSync(join(dir, file));
    } finally {
      this.umount(dir);
    }
  }

  async cleanup(): Promise<void> {
    for (const node of [...this.agents.keys()]) await this.killAgent(node);
    const attempt = (command: string, args: string[]) => {
      try {
        execFileSync(command, args, { stdio: 'ignore' });
      } catch {
        // best effort
      }
    };
    // Our mounts (the agents' too: every mount point under our root), then every loop device over our pool's images.
    const ours = readFileSync('/proc/self/mountinfo', 'utf8')
      .split('\n')
      .map((line) => line.split(' ')[4] ?? '')
      .filter((point) => point.startsWith(`${this.root}/`));
    for (const dir of [...new Set([...this.mounts, ...ours])].reverse()) {
      if (dir === this.pool) continue; // last: the volumes' loop devices are over its files
      attempt('fsfreeze', ['--unfreeze', dir]);
      attempt('umount', ['-l', dir]);
    }
    const backend = new LoopBackend({ poolDir: this.pool, maxSize: 1024 ** 4 });
    for (const file of existsSync(this.pool) ? readdirSync(this.pool) : []) {
      if (file.endsWith('.img')) await backend.release(file.slice(0, -'.img'.length)).catch(() => undefined);
    }
    attempt('umount', [this.pool]);
    rmSync(this.root, { recursive: true, force: true });
  }
}

function sha256(path: string): string {
  return createHash('sha256').update(readFileSync(path)).digest('hex');
}

function fsckClean(image: string): void {
  execFileSync('e2fsck', ['-fn', image], { stdio: 'ignore' });
}

/** Waits (a ledger poll) until `test` holds for the volume's document; returns that document. */
async function until(ctx: Context, volume: string, what: string, test: (doc: VolumeDoc | undefined) => boolean): Promise<VolumeDoc> {
  const deadline = Date.now() + PATIENCE_MS;
  for (;;) {
    const doc = await ctx.ledger.get(volume);
    if (test(doc)) return doc as VolumeDoc;
    if (Date.now() > deadline) assert.fail(`gave up waiting for ${what}: ${JSON.stringify(doc?.status.tickets)}`);
    await sleep(50);
  }
}

/** Seconds between a finished job's start and its finish (figures for the log, never asserted). */
function jobSeconds(job: { status: { startedAt: string; finishedAt?: string } } | undefined): string {
  if (!job?.status.finishedAt) return '?';
  return ((Date.parse(job.status.finishedAt) - Date.parse(job.status.startedAt)) / 1000).toFixed(2);
}

/** A workload ticket of a pod on `node` (kubelet's attach would add it; no device is set up for it here). */
async function addWorkload(ctx: Context, volume: string, node: Node): Promise<string> {
  const id = `workload-test-${node}`;
  await ctx.ledger.addTicket(volume, {
    id,
    type: 'workload',
    nodeID: node,
    parameters: { readOnly: false },
    requestedBy: { pvName: volume },
  });
  return id;
}

describe('restore, clone and manual attach through the node agents', { skip: notRoot }, () => {
  let world: TwoNodes;
  const hello = 'hello from node-a\n';
  const payload = randomBytes(3 * MiB);

  before(async () => {
    assert.ok(existsSync(BIN), `${BIN} is missing: npm run build first`);
    world = new TwoNodes();
    world.startAgent('node-a');
    world.startAgent('node-b');
    await world.volumeWithFiles('src', 64 * MiB, { 'hello.txt': hello, 'payload.bin': payload });
    await backupCreate({ volume: 'src', name: 'b1', output: 'table' }, world.io('node-a'));
  });
  after(async () => {
    await world?.cleanup();
  });

  it('a backup taken on node-a restores on node-b byte for byte, mountable and fsck-clean; a workload waits until it is done', async (t) => {
    const ctx = world.ctx();
    const manifest = await readManifest({ type: 'dir', path: world.target }, 'b1');
    assert.equal(manifest.node, 'node-a');
    assert.equal(manifest.fsType, 'ext4', 'the manifest names the filesystem');

    world.printed = '';
    await volumeRestore({ name: 'dst', fromBackup: 'b1', node: 'node-b', wait: false }, world.io('node-a'));
    assert.match(world.printed, /restoring backup b1 \(volume src, 64Mi\) into new volume dst on node node-b/);
    const restoreId = jobTicketId('restore', 'dst', 'b1');
    const created = await ctx.ledger.get('dst');
    assert.equal(created?.spec.tickets[restoreId]?.type, 'restore', 'the volume came with its restore ticket');
    assert.equal(created?.spec.sizeBytes, 64 * MiB);
    const workload = await addWorkload(ctx, 'dst', 'node-a');

    let sawRestoreHeld = 0;
    const done = await until(ctx, 'dst', 'the restore to finish', (doc) => {
      if (doc?.spec.tickets[restoreId]) {
        sawRestoreHeld++;
        assert.equal(isSatisfied(doc, workload), false, 'the workload never has the volume while the restore ticket is there');
        if (doc.status.tickets[restoreId]?.job?.state !== 'succeeded') {
          assert.equal(doc.status.filesystem, undefined, 'no filesystem is recorded before the restore is done');
        }
      }
      return doc !== undefined && finishedJob(doc, restoreId) !== undefined;
    });
    assert.ok(sawRestoreHeld > 0);
    const finished = finishedJob(done, restoreId);
    assert.equal(finished?.status.state, 'succeeded', finished?.status.message);
    assert.equal(finished?.node, 'node-b');
    assert.ok(manifest.chunkListSha256, 'a new backup carries the chunk list checksum');
    assert.equal(finished?.status.result?.chunkListSha256, manifest.chunkListSha256);
    t.diagnostic(`restore of 64 MiB on node-b: ${jobSeconds(finished)} s from start to finish`);
    assert.equal(done.status.filesystem, 'ext4');
    await until(ctx, 'dst', 'the workload to be granted', (doc) => doc !== undefined && isSatisfied(doc, workload));
    await ctx.ledger.removeTicket('dst', workload);

    assert.equal(sha256(world.image('dst')), sha256(world.image('src')), 'byte for byte');
    fsckClean(world.image('dst'));
    assert.equal(world.readFromImage(world.image('dst'), 'hello.txt').toString(), hello);
    assert.ok(world.readFromImage(world.image('dst'), 'payload.bin').equals(payload));

    // Repeating the same restore is fine (nothing to do); restoring into a taken name is refused.
    world.printed = '';
    await volumeRestore({ name: 'dst', fromBackup: 'b1', wait: true }, world.io('node-b'));
    assert.match(world.printed, /volume dst was restored from backup b1 already/);
    await assert.rejects(
      volumeRestore({ name: 'src', fromBackup: 'b1', wait: true }, world.io()),
      /volume src already exists; a restore makes a new volume/,
    );
  });

  it('manual attach with --mount shows the files; detach unmounts, releases the device and removes the ticket', async () => {
    const ctx = world.ctx();
    const dir = join(world.manualRoot, 'dst');
    world.printed = '';
    await volumeAttach({ name: 'dst', node: 'node-b', mount: true }, world.io('node-a'));
    assert.match(world.printed, /volume dst \(\/dev\/loop\d+, ext4\) is mounted at .*manual\/dst/);
    assert.equal(readFileSync(join(dir, 'hello.txt'), 'utf8'), hello);
    const id = jobTicketId('manual', 'dst', 'manual');
    const doc = await ctx.ledger.get('dst');
    assert.equal(doc?.status.tickets[id]?.job?.state, 'succeeded');
    assert.equal(doc?.status.nodes['node-b']?.phase, 'attached');
    const device = doc?.status.nodes['node-b']?.device ?? '';

    world.printed = '';
    await volumeDetach({ name: 'dst' }, world.io('node-a'));
    assert.match(world.printed, /volume dst detached from node node-b/);
    assert.equal(readFileSync('/proc/self/mountinfo', 'utf8').includes(` ${dir} `), false, 'unmounted');
    assert.equal(await ctx.backend.findDevice('dst'), undefined, `${device} released`);
    const after = await ctx.ledger.get('dst');
    assert.deepEqual([Object.keys(after?.spec.tickets ?? {}), Object.keys(after?.status.nodes ?? {})], [[], []]);
    await assert.rejects(
      volumeDetach({ name: 'dst' }, world.io()),
      /volume dst has no manual attach \(latch volume attach\); nothing to detach/,
    );

    // Read-only: the mount refuses writes.
    await volumeAttach({ name: 'dst', node: 'node-b', mount: true, readOnly: true }, world.io('node-a'));
    assert.throws(() => writeFileSync(join(dir, 'new.txt'), 'x'), /EROFS/);
    await volumeDetach({ name: 'dst', node: 'node-b' }, world.io());
  });

  it('the restoring agent SIGKILLed midway and restarted: the restore completes, and the volume is only usable after', async (t) => {
    const ctx = world.ctx();
    await world.volumeWithFiles('big', 256 * MiB, { 'random.bin': randomBytes(160 * MiB), 'hello.txt': hello });
    await backupCreate({ volume: 'big', name: 'big-1', output: 'table' }, world.io('node-a'));
    const restoreId = jobTicketId('restore', 'big-copy', 'big-1');
    await volumeRestore({ name: 'big-copy', fromBackup: 'big-1', node: 'node-b', wait: false }, world.io('node-a'));

    // Stop the agent as soon as the restore has written some data (the image file gains blocks), then kill it.
    const image = world.image('big-copy');
    const deadline = Date.now() + PATIENCE_MS;
    while (!(existsSync(image) && statSync(image).blocks * 512 > 16 * MiB)) {
      assert.ok(Date.now() < deadline, 'the restore never started writing');
      await sleep(2);
    }
    const agentB = world.agentOf('node-b');
    agentB.kill('SIGSTOP');
    t.diagnostic(`stopped with ${Math.round((statSync(image).blocks * 512) / MiB)} MiB of 256 MiB written`);
    const midway = await ctx.ledger.get('big-copy');
    assert.equal(midway?.status.tickets[restoreId]?.job?.state, 'running', 'stopped midway');
    assert.equal(midway?.status.filesystem, undefined);
    const workload = await addWorkload(ctx, 'big-copy', 'node-a');
    assert.equal(isSatisfied((await ctx.ledger.get('big-copy')) as VolumeDoc, workload), false, 'the workload waits');
    await world.killAgent('node-b');
    assert.notEqual(sha256(image), sha256(world.image('big')), 'the copy is incomplete');
    const killed = await ctx.ledger.get('big-copy');
    assert.equal(isSatisfied(killed as VolumeDoc, workload), false, 'a killed restore still keeps the workload off');
    assert.equal(killed?.status.tickets[restoreId]?.job?.state, 'running');

    world.startAgent('node-b');
    const done = await until(ctx, 'big-copy', 'the restore to finish', (doc) => {
      if (doc?.spec.tickets[restoreId]) assert.equal(isSatisfied(doc, workload), false);
      return doc !== undefined && finishedJob(doc, restoreId) !== undefined;
    });
    const finished = finishedJob(done, restoreId);
    assert.equal(finished?.status.state, 'succeeded', finished?.status.message);
    assert.equal(finished?.status.attempts, 2, 'redone from the start by the restarted agent');
    t.diagnostic(`the second attempt took ${jobSeconds(finished)} s`);
    await until(ctx, 'big-copy', 'the workload to be granted', (doc) => doc !== undefined && isSatisfied(doc, workload));
    await ctx.ledger.removeTicket('big-copy', workload);
    assert.equal(sha256(image), sha256(world.image('big')), 'byte for byte after the restart');
    fsckClean(image);
    assert.equal(world.readFromImage(image, 'hello.txt').toString(), hello);
  });

  it('a corrupted backup chunk: the restore fails clearly and the volume stays blocked; repaired, the restore is run again', async () => {
    const ctx = world.ctx();
    const target = { type: 'dir' as const, path: world.target };
    const manifest = await readManifest(target, 'b1');
    const hash = manifest.chunks.find((c) => c !== null) ?? '';
    const chunk = chunkPath(target, hash);
    const good = readFileSync(chunk);
    writeFileSync(chunk, 'junk');
    try {
      await assert.rejects(
        volumeRestore({ name: 'bad', fromBackup: 'b1', node: 'node-b', wait: true }, world.io('node-a')),
        /chunk \d+ \(\w+\) is corrupt .*must not be used; volume bad is incomplete and keeps its ticket so that nothing uses it: run `latch volume restore bad --from-backup b1` again, or delete it/,
      );
      await assert.rejects(volumeRestore({ name: 'bad2', fromBackup: 'b1', node: 'node-b', wait: true }, world.io('node-a')), /is corrupt/);
    } finally {
      writeFileSync(chunk, good);
    }
    const id = jobTicketId('restore', 'bad', 'b1');
    const failed = await ctx.ledger.get('bad');
    assert.equal(failed?.status.tickets[id]?.job?.state, 'failed', 'the ticket stays');
    assert.equal(failed?.status.filesystem, undefined);
    assert.equal(await ctx.backend.findDevice('bad'), undefined, 'its device was released');
    const workload = await addWorkload(ctx, 'bad', 'node-a');
    assert.equal(isSatisfied((await ctx.ledger.get('bad')) as VolumeDoc, workload), false, 'no workload gets the half-made volume');
    await ctx.ledger.removeTicket('bad', workload);

    // The chunk repaired, the same restore again: it succeeds on the node it was asked for.
    world.printed = '';
    await volumeRestore({ name: 'bad', fromBackup: 'b1', wait: true }, world.io('node-a'));
    assert.match(world.printed, /restored backup b1 \(volume src\) onto volume bad: .*checksum verified, ext4 filesystem/);
    assert.equal(finishedJob((await ctx.ledger.get('bad')) as VolumeDoc, id)?.node, 'node-b');
    assert.equal(sha256(world.image('bad')), sha256(world.image('src')));

    // The other failed one is deleted: its ticket only guarded it.
    await volumeDelete({ name: 'bad2' }, world.io());
    assert.equal(await ctx.ledger.get('bad2'), undefined);
    assert.equal(existsSync(world.image('bad2')), false);
  });

  it('clones an idle volume and a snapshot byte for byte, and a volume in use with its filesystem frozen', async () => {
    const ctx = world.ctx();
    // Idle, on node-b: read through a snapshot of its device set up there for the clone's source ticket.
    world.printed = '';
    await volumeClone({ source: 'src', name: 'c-idle', node: 'node-b', wait: true }, world.io('node-a'));
    assert.match(world.printed, /cloned src \(crash-consistent\) into c-idle: .* verified, ext4 filesystem/);
    assert.equal(sha256(world.image('c-idle')), sha256(world.image('src')), 'byte for byte');
    const ids = cloneTicketIds({ source: 'src', target: 'c-idle' });
    // The source's ticket ends once its agent sees the target's job done.
    const srcDoc = await until(ctx, 'src', 'the source ticket to end', (doc) => doc !== undefined && !doc.spec.tickets[ids.source]);
    const cloneDoc = await ctx.ledger.get('c-idle');
    assert.equal(finishedJob(srcDoc, ids.source)?.status.state, 'succeeded', 'the source was held, then let go');
    assert.deepEqual([Object.keys(srcDoc?.spec.tickets ?? {}), Object.keys(srcDoc?.status.nodes ?? {})], [[], []]);
    assert.equal(cloneDoc?.status.filesystem, 'ext4');
    assert.deepEqual(Object.keys(cloneDoc?.spec.tickets ?? {}), []);

    // From a snapshot: the snapshot's bytes, not the volume's later ones.
    await (ctx.backend as LoopBackend).createSnapshot('src', 's1');
    const snapshotImage = join((ctx.backend as LoopBackend).snapshotDir('src'), 's1.img');
    const dir = join(world.root, 'change-src');
    const device = await ctx.backend.attach('src');
    world.mount([device], dir);
    writeFileSync(join(dir, 'later.txt'), 'written after the snapshot\n');
    world.umount(dir);
    await ctx.backend.release('src');
    await volumeClone({ source: 'src', name: 'c-snap', fromSnapshot: 's1', wait: true }, world.io('node-a'));
    assert.equal(sha256(world.image('c-snap')), sha256(snapshotImage), 'the snapshot, byte for byte');
    assert.notEqual(sha256(world.image('c-snap')), sha256(world.image('src')));

    // In use: attached by hand and mounted on node-a with a writer running; the clone runs there, frozen.
    const mnt = join(world.manualRoot, 'src');
    await volumeAttach({ name: 'src', node: 'node-a', mount: true }, world.io('node-b'));
    const writer = spawn(
      'sh',
      ['-c', `i=0; while true; do i=$((i+1)); dd if=/dev/urandom of=${mnt}/w$((i%10)) bs=64k count=4 status=none; done`],
      {
        stdio: 'ignore',
      },
    );
    trackChild(writer);
    try {
      world.printed = '';
      await volumeClone({ source: 'src', name: 'c-busy', wait: true }, world.io('node-b'));
      assert.match(world.printed, /cloning src \(64Mi\) into new volume c-busy on node node-a/);
      assert.match(world.printed, /cloned src \(frozen\) into c-busy/);
    } finally {
      writer.kill('SIGKILL');
    }
    await volumeDetach({ name: 'src' }, world.io());
    fsckClean(world.image('c-busy'));
    assert.equal(world.readFromImage(world.image('c-busy'), 'hello.txt').toString(), hello);
    assert.equal(world.readFromImage(world.image('c-busy'), 'later.txt').toString(), 'written after the snapshot\n');
    assert.deepEqual(
      await (ctx.backend as LoopBackend).listSnapshots('src').then((l) => l.map((s) => s.name)),
      ['s1'],
      'no temporary snapshot left',
    );
  });

  it('refuses bad input clearly, leaving no volume behind', async () => {
    const ctx = world.ctx();
    await assert.rejects(volumeRestore({ name: 'r1', fromBackup: 'nope', wait: true }, world.io()), /backup nope does not exist in /);
    writeFileSync(join(world.target, 'backups', 'broken.json'), '{"format": "latch-backup/v1", "checksum": "00"}\n');
    await assert.rejects(
      volumeRestore({ name: 'r1', fromBackup: 'broken', wait: true }, world.io()),
      /the manifest of backup broken .* is corrupted: its checksum does not match; this backup cannot be used/,
    );
    assert.equal(await ctx.ledger.get('r1'), undefined, 'no volume was made');

    await assert.rejects(volumeClone({ source: 'ghost', name: 'c1', wait: true }, world.io()), /volume ghost does not exist/);
    await assert.rejects(
      volumeClone({ source: 'src', name: 'c1', fromSnapshot: 'nope', wait: true }, world.io()),
      /volume src has no snapshot named nope \(latch snapshot list src\)/,
    );
    world.printed = '';
    await volumeClone({ source: 'src', name: 'c-idle', wait: true }, world.io());
    assert.match(world.printed, /volume c-idle was cloned from src already/, 'the same clone again: nothing to do');
    await assert.rejects(
      volumeClone({ source: 'dst', name: 'c-idle', wait: true }, world.io()),
      /volume c-idle already exists; a clone makes a new volume/,
    );
    assert.equal(await ctx.ledger.get('c1'), undefined, 'no volume was made');

    // Checked by the agent: the job fails, and its ticket goes. A file where the mount point goes; a mount there.
    const file = join(world.manualRoot, 'dst');
    mkdirSync(world.manualRoot, { recursive: true, mode: 0o700 });
    writeFileSync(file, 'not a directory');
    await assert.rejects(
      volumeAttach({ name: 'dst', node: 'node-b', mount: true }, world.io('node-a')),
      /the mount point .*manual\/dst is not a directory: refused, nothing mounted/,
    );
    rmSync(file);
    world.mount(['-t', 'tmpfs', '-o', 'mode=0700', 'tmpfs'], file);
    await assert.rejects(
      volumeAttach({ name: 'dst', node: 'node-a', mount: true }, world.io('node-a')),
      /manual\/dst is already a mount point \(tmpfs\); not mounting volume dst over it/,
    );
    world.umount(file);
    const doc = await ctx.ledger.get('dst');
    assert.deepEqual(Object.keys(doc?.spec.tickets ?? {}), [], 'no manual ticket left');
    await assert.rejects(volumeDetach({ name: 'src' }, world.io()), /volume src has no manual attach/);
    await assert.rejects(volumeAttach({ name: 'ghost', node: 'node-a' }, world.io()), /volume ghost does not exist/);
  });
});

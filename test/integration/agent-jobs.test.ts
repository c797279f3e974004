// The node agent's jobs end to end (root, real loop devices and filesystems): `latch agent` runs as a process on two
// simulated nodes (two configs, node-a and node-b, sharing the file-store ledger and the pool), and the commands run
// as processes too. A snapshot of an idle volume through the auto-attach flow; a snapshot of a volume in use on
// node-b asked from node-a, taken by node-b's agent with the filesystem frozen while a writer runs; a backup through
// a ticket; a workload ticket preempting a backup that holds an idle volume; a second agent for a node refused; and
// the agent SIGKILLed at several points of a snapshot job and of a backup job, restarted: the job converges, the
// lists never show a half-made snapshot or backup, and no ticket, device or hold is left over.
import assert from 'node:assert/strict';
import { execFileSync, spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import {
  closeSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { after, before, describe, it } from 'node:test';
import type { LoopBackend } from '../../src/backend/loop.js';
import { chunkListSha256OfImage, listBackups } from '../../src/backup/manifest.js';
import { verifyBackup } from '../../src/backup/verify.js';
import { jobRequest } from '../../src/jobs/request.js';
import { parseConfig, type Config } from '../../src/config.js';
import { createContext, type Context } from '../../src/context.js';
import { finishedJob } from '../../src/ledger/arbitrate.js';
import type { JobSpec, VolumeDoc } from '../../src/ledger/types.js';
import { bundleForNode } from '../fixtures/bundle.js';
import { checkInvariants } from '../fixtures/ledger-invariants.js';
import { trackChild } from '../fixtures/tracked-children.js';

const MiB = 1024 * 1024;
const skip = process.getuid?.() !== 0 ? 'needs root: loop devices, mkfs, mount and fsfreeze' : false;
/** A safety net for waiting on the agents (not an assertion about speed): a stuck job fails the test here. */
const PATIENCE_MS = 120_000;

interface Node {
  name: string;
  file: string;
  config: Config;
  ctx: Context;
  agent?: ChildProcess;
  stderr: string;
}

describe('the node agent runs jobs through tickets', { skip }, () => {
  let root = '';
  let latchJs = '';
  let target = '';
  const nodes: Record<'a' | 'b', Node> = {} as Record<'a' | 'b', Node>;
  const mounts: string[] = [];
  let poolMount: string | undefined;

  function makeNode(name: string): Node {
    const raw = {
      nodeName: name,
      oneHost: true,
      poolDir: join(root, 'pool'),
      // The file store lives in stateDir: the simulated nodes share it (their locks are named after the node).
      stateDir: join(root, 'state'),
      logFile: join(root, `${name}.log`),
      backupTarget: { type: 'dir', path: target },
      agent: { listen: '127.0.0.1:0', intervalSeconds: 1 },
    };
    const file = join(root, `${name}.json`);
    writeFileSync(file, JSON.stringify(raw));
    const config = parseConfig(raw, file);
    return { name, file, config, ctx: createContext(config), stderr: '' };
  }

  function latch(node: Node, args: string[]): { status: number | null; stdout: string; stderr: string } {
    const r = spawnSync(process.execPath, [latchJs, ...args], {
      env: { ...process.env, LATCH_CONFIG: node.file },
      encoding: 'utf8',
      timeout: PATIENCE_MS,
    });
    return { status: r.status, stdout: r.stdout, stderr: r.stderr };
  }

  function startAgent(node: Node): ChildProcess {
    const child = spawn(process.execPath, [latchJs, 'agent'], {
      env: { ...process.env, LATCH_CONFIG: node.file },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    trackChild(child);
    child.stderr?.on('data', (chunk: Buffer) => (node.stderr += chunk.toString()));
    node.agent = child;
    return child;
  }

  async function stopAgent(node: Node, signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
    const child = node.agent;
    node.agent = undefined;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((resolve) => child.once('exit', resolve));
    child.kill(signal);
    await exited;
  }

  async function waitFor<T>(what: string, probe: () => Promise<T | undefined | false>): Promise<T> {
    const deadline = Date.now() + PATIENCE_MS;
    for (;;) {
      const value = await probe();
      if (value !== undefined && value !== false) return value;
      if (Date.now() > deadline) {
        throw new Error(`waited too long for ${what}; agent stderr: ${nodes.a.stderr} ${nodes.b.stderr}`);
      }
      await sleep(50);
    }
  }

  const doc = async (volume: string): Promise<VolumeDoc> => {
    const d = await nodes.a.ctx.ledger.get(volume);
    assert.ok(d, `volume ${volume} exists`);
    return d;
  };
  const backend = () => nodes.a.ctx.backend as LoopBackend;
  const sha = (path: string) => createHash('sha256').update(readFileSync(path)).digest('hex');

  /** An idle volume whose image holds random data in a few places (and an ext4 filesystem when asked). */
  async function idleVolume(name: string, sizeMiB: number, dataMiB = 8): Promise<void> {
    await nodes.a.ctx.ledger.createVolume(name, { sizeBytes: sizeMiB * MiB, fsType: 'ext4' });
    await backend().create(name, sizeMiB * MiB);
    const fd = openSync(backend().imagePath(name), 'r+');
    for (let at = 1; at + dataMiB < sizeMiB; at += Math.max(dataMiB * 2, Math.floor(sizeMiB / 4))) {
      writeSync(fd, randomBytes(dataMiB * MiB), 0, dataMiB * MiB, at * MiB);
    }
    closeSync(fd);
  }

  /** Adds a job ticket as the commands do (jobRequest + requestJob), for the given node. */
  async function ask(volume: string, job: JobSpec, node: Node): Promise<string> {
    const request = jobRequest(node.ctx, volume, job, node.name);
    await node.ctx.ledger.requestJob(volume, request);
    return request.id;
  }

  /** The volume is back to idle: no ticket, no hold, no device; the job's outcome is in status.jobs. */
  async function assertSettled(volume: string, ticket: string): Promise<void> {
    const d = await doc(volume);
    assert.deepEqual(Object.keys(d.spec.tickets), [], 'no ticket left');
    assert.deepEqual(d.status.nodes, {}, 'no node holds it');
    assert.equal(d.status.state, 'detached');
    assert.equal(await backend().findDevice(volume), undefined, 'no loop device left');
    assert.equal(finishedJob(d, ticket)?.status.state, 'succeeded', JSON.stringify(finishedJob(d, ticket)));
  }

  before(async () => {
    root = mkdtempSync(`/tmp/latch-agent-jobs-${randomBytes(3).toString('hex')}-`);
    target = join(root, 'target');
    mkdirSync(target);
    // The pool on xfs, which reflinks: a snapshot of a mounted volume is then cut at once, frozen (on a pool that
    // cannot reflink it is a whole-image copy, never made under freeze: crash-consistent).
    const poolImage = join(root, 'pool.xfs');
    writeFileSync(poolImage, '');
    execFileSync('truncate', ['-s', String(1024 * MiB), poolImage]);
    execFileSync('mkfs.xfs', ['-q', poolImage]);
    mkdirSync(join(root, 'pool'));
    execFileSync('mount', ['-o', 'loop', poolImage, join(root, 'pool')]);
    poolMount = join(root, 'pool');
    latchJs = await bundleForNode('src/bin.ts', join(root, 'latch.js'));
    nodes.a = makeNode('node-a');
    nodes.b = makeNode('node-b');
  });

  after(async () => {
    await stopAgent(nodes.a, 'SIGKILL').catch(() => undefined);
    await stopAgent(nodes.b, 'SIGKILL').catch(() => undefined);
    for (const dir of mounts.reverse()) {
      spawnSync('fsfreeze', ['--unfreeze', dir]);
      if (spawnSync('umount', [dir]).status !== 0) spawnSync('umount', ['-l', dir]);
    }
    // Only the volumes of this test's pool.
    if (nodes.a)
      for (const v of (await nodes.a.ctx.ledger.list().catch(() => undefined))?.docs ?? [])
        await backend()
          .release(v.name)
          .catch(() => undefined);
    if (poolMount && spawnSync('umount', [poolMount]).status !== 0) spawnSync('umount', ['-l', poolMount]);
    if (root) rmSync(root, { recursive: true, force: true });
  });

  it('a second agent for the same node exits with a clear message', async () => {
    startAgent(nodes.a);
    await waitFor(
      'the agent to start',
      async () => existsSync(nodes.a.config.logFile) && readFileSync(nodes.a.config.logFile, 'utf8').includes('"agent":"start"'),
    );
    const second = latch(nodes.a, ['agent', '--once']);
    assert.equal(second.status, 1);
    assert.match(second.stderr, /another latch agent is already running for node node-a .*one agent per node/);
    await stopAgent(nodes.a);
  });

  it('snapshot of an idle volume: auto-attached on the requesting node, snapshotted, released, ticket gone, outcome kept', async () => {
    await idleVolume('idle', 64);
    startAgent(nodes.a);
    try {
      const r = latch(nodes.a, ['snapshot', 'create', 'idle', 's1']);
      assert.equal(r.status, 0, r.stderr);
      assert.match(r.stdout, /^snapshot s1 of volume idle created \(.*, 64Mi, idle\)\n$/);
    } finally {
      await stopAgent(nodes.a);
    }
    const ticket = jobRequest(nodes.a.ctx, 'idle', { kind: 'snapshot', snapshot: 's1' }, 'node-a').id;
    await assertSettled('idle', ticket);
    const done = finishedJob(await doc('idle'), ticket);
    assert.equal(done?.node, 'node-a');
    assert.equal(done?.status.attempts, 1);
    assert.equal(sha(join(backend().snapshotDir('idle'), 's1.img')), sha(backend().imagePath('idle')), 'the snapshot holds the image');
    // The same name again: refused (taken), nothing asked.
    const again = latch(nodes.a, ['snapshot', 'create', 'idle', 's1']);
    assert.equal(again.status, 1);
    assert.match(again.stderr, /already has a snapshot named s1/);
  });

  it('no agent on the node: the request says so and takes its ticket back', async () => {
    // --node names a node with no agent; the request gives up after the pickup time (30 s).
    const r = latch(nodes.a, ['snapshot', 'create', 'idle', 'nobody', '--node', 'node-b']);
    assert.equal(r.status, 1);
    assert.match(r.stderr, /no latch agent on node node-b took the job up in 30 s: is `latch agent` running there\?/);
    assert.deepEqual(Object.keys((await doc('idle')).spec.tickets), []);
  });

  it('snapshot of a volume in use on node-b, asked from node-a: node-b freezes it while a writer runs; mountable, fsck-clean', async () => {
    const volume = 'busy';
    await nodes.b.ctx.ledger.createVolume(volume, { sizeBytes: 128 * MiB, fsType: 'ext4' });
    // A pod on node-b: its workload ticket granted there, the device set up and mounted, a writer running.
    const workload = {
      id: 'workload-busy-b',
      type: 'workload' as const,
      nodeID: 'node-b',
      parameters: { readOnly: false },
      requestedBy: { pvName: volume },
    };
    await nodes.b.ctx.ledger.addTicket(volume, workload);
    await nodes.b.ctx.ledger.claimGrant(volume, 'node-b');
    await nodes.b.ctx.backend.create(volume, 128 * MiB);
    const device = await nodes.b.ctx.backend.attach(volume);
    await nodes.b.ctx.ledger.recordDevice(volume, 'node-b', device);
    execFileSync('mkfs.ext4', ['-q', device]);
    const mnt = join(root, 'mnt-busy');
    mkdirSync(mnt);
    execFileSync('mount', [device, mnt]);
    mounts.push(mnt);
    writeFileSync(join(mnt, 'before.txt'), 'written before the snapshot\n');
    const writer = spawn(
      'sh',
      ['-c', `i=0; while true; do i=$((i+1)); dd if=/dev/urandom of=${mnt}/w$((i%20)) bs=64k count=8 status=none; done`],
      {
        stdio: 'ignore',
      },
    );
    trackChild(writer);
    startAgent(nodes.b);
    let r;
    try {
      r = latch(nodes.a, ['snapshot', 'create', volume, 'hot', '-o', 'json']);
    } finally {
      writer.kill('SIGKILL');
      await stopAgent(nodes.b);
    }
    assert.equal(r.status, 0, r.stderr);
    const result = JSON.parse(r.stdout) as {
      outcome: string;
      node: string;
      job: { node: string; status: { result: { consistency: string } } };
    };
    assert.equal(result.outcome, 'finished');
    assert.equal(result.job.node, 'node-b', "done by node-b's agent");
    assert.equal(result.job.status.result.consistency, 'frozen');
    const d = await doc(volume);
    assert.deepEqual(Object.keys(d.spec.tickets), [workload.id], 'the pod keeps its ticket, the job ticket is gone');
    assert.equal(d.status.nodes['node-b']?.phase, 'attached', "the pod's device was not cut");
    assert.equal(await nodes.b.ctx.backend.findDevice(volume), device);
    writeFileSync(join(mnt, 'after.txt'), 'the filesystem takes writes again\n');

    const check = join(root, 'check.img');
    execFileSync('cp', ['--sparse=always', join(backend().snapshotDir(volume), 'hot.img'), check]);
    execFileSync('e2fsck', ['-fn', check], { stdio: 'ignore' });
    const look = join(root, 'look');
    mkdirSync(look);
    execFileSync('mount', ['-o', 'loop,ro', check, look]);
    try {
      assert.equal(readFileSync(join(look, 'before.txt'), 'utf8'), 'written before the snapshot\n');
    } finally {
      execFileSync('umount', [look]);
    }
  });

  it('backup of an idle volume asked from node-b for node-a (--node): done by node-a through a ticket, byte for byte', async () => {
    startAgent(nodes.a);
    let r;
    try {
      r = latch(nodes.b, ['backup', 'create', 'idle', 'idle-b1', '--node', 'node-a']);
    } finally {
      await stopAgent(nodes.a);
    }
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /^backup idle-b1 of volume idle created \(idle\): 64Mi, \d+ new chunk\(s\)/);
    const ticket = jobRequest(nodes.a.ctx, 'idle', { kind: 'backup', backup: 'idle-b1' }, 'node-a').id;
    await assertSettled('idle', ticket);
    const [listed] = await listBackups({ type: 'dir', path: target }, 'idle');
    assert.equal(listed?.manifest?.chunkListSha256, await chunkListSha256OfImage(backend().imagePath('idle')));
    assert.equal((await verifyBackup({ target: { type: 'dir', path: target }, name: 'idle-b1' })).ok, true);
  });

  it('a workload ticket arriving while a backup holds an idle volume preempts it; the backup is redone after', async () => {
    await idleVolume('pre', 512, 64);
    const ticket = await ask('pre', { kind: 'backup', backup: 'pre-1' }, nodes.a);
    startAgent(nodes.a);
    try {
      // The backup is under way: node-a has the device and has stored a chunk of it.
      await waitFor('the backup to be running', async () => (await doc('pre')).status.tickets[ticket]?.job?.state === 'running');
      const chunksBefore = countChunks();
      await waitFor('a chunk to be stored', async () => countChunks() > chunksBefore);
      const workload = {
        id: 'workload-pre-b',
        type: 'workload' as const,
        nodeID: 'node-b',
        parameters: { readOnly: false },
        requestedBy: { pvName: 'pre' },
      };
      await nodes.b.ctx.ledger.addTicket('pre', workload);
      // node-a's agent lets go; the pod's ticket on node-b is granted.
      const granted = await waitFor('the workload to be granted', async () => {
        const d = await doc('pre');
        return d.status.tickets[workload.id]?.satisfied && d;
      });
      assert.equal(granted.status.nodes['node-a'], undefined, 'node-a let go');
      assert.equal(await backend().findDevice('pre'), undefined, 'its device is released');
      assert.match(granted.status.tickets[ticket]?.job?.message ?? '', /interrupted/);
      assert.equal(granted.status.tickets[ticket]?.satisfied, false);
      assert.deepEqual(
        (await listBackups({ type: 'dir', path: target }, 'pre')).map((b) => b.name),
        [],
        'nothing published',
      );
      // The pod goes away (its ticket was never taken up on node-b): the backup is granted again and redone.
      await nodes.b.ctx.ledger.removeTicket('pre', workload.id);
      await waitFor('the backup to finish', async () => (await doc('pre')).spec.tickets[ticket] === undefined);
    } finally {
      await stopAgent(nodes.a);
    }
    await assertSettled('pre', ticket);
    assert.ok((finishedJob(await doc('pre'), ticket)?.status.attempts ?? 0) >= 2, 'started again after the preemption');
    const [listed] = await listBackups({ type: 'dir', path: target }, 'pre');
    assert.equal(listed?.manifest?.chunkListSha256, await chunkListSha256OfImage(backend().imagePath('pre')));
  });

  function countChunks(): number {
    const dir = join(target, 'chunks');
    if (!existsSync(dir)) return 0;
    return readdirSync(dir).reduce((n, shard) => n + readdirSync(join(dir, shard)).filter((f) => !f.includes('.tmp')).length, 0);
  }

  /**
   * Kill points: as soon as the job is running in the ledger, as soon as node-a has the device, after a random
   * delay, and (backups) once a chunk was stored. After each kill the lists show nothing half-made.
   */
  async function killAndRestart(kind: 'snapshot' | 'backup', volume: string, points: string[]): Promise<number[]> {
    const attempts: number[] = [];
    /** What each snapshot or backup of this volume must hold: the image as it was in its round. */
    const expected = new Map<string, string>();
    for (const [i, point] of points.entries()) {
      // New data in the idle volume each round, so that every backup stores new chunks.
      const fd = openSync(backend().imagePath(volume), 'r+');
      writeSync(fd, randomBytes(16 * MiB), 0, 16 * MiB, (16 + 32 * i) * MiB);
      closeSync(fd);
      const imageSha = sha(backend().imagePath(volume));
      const name = `${kind}-${i}`;
      expected.set(name, kind === 'backup' ? await chunkListSha256OfImage(backend().imagePath(volume)) : imageSha);
      const job: JobSpec = kind === 'snapshot' ? { kind, snapshot: name } : { kind, backup: name };
      const ticket = await ask(volume, job, nodes.a);
      const chunksBefore = countChunks();
      const agent = startAgent(nodes.a);
      const exited = new Promise((resolve) => agent.once('exit', resolve));
      // A look that fails stops this agent too: one left running would do the next test's jobs in place of its own.
      await Promise.race([
        exited,
        waitFor(`kill point ${point}`, async () => {
          const d = await doc(volume);
          // A quick job (a reflink snapshot) may be done before a look sees the device: then the kill lands after it.
          if (point === 'device') return d.status.nodes['node-a']?.phase === 'attached' || d.spec.tickets[ticket] === undefined;
          if (point === 'chunk') return countChunks() > chunksBefore || d.spec.tickets[ticket] === undefined;
          // 'running', and the random points: from when the job runs.
          return d.status.tickets[ticket]?.job?.state === 'running' || d.spec.tickets[ticket] === undefined;
        }),
      ]).catch(async (err: unknown) => {
        await stopAgent(nodes.a, 'SIGKILL');
        throw err;
      });
      if (point.startsWith('random')) await sleep(Math.floor(Math.random() * (kind === 'snapshot' ? 300 : 1500)));
      await stopAgent(nodes.a, 'SIGKILL');

      // Right after the kill: the stored document keeps the ledger's invariants, and what the lists show is complete.
      assert.deepEqual(checkInvariants(await doc(volume), volume), [], `ledger invariants after a kill at ${point}`);
      if (kind === 'snapshot') {
        for (const s of await backend().listSnapshots(volume)) {
          assert.equal(
            sha(join(backend().snapshotDir(volume), `${s.name}.img`)),
            expected.get(s.name),
            `listed snapshot ${s.name} is whole (killed at ${point})`,
          );
        }
      } else {
        for (const b of await listBackups({ type: 'dir', path: target }, volume)) {
          assert.equal(b.manifest?.chunkListSha256, expected.get(b.name), `listed backup ${b.name} is whole (killed at ${point})`);
          assert.equal((await verifyBackup({ target: { type: 'dir', path: target }, name: b.name })).ok, true);
        }
      }
      // Restarted, the agent converges: the job done (once: by the killed run or redone), nothing left over.
      startAgent(nodes.a);
      try {
        await waitFor(`${name} to finish after the restart`, async () => (await doc(volume)).spec.tickets[ticket] === undefined);
      } finally {
        await stopAgent(nodes.a);
      }
      await assertSettled(volume, ticket);
      assert.deepEqual(checkInvariants(await doc(volume), volume), []);
      attempts.push(finishedJob(await doc(volume), ticket)?.status.attempts ?? 0);
      process.stderr.write(`# ${kind} killed at ${point}: attempts ${attempts.at(-1)}\n`);
      if (kind === 'snapshot') {
        assert.equal((await backend().listSnapshots(volume)).filter((s) => s.name === name).length, 1);
        assert.equal(sha(join(backend().snapshotDir(volume), `${name}.img`)), imageSha);
      } else {
        const listed = (await listBackups({ type: 'dir', path: target }, volume)).filter((b) => b.name === name);
        assert.equal(listed.length, 1);
        assert.equal(listed[0]?.manifest?.chunkListSha256, expected.get(name));
      }
    }
    return attempts;
  }

  it('the agent SIGKILLed at several points of a snapshot job, restarted: done once, never half-made, nothing left over', async () => {
    await idleVolume('killsnap', 256, 32);
    const attempts = await killAndRestart('snapshot', 'killsnap', ['running', 'device', 'random-1', 'random-2', 'random-3']);
    // At least one kill landed inside the job (a kill after it is done only leaves the finishing to the next agent).
    assert.ok(
      attempts.some((a) => a >= 2),
      `attempts per kill point: ${attempts.join(', ')}`,
    );
  });

  it('the agent SIGKILLed at several points of a backup job, restarted: done once, never half-made, nothing left over', async () => {
    await idleVolume('killbak', 256, 32);
    const attempts = await killAndRestart('backup', 'killbak', ['running', 'device', 'chunk', 'random-1', 'random-2']);
    assert.ok(
      attempts.some((a) => a >= 2),
      `attempts per kill point: ${attempts.join(', ')}`,
    );
  });
});

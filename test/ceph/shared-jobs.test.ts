// Jobs on shared (ReadWriteMany) volumes through the ticket flow, on a one-host Ceph cluster with a CephFS file system
// (test/ceph/mds.ts): `latch snapshot create` asks the node agent's job runner (in process here) for a CephFS
// subvolume snapshot through a snapshot ticket, `latch volume clone --from-snapshot` has the clone job make the
// manager copy it into a new shared volume, and `latch backup create` / `latch volume restore` carry a shared volume's
// files through a tar stream in the chunk engine into a new shared volume (and a real `latch agent` SIGKILLed in the
// middle of each leaves nothing that looks whole: the next agent finishes the job and leaves no mount, ceph-fuse or
// snapshot behind); `latch metrics` and the agent's round give the quota and use of the shared volumes node-a holds, as
// the cluster has them. Every command runs as node-a's own identity, whose caps reach only latch's subvolume group
// (cephfsNodeCaps): what it may do is what the jobs need.
// Every FUSE mount lives under the cluster's dir, whose teardown aborts them through fusectl, also after a failure.
// Needs root, Debian's ceph, ceph-mds and ceph-fuse packages; skips with a message otherwise.
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import {
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmSync,
  statSync,
  writeFileSync,
  symlinkSync,
  linkSync,
} from 'node:fs';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { after, before, beforeEach, describe, it } from 'node:test';
import { parseConfig } from '../../src/config.js';
import { createContext, type Context } from '../../src/context.js';
import type { CommandIO } from '../../src/cli/io.js';
import { snapshotCreate } from '../../src/cli/snapshot/create.js';
import { snapshotList } from '../../src/cli/snapshot/list.js';
import { volumeClone } from '../../src/cli/volume/clone.js';
import { volumeRestore } from '../../src/cli/volume/restore.js';
import { backupCreate } from '../../src/cli/backup/create.js';
import { metrics } from '../../src/cli/metrics.js';
import { LatchMetrics } from '../../src/agent/metrics.js';
import { AGENT_TASKS, runAgentTasks } from '../../src/agent/tasks.js';
import { volumeExpand } from '../../src/cli/volume/expand.js';
import { createSharedVolume, sharedVolumesOf } from '../../src/node/shared.js';
import { cephfsNodeCaps } from '../../src/sys/cephfs.js';
import { readMountInfo } from '../../src/sys/mounts.js';
import { jobRequest } from '../../src/jobs/request.js';
import { finishedJob, isSatisfied } from '../../src/ledger/arbitrate.js';
import { jobTicketId } from '../../src/ledger/ids.js';
import type { VolumeDoc } from '../../src/ledger/types.js';
import { bundleForNode } from '../fixtures/bundle.js';
import { keptAttributesDump, once } from '../fixtures/shared-archive.js';
import { withJobRunner } from '../fixtures/job-runner.js';
import { checkInvariants } from '../fixtures/ledger-invariants.js';
import { trackChild } from '../fixtures/tracked-children.js';
import { MemoryStore } from '../fixtures/memory-store.js';
import { cephSkipReason, procStat, startCephCluster, type CephCluster } from '../ceph/cluster.js';
import { evictGoneClients } from '../ceph/mds.js';

const MiB = 1024 * 1024;
const which = (tool: string) => ['/usr/bin', '/usr/sbin', '/bin', '/sbin'].some((d) => existsSync(join(d, tool)));
const skip =
  cephSkipReason() ??
  (which('ceph-mds') && which('ceph-fuse') ? undefined : 'ceph-mds and ceph-fuse are not installed: run scripts/setup.sh');

describe('jobs on shared volumes through tickets', { skip }, () => {
  let ceph: CephCluster;
  let ctx: Context;
  let io: CommandIO;
  let printed = '';
  let work = '';

  before(
    async () => {
      ceph = await startCephCluster({ cephfs: true });
      const client = await ceph.createClient('latch-node-a', { caps: cephfsNodeCaps(ceph.pool, 'cephfs', 'latch') });
      work = mkdtempSync(join(tmpdir(), 'latch-shared-jobs-'));
      mkdirSync(join(work, 'target'));
      const raw = {
        nodeName: 'node-a',
        // One node, one ledger of its own (the file store; MemoryStore here).
        singleNode: 'node-a',
        stateDir: join(work, 'state'),
        logFile: join(work, 'latch.log'),
        maxSize: '1Gi',
        commandTimeout: 20,
        backupTarget: { type: 'dir', path: join(work, 'target') },
        backend: {
          type: 'rbd',
          pool: ceph.pool,
          cephConf: client.confPath,
          clientId: client.id,
          keyring: client.keyringPath,
          mountDir: join(ceph.dir, 'mnt', 'node-a', 'rbd'),
          cephfs: { fsName: 'cephfs', group: 'latch', client: 'ceph-fuse', mountDir: join(ceph.dir, 'mnt', 'node-a', 'cephfs') },
        },
      };
      const file = join(work, 'config.json');
      writeFileSync(file, JSON.stringify(raw));
      const store = new MemoryStore();
      ctx = createContext(parseConfig(raw, file), { store });
      io = { out: (text) => (printed += text), env: { LATCH_CONFIG: file }, context: (c) => createContext(c, { store }) };
    },
    { timeout: 120_000 },
  );

  after(async () => {
    await ceph?.stop();
    if (work) rmSync(work, { recursive: true, force: true });
  });

  // A ceph-fuse killed here (an agent's job SIGKILLed with it, the stalled job's) keeps its MDS session until it times out.
  beforeEach(async () => {
    if (ceph) await evictGoneClients(ceph);
  });

  /** Mounts the volume's subvolume as node-a at a scratch dir, runs `body` on it, and unmounts it. */
  async function withMount<T>(volume: string, body: (dir: string) => T | Promise<T>): Promise<T> {
    const shared = await sharedVolumesOf(ctx);
    const dir = join(ceph.dir, 'mnt', 'scratch', volume);
    await shared.mountAt(volume, dir, { readOnly: false });
    try {
      return await body(dir);
    } finally {
      await shared.unmountAt(volume, dir);
    }
  }

  it('a snapshot of a shared volume is a snapshot ticket run by the agent, and leaves no hold', { timeout: 120_000 }, async () => {
    await createSharedVolume(ctx, 'shv', 64 * MiB, 'ext4');
    await withMount('shv', (dir) => {
      mkdirSync(join(dir, 'sub'));
      writeFileSync(join(dir, 'sub', 'a.txt'), 'alpha\n');
      writeFileSync(join(dir, 'b.bin'), Buffer.alloc(3 * MiB, 7));
    });
    printed = '';
    await withJobRunner(ctx, () => snapshotCreate({ volume: 'shv', name: 's1', output: 'table' }, io));
    assert.match(printed, /snapshot s1 of shared volume shv created \(native, 64Mi?B?.*crash-consistent/);
    const doc = await ctx.ledger.get('shv');
    const job = doc?.status.jobs?.at(-1);
    assert.equal(job?.status.state, 'succeeded', job?.status.message);
    assert.equal(job?.job.kind, 'snapshot');
    assert.deepEqual(Object.keys(doc?.spec.tickets ?? {}), [], 'the snapshot ticket is finished');
    assert.deepEqual(doc?.status.nodes, {}, 'the job held the volume without a mount and let it go');
    printed = '';
    await snapshotList({ volume: 'shv', output: 'json' }, io);
    assert.deepEqual(
      (JSON.parse(printed) as { name: string }[]).map((s) => s.name),
      ['s1'],
    );
    // A taken name is refused before a ticket is asked for.
    await assert.rejects(
      withJobRunner(ctx, () => snapshotCreate({ volume: 'shv', name: 's1', output: 'table' }, io)),
      /volume shv already has a snapshot named s1/,
    );
    // What the snapshot holds does not change with the volume.
    await withMount('shv', (dir) => writeFileSync(join(dir, 'sub', 'a.txt'), 'changed after s1\n'));
  });

  it('clones a snapshot of a shared volume into a new shared volume through the clone job', { timeout: 180_000 }, async () => {
    await assert.rejects(
      volumeClone({ source: 'shv', name: 'nope', wait: true }, io),
      /volume shv is a shared volume: clone one of its snapshots/,
    );
    printed = '';
    await withJobRunner(ctx, () => volumeClone({ source: 'shv', name: 'shc', fromSnapshot: 's1', wait: true, timeout: 120 }, io));
    assert.match(printed, /cloned snapshot s1 of shared volume shv into shared volume shc/);
    const doc = await ctx.ledger.get('shc');
    assert.equal(doc?.spec.shared, true, 'the clone is a shared volume');
    assert.deepEqual(Object.keys(doc?.spec.tickets ?? {}), [], 'its clone ticket is finished');
    assert.deepEqual(doc?.status.nodes, {});
    // The source's job ends once it sees the target's done (it looks every 0.5 s): the agent goes on until then.
    const source = await withJobRunner(ctx, async () => {
      for (let i = 0; i < 100; i++) {
        const doc = await ctx.ledger.get('shv');
        if (Object.keys(doc?.spec.tickets ?? {}).length === 0) return doc;
        await sleep(100);
      }
      return ctx.ledger.get('shv');
    });
    assert.deepEqual(Object.keys(source?.spec.tickets ?? {}), [], "the source's clone ticket is finished too");
    assert.deepEqual(source?.status.nodes, {});
    const shared = await sharedVolumesOf(ctx);
    assert.equal(await shared.size('shc'), 64 * MiB, 'its quota is its size');
    await withMount('shc', (dir) => {
      assert.equal(readFileSync(join(dir, 'sub', 'a.txt'), 'utf8'), 'alpha\n', 'the snapshot, not the volume as it is now');
      assert.ok(readFileSync(join(dir, 'b.bin')).equals(Buffer.alloc(3 * MiB, 7)));
    });
    // Repeating the command finds the clone done.
    printed = '';
    await volumeClone({ source: 'shv', name: 'shc', fromSnapshot: 's1', wait: true }, io);
    assert.match(printed, /volume shc was cloned from shv already/);
  });

  it("backs up a shared volume's files as a tar archive and restores them into a new shared volume", { timeout: 180_000 }, async () => {
    await withMount('shv', (dir) => {
      symlinkSync('sub/a.txt', join(dir, 'to-a'));
      linkSync(join(dir, 'b.bin'), join(dir, 'b-again'));
      writeFileSync(join(dir, 'mode-600'), 'secret\n', { mode: 0o600 });
    });
    // A base snapshot no backup ticket names: what a failed backup leaves when its hung client kept it from deleting it.
    const shared = await sharedVolumesOf(ctx);
    await shared.createSnapshot('shv', 'latch-base-failed-earlier');
    printed = '';
    await withJobRunner(ctx, () => backupCreate({ volume: 'shv', name: 'fb1', output: 'table' }, io));
    assert.match(printed, /backup fb1 of shared volume shv created \(snapshot latch-base-fb1, crash-consistent\): a tar archive/);
    assert.match(printed, /; 1 of 1 base snapshot\(s\) left by earlier failed backups deleted/);
    const doc = await ctx.ledger.get('shv');
    assert.deepEqual(Object.keys(doc?.spec.tickets ?? {}), [], 'the backup ticket is finished');
    assert.deepEqual(doc?.status.nodes, {}, 'and its mount and hold are gone');
    assert.deepEqual(
      (await shared.listSnapshots('shv')).map((s) => s.name),
      ['s1'],
      "the backup's own snapshot and the one left earlier are removed, a person's is kept",
    );

    printed = '';
    await withJobRunner(ctx, () => volumeRestore({ name: 'shr', fromBackup: 'fb1', wait: true, timeout: 120 }, io));
    assert.match(
      printed,
      /restored backup fb1 \(shared volume shv\) into shared volume shr: 3 file\(s\), 1 director\(ies\), 1 symbolic link\(s\), 1 hard link\(s\)/,
    );
    const restored = await ctx.ledger.get('shr');
    assert.equal(restored?.spec.shared, true);
    assert.equal(restored?.spec.sizeBytes, 64 * MiB, "the source volume's size");
    assert.deepEqual(Object.keys(restored?.spec.tickets ?? {}), []);
    assert.deepEqual(restored?.status.nodes, {});
    await withMount('shr', (dir) => {
      assert.equal(readFileSync(join(dir, 'sub', 'a.txt'), 'utf8'), 'changed after s1\n', 'the volume as it was at the backup');
      assert.ok(readFileSync(join(dir, 'b.bin')).equals(Buffer.alloc(3 * MiB, 7)));
      assert.equal(readlinkSync(join(dir, 'to-a')), 'sub/a.txt');
      assert.equal(statSync(join(dir, 'b-again')).ino, statSync(join(dir, 'b.bin')).ino);
      assert.equal(statSync(join(dir, 'mode-600')).mode & 0o777, 0o600);
    });
  });

  // ---- a real `latch agent` SIGKILLed in the middle of a shared backup job and of a shared restore job ----
  // The agents are child processes of the bundled latch (src/bin.ts) with a configuration of their own: the same node
  // identity, the file-store ledger (shared with this process, which asks for the jobs and looks at the outcome), its
  // own mount dir under the cluster's dir (aborted through fusectl by its teardown) and its own backup target.
  const agentRig = (() => {
    let made: Promise<{ latchJs: string; file: string; ctx: Context; io: CommandIO; mountDir: string; target: string }> | undefined;
    return () =>
      (made ??= (async () => {
        const root = join(work, 'agent');
        mkdirSync(join(root, 'target'), { recursive: true });
        const latchJs = await bundleForNode('src/bin.ts', join(root, 'latch.js'));
        const shared = (JSON.parse(readFileSync(join(work, 'config.json'), 'utf8')) as { backend: Record<string, unknown> }).backend;
        const mountDir = join(ceph.dir, 'mnt', 'node-a-agent', 'cephfs');
        const raw = {
          nodeName: 'node-a',
          singleNode: 'node-a',
          stateDir: join(root, 'state'),
          logFile: join(root, 'latch.log'),
          maxSize: '1Gi',
          commandTimeout: 20,
          backupTarget: { type: 'dir', path: join(root, 'target') },
          agent: { listen: '127.0.0.1:0', intervalSeconds: 1 },
          backend: {
            ...shared,
            mountDir: join(ceph.dir, 'mnt', 'node-a-agent', 'rbd'),
            cephfs: { fsName: 'cephfs', group: 'latch', client: 'ceph-fuse', mountDir },
          },
        };
        const file = join(root, 'config.json');
        writeFileSync(file, JSON.stringify(raw));
        const agentCtx = createContext(parseConfig(raw, file));
        const agentIo: CommandIO = { out: () => undefined, env: { LATCH_CONFIG: file }, context: (c) => createContext(c) };
        return { latchJs, file, ctx: agentCtx, io: agentIo, mountDir, target: join(root, 'target') };
      })());
  })();
  let agentStderr = '';
  const agents = new Set<ChildProcess>();
  /** Runs a test's body; the agents it started are SIGKILLed after it, also after a failure (before the cluster stops). */
  async function withAgents(body: () => Promise<void>): Promise<void> {
    try {
      await body();
    } finally {
      for (const child of [...agents]) await stopAgent(child, 'SIGKILL');
    }
  }

  async function startAgent(): Promise<ChildProcess> {
    const { latchJs, file } = await agentRig();
    const child = spawn(process.execPath, [latchJs, 'agent'], {
      env: { ...process.env, LATCH_CONFIG: file },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    trackChild(child);
    agents.add(child);
    child.stderr?.on('data', (chunk: Buffer) => (agentStderr += chunk.toString()));
    return child;
  }

  async function stopAgent(child: ChildProcess, signal: NodeJS.Signals): Promise<void> {
    agents.delete(child);
    if (child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((resolve) => child.once('exit', resolve));
    child.kill(signal);
    await exited;
  }

  /** Polls `probe` until it gives a value; fails if `child` exits first or after `patienceMs`. */
  async function untilSeen<T>(
    what: string,
    child: ChildProcess,
    probe: () => T | undefined | false,
    intervalMs: number,
    patienceMs = 60_000,
  ) {
    const deadline = Date.now() + patienceMs;
    for (;;) {
      const value = probe();
      if (value !== undefined && value !== false) return value;
      assert.ok(child.exitCode === null && child.signalCode === null, `the agent exited before ${what}: ${agentStderr}`);
      assert.ok(Date.now() < deadline, `waited too long for ${what}; agent stderr: ${agentStderr}`);
      await sleep(intervalMs);
    }
  }

  /** The volume's document once `ticket` is gone (finished), while `child` runs. */
  async function untilFinished(child: ChildProcess, agentCtx: Context, volume: string, ticket: string): Promise<VolumeDoc> {
    const deadline = Date.now() + 60_000;
    for (;;) {
      const doc = await agentCtx.ledger.get(volume);
      assert.ok(doc, `volume ${volume} exists`);
      if (doc.spec.tickets[ticket] === undefined) return doc;
      assert.ok(child.exitCode === null && child.signalCode === null, `the agent exited: ${agentStderr}`);
      assert.ok(Date.now() < deadline, `waited too long for the job on ${volume}; agent stderr: ${agentStderr}`);
      await sleep(50);
    }
  }

  /** What a killed job of node-a's agent may leave on the host: mounts under its mount dir and their ceph-fuse daemons. */
  const leftovers = async (mountDir: string) => ({
    mounts: (await readMountInfo()).filter((m) => m.mountPoint.startsWith(`${mountDir}/`)).map((m) => m.mountPoint),
    cephFuse: readdirSync('/proc')
      .filter((e) => /^[0-9]+$/.test(e))
      .filter((pid) => {
        try {
          const argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
          return (argv[0] ?? '').endsWith('ceph-fuse') && argv.some((a) => a.startsWith(`${mountDir}/`));
        } catch {
          return false;
        }
      })
      .map(Number),
  });
  /** Whether the process runs (a zombie has exited: only its parent's reaping is left). */
  const isRunning = (pid: number) => !['Z', 'X', undefined].includes(procStat(pid)?.[0]);
  /** The volume's CephFS subvolume snapshots as the cluster lists them (`ceph fs subvolume snapshot ls`, as admin). */
  const cephSnapshots = async (volume: string): Promise<string[]> => {
    const out = await ceph.ceph(['fs', 'subvolume', 'snapshot', 'ls', 'cephfs', volume, '--group_name', 'latch', '--format', 'json']);
    return (JSON.parse(out.stdout) as { name: string }[]).map((s) => s.name).sort();
  };
  /** Every regular file under `dir` (relative path) with the sha256 of its bytes. */
  const digests = (dir: string, prefix = ''): Record<string, string> => {
    const found: Record<string, string> = {};
    for (const entry of readdirSync(join(dir, prefix), { withFileTypes: true })) {
      const rel = join(prefix, entry.name);
      if (entry.isDirectory()) Object.assign(found, digests(dir, rel));
      else if (entry.isFile())
        found[rel] = createHash('sha256')
          .update(readFileSync(join(dir, rel)))
          .digest('hex');
    }
    return found;
  };
  let killedSource: Record<string, string> = {};

  it(
    'a shared backup job whose agent is SIGKILLed once it stored chunks: nothing is listed; the next agent reuses its mount and snapshot and completes it',
    { timeout: 120_000 },
    async (t) =>
      withAgents(async () => {
        const rig = await agentRig();
        const a = rig.ctx;
        await createSharedVolume(a, 'shk', 256 * MiB, 'ext4');
        // 96 MiB of random bytes (incompressible, no chunk alike: the backup takes a while) and a few small files.
        await withMount('shk', (dir) => {
          mkdirSync(join(dir, 'deep', 'er'), { recursive: true });
          for (let i = 0; i < 6; i++) writeFileSync(join(dir, `part-${i}`), randomBytes(16 * MiB));
          writeFileSync(join(dir, 'deep', 'er', 'small.txt'), 'small\n');
          killedSource = digests(dir);
        });
        const jobMount = join(rig.mountDir, 'jobs', 'shk');
        /** The chunk files stored whole (a writer's temp files start with "."). */
        const chunks = () => {
          const dir = join(rig.target, 'chunks');
          return existsSync(dir)
            ? readdirSync(dir, { recursive: true, withFileTypes: true }).filter((e) => e.isFile() && !e.name.startsWith('.')).length
            : 0;
        };
        const request = jobRequest(a, 'shk', { kind: 'backup', backup: 'kb1' }, 'node-a');
        await a.ledger.requestJob('shk', request);
        const started = Date.now();
        const first = await startAgent();
        const stored = await untilSeen('the first chunks in the target', first, () => chunks() > 0 && chunks(), 5);
        await stopAgent(first, 'SIGKILL');
        const killedAt = Date.now() - started;

        const killed = await a.ledger.get('shk');
        assert.equal(killed?.spec.tickets[request.id] !== undefined, true, 'the ticket stays');
        assert.equal(killed?.status.tickets[request.id]?.job?.state, 'running', 'killed while the job ran');
        assert.equal(killed?.status.nodes['node-a']?.phase, 'attached', "node-a's hold for the job stays");
        assert.deepEqual(checkInvariants(killed, 'shk'), [], 'the ledger keeps its invariants');
        const { listBackups, manifestExists } = await import('../../src/backup/manifest.js');
        const target = { type: 'dir' as const, path: rig.target };
        assert.equal(await manifestExists(target, 'kb1'), false, 'no manifest');
        assert.deepEqual(await listBackups(target), [], 'nothing is listed as a backup');
        // What the killed run left: its read-only job mount with its ceph-fuse (a daemon of its own: the kill does not
        // reach it) and the backup's own snapshot, which an interrupted attempt keeps for the next.
        const left = await leftovers(rig.mountDir);
        assert.deepEqual(left.mounts, [jobMount], "the killed run's job mount is still there");
        assert.equal(left.cephFuse.length, 1, `its ceph-fuse: ${JSON.stringify(left)}`);
        assert.deepEqual(await cephSnapshots('shk'), ['latch-base-kb1'], "the backup's own snapshot is kept for the next attempt");

        const second = await startAgent();
        const doc = await untilFinished(second, a, 'shk', request.id);
        await stopAgent(second, 'SIGTERM');
        const finished = finishedJob(doc, request.id);
        assert.equal(finished?.status.state, 'succeeded', finished?.status.message);
        assert.equal(finished?.status.attempts, 2, 'redone by the next agent');
        assert.ok(
          Number(finished?.status.result?.presentChunks) > 0,
          `the killed run's chunks are reused: ${JSON.stringify(finished?.status.result)}`,
        );
        assert.deepEqual([Object.keys(doc.spec.tickets), doc.status.nodes], [[], {}], 'no ticket or hold left');
        assert.deepEqual(await leftovers(rig.mountDir), { mounts: [], cephFuse: [] }, 'no job mount and no ceph-fuse left');
        assert.deepEqual(left.cephFuse.filter(isRunning), [], "the killed run's ceph-fuse is gone");
        assert.deepEqual(await cephSnapshots('shk'), [], "the backup's own snapshot is removed");
        assert.deepEqual(
          (await listBackups(target)).map((b) => b.name),
          ['kb1'],
        );
        t.diagnostic(
          `killed ${killedAt} ms after the agent started, with ${stored} chunk(s) stored; ${JSON.stringify(finished?.status.result)}`,
        );
      }),
  );

  it(
    'a shared restore job whose agent is SIGKILLed midway keeps the new volume from pods; the next agent redoes it byte for byte, no mount left',
    { timeout: 120_000 },
    async (t) =>
      withAgents(async () => {
        assert.ok(Object.keys(killedSource).length > 0, 'the backup test ran first');
        const rig = await agentRig();
        const a = rig.ctx;
        const restoreId = jobTicketId('restore', 'shkr', 'kb1');
        await volumeRestore({ name: 'shkr', fromBackup: 'kb1', wait: false }, rig.io);
        const jobMount = join(rig.mountDir, 'jobs', 'shkr');
        const first = await startAgent();
        // Looked at often: the restore writes its 96 MiB in well under a second here.
        const written = await untilSeen(
          'the restore to write its second file',
          first,
          () => {
            try {
              const parts = readdirSync(jobMount).filter((n) => n.startsWith('part-'));
              return parts.length >= 2 && parts.length;
            } catch {
              return false;
            }
          },
          2,
        );
        await stopAgent(first, 'SIGKILL');
        const killed = await a.ledger.get('shkr');
        assert.equal(killed?.spec.shared, true);
        assert.equal(killed?.status.tickets[restoreId]?.job?.state, 'running', 'killed while the job ran');
        assert.deepEqual(checkInvariants(killed, 'shkr'), []);
        const left = await leftovers(rig.mountDir);
        assert.deepEqual(left.mounts, [jobMount], "the killed run's job mount is still there");
        // A pod's ticket waits: a half-restored volume is never handed to a workload.
        const workload = {
          id: 'workload-shkr',
          type: 'workload' as const,
          nodeID: 'node-a',
          parameters: { readOnly: false },
          requestedBy: {},
        };
        await a.ledger.addTicket('shkr', workload);
        assert.equal(isSatisfied((await a.ledger.get('shkr')) as VolumeDoc, workload.id), false, 'the workload waits');
        await a.ledger.removeTicket('shkr', workload.id);

        const second = await startAgent();
        const doc = await untilFinished(second, a, 'shkr', restoreId);
        await stopAgent(second, 'SIGTERM');
        const finished = finishedJob(doc, restoreId);
        assert.equal(finished?.status.state, 'succeeded', finished?.status.message);
        assert.equal(finished?.status.attempts, 2, 'redone from an empty root by the next agent');
        assert.deepEqual([Object.keys(doc.spec.tickets), doc.status.nodes], [[], {}], 'no ticket or hold left');
        assert.deepEqual(await leftovers(rig.mountDir), { mounts: [], cephFuse: [] }, 'no job mount and no ceph-fuse left');
        assert.deepEqual(left.cephFuse.filter(isRunning), [], "the killed run's ceph-fuse is gone");
        await withMount('shkr', (dir) => assert.deepEqual(digests(dir), killedSource, 'the files, byte for byte'));
        t.diagnostic(`killed with ${written} of 6 large files begun`);
      }),
  );

  it(
    'attach mode: waitforattach and mountdevice of a shared volume SIGKILLed midway, then repeated: one grant, one ceph-fuse, one mount',
    { timeout: 120_000 },
    async (t) => {
      const rig = await agentRig();
      const a = rig.ctx;
      // The agent rig's node-a in attach mode: the same ledger and identity, the driver calls of kubelet and the KCM.
      const raw = { ...(JSON.parse(readFileSync(rig.file, 'utf8')) as Record<string, unknown>), attach: true, waitForAttachTimeout: 20 };
      const file = join(work, 'agent', 'attach.json');
      writeFileSync(file, JSON.stringify(raw));
      const env = { ...process.env, LATCH_CONFIG: file };
      const json = JSON.stringify({ 'kubernetes.io/pvOrVolumeName': 'shd', accessMode: 'ReadWriteMany', size: '64Mi' });
      const global = join(ceph.dir, 'kubelet', 'node-a', 'plugins', 'latch', 'mounts', 'shd');
      /** One driver call: one JSON object on stdout, nothing on stderr. */
      const call = async (...args: string[]): Promise<{ status: string; message?: string; device?: string }> => {
        const child = spawn(process.execPath, [rig.latchJs, ...args], { env, stdio: ['ignore', 'pipe', 'pipe'] });
        let out = '';
        let err = '';
        child.stdout.on('data', (chunk: Buffer) => (out += chunk.toString()));
        child.stderr.on('data', (chunk: Buffer) => (err += chunk.toString()));
        await new Promise((resolve) => child.once('close', resolve));
        assert.equal(err, '', `${args[0]} wrote to stderr`);
        return JSON.parse(out) as { status: string; message?: string; device?: string };
      };
      /** Starts a driver call and SIGKILLs it once `midway` holds (looked at every 5 ms); true if it was still running. */
      const killedAt = async (what: string, args: string[], midway: () => Promise<boolean> | boolean): Promise<boolean> => {
        const child = spawn(process.execPath, [rig.latchJs, ...args], { env, stdio: 'ignore' });
        trackChild(child);
        const exited = new Promise((resolve) => child.once('exit', resolve));
        let running = true;
        void exited.then(() => (running = false));
        for (let i = 0; i < 4000 && running && !(await midway()); i++) await sleep(5);
        const wasRunning = running;
        child.kill('SIGKILL');
        await exited;
        t.diagnostic(`${what}: ${wasRunning ? 'killed midway' : 'had finished before the kill'}`);
        return wasRunning;
      };
      const node = async () => (await a.ledger.get('shd'))?.status.nodes;
      const mountsAt = async () => (await readMountInfo()).filter((m) => m.mountPoint === global);

      assert.equal((await call('attach', json, 'node-a')).status, 'Success');
      // waitforattach killed once node-a's claim is in the ledger (attaching), before its record (attached).
      assert.ok(
        await killedAt('waitforattach', ['waitforattach', '', json], async () => (await node())?.['node-a']?.phase === 'attaching'),
        'the kill came before waitforattach was done',
      );
      const waited = await call('waitforattach', '', json);
      assert.equal(waited.status, 'Success', waited.message);
      assert.equal(waited.device, '/latch/shared/shd');
      assert.deepEqual(Object.keys((await node()) ?? {}), ['node-a'], 'one grant, for node-a');
      assert.equal((await node())?.['node-a']?.phase, 'attached');

      // mountdevice killed as soon as its ceph-fuse has started, as soon as its mount shows, and while its ceph-fuse is
      // held (SIGSTOP) before it mounts, let go once the repeat is done (a slow start that outlives the call): each
      // repeat converges, and the killed call's ceph-fuse never mounts a second time over the repeat's.
      const held: number[] = [];
      const midways: [string, () => Promise<boolean>][] = [
        ['its ceph-fuse started', async () => (await leftovers(dirname(global))).cephFuse.length > 0],
        ['its mount shows', async () => (await mountsAt()).length > 0],
        [
          'its ceph-fuse started and was held before it mounted',
          async () => {
            const started = (await leftovers(dirname(global))).cephFuse;
            for (const pid of started) process.kill(pid, 'SIGSTOP');
            held.push(...started);
            return started.length > 0;
          },
        ],
      ];
      for (const [when, midway] of midways) {
        // kubelet's order: waitforattach before every mountdevice (after an unmountdevice, it takes the hold again).
        const again = await call('waitforattach', '', json);
        assert.equal(again.status, 'Success', again.message);
        mkdirSync(global, { recursive: true, mode: 0o750 });
        await killedAt(`mountdevice killed once ${when}`, ['mountdevice', global, waited.device ?? '', json], midway);
        const mounted = await call('mountdevice', global, waited.device ?? '', json);
        assert.equal(mounted.status, 'Success', `mountdevice after a kill once ${when}: ${mounted.message}`);
        if (held.length > 0) {
          for (const pid of held.filter(isRunning)) process.kill(pid, 'SIGCONT');
          // Given the time to mount, as a slow start would (the repeat above took longer than a start here). Measured:
          // the killed call's ceph-fuse is gone once let go, without mounting (its stderr is the dead call's pipe).
          for (let i = 0; i < 100 && held.some(isRunning) && (await mountsAt()).length < 2; i++) await sleep(50);
          t.diagnostic(`held ceph-fuse ${held.join(', ')}: ${held.filter(isRunning).length} still running after the repeat`);
        }
        assert.equal((await mountsAt()).length, 1, `one mount at the global path after a kill once ${when}`);
        assert.equal((await leftovers(dirname(global))).cephFuse.length, 1, `one ceph-fuse after a kill once ${when}`);
        const entry = (await node())?.['node-a'];
        assert.deepEqual(Object.keys((await node()) ?? {}), ['node-a'], 'one grant, for node-a');
        assert.equal(entry?.phase, 'attached');
        assert.match(entry?.client ?? '', /^entity:latch-node-a@/, "the live ceph-fuse's instance is recorded");
        writeFileSync(join(global, `after-${midways.findIndex(([w]) => w === when)}`), 'written\n');
        assert.equal((await call('unmountdevice', global)).status, 'Success');
        assert.deepEqual(await mountsAt(), [], `nothing mounted at the global path after its unmountdevice`);
      }
      assert.equal((await call('detach', 'shd', 'node-a')).status, 'Success');
      const doc = await a.ledger.get('shd');
      assert.deepEqual([doc?.status.nodes, Object.keys(doc?.spec.tickets ?? {})], [{}, []], 'no hold and no ticket left');
      assert.deepEqual(await leftovers(dirname(global)), { mounts: [], cephFuse: [] }, 'no mount and no ceph-fuse left');
    },
  );

  it(
    'a SIGSTOPped ceph-fuse under a backup fails the job once it made no progress for commandTimeout, and leaves nothing',
    { timeout: 180_000 },
    async (t) => {
      await createSharedVolume(ctx, 'big', 256 * MiB, 'ext4');
      await withMount('big', (dir) => {
        for (let i = 0; i < 24; i++) writeFileSync(join(dir, `part-${i}`), Buffer.alloc(4 * MiB, i + 1));
      });
      const jobMount = join(ceph.dir, 'mnt', 'node-a', 'cephfs', 'jobs', 'big');
      // Stops the job's own ceph-fuse (its argv names the job's mount point) once its start is over: mounted, and the
      // process that daemonized it gone (startDaemon returns then). Stopped while it starts (its mount shows in
      // mountinfo before that), it is the start's deadline, also commandTimeout, that would end the job instead.
      const argvOf = (pid: string): string[] => {
        try {
          return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
        } catch {
          return [];
        }
      };
      const isJobFuse = (pid: string) => {
        const argv = argvOf(pid);
        return (argv[0] ?? '').endsWith('ceph-fuse') && argv.includes(jobMount);
      };
      /** The job's ceph-fuse daemon, once it is the only one and its parent is not ceph-fuse; else undefined. */
      const startedDaemon = async (): Promise<number | undefined> => {
        if (!(await readMountInfo()).some((m) => m.mountPoint === jobMount && m.fsType === 'fuse.ceph-fuse')) return undefined;
        const fuses = readdirSync('/proc').filter((e) => /^[0-9]+$/.test(e) && isJobFuse(e));
        if (fuses.length !== 1) return undefined;
        const parent = procStat(Number(fuses[0]))?.[1];
        return parent === undefined || isJobFuse(parent) ? undefined : Number(fuses[0]);
      };
      let stopped: number | undefined;
      const watcher = (async () => {
        for (let i = 0; i < 3000 && stopped === undefined; i++) {
          const daemon = await startedDaemon();
          if (daemon !== undefined) {
            process.kill(daemon, 'SIGSTOP');
            stopped = daemon;
            break;
          }
          await sleep(10);
        }
      })();
      const started = Date.now();
      try {
        await assert.rejects(
          withJobRunner(ctx, () => backupCreate({ volume: 'big', name: 'hung1', output: 'table' }, io)),
          /made no progress for 20000 ms; its connection was aborted/,
        );
      } finally {
        await watcher;
        if (stopped !== undefined) {
          try {
            process.kill(stopped, 'SIGCONT');
          } catch {
            // killed by the job's unmount: as it should be
          }
        }
      }
      assert.ok(stopped !== undefined, "the job's ceph-fuse was stopped");
      const took = Date.now() - started;
      const shared = await sharedVolumesOf(ctx);
      t.diagnostic(
        `the stalled backup job ended ${took} ms after it began; snapshots left: ${JSON.stringify((await shared.listSnapshots('big')).map((s) => s.name))}`,
      );
      assert.ok(took < 90_000, `the job ended ${took} ms after it began: bounded by its stall deadline, not the hung mount`);
      assert.ok(!(await readMountInfo()).some((m) => m.mountPoint === jobMount), "the job's mount is gone");
      const doc = await ctx.ledger.get('big');
      assert.equal(doc?.status.jobs?.at(-1)?.status.state, 'failed');
      assert.deepEqual(doc?.status.nodes, {}, 'the hold is released');
      const { manifestExists } = await import('../../src/backup/manifest.js');
      assert.equal(await manifestExists({ type: 'dir', path: join(work, 'target') }, 'hung1'), false, 'nothing was published');
    },
  );
  it(
    "latch metrics and the agent's round: the quota and use of the shared volumes node-a holds, from the cluster; none once it lets go",
    { timeout: 180_000 },
    async (t) => {
      await createSharedVolume(ctx, 'shq', 32 * MiB, 'ext4');
      /** The figures `latch metrics` prints for shq (undefined: no series). */
      const figures = async () => {
        printed = '';
        await metrics({}, io);
        const value = (series: string) => {
          const line = printed.split('\n').find((l) => l.startsWith(`${series}{volume="shq"} `));
          return line === undefined ? undefined : Number(line.split(' ').at(-1));
        };
        const failures = /^latch_shared_volume_info_failures_total (\S+)$/m.exec(printed)?.[1];
        return {
          quota: value('latch_shared_volume_quota_bytes'),
          used: value('latch_shared_volume_used_bytes'),
          failures: Number(failures),
        };
      };
      /** Asks until `ok` holds: the MDS propagates a write's bytes to the subvolume's recursive size lazily. */
      const until = async (ok: (f: Awaited<ReturnType<typeof figures>>) => boolean, what: string) => {
        let last = await figures();
        for (let i = 0; i < 30 && !ok(last); i++) {
          await sleep(1000);
          last = await figures();
        }
        assert.ok(ok(last), `${what}: ${JSON.stringify(last)}`);
        return last;
      };

      assert.deepEqual(await figures(), { quota: undefined, used: undefined, failures: 0 }, 'not held by node-a: no series');
      const ticket = {
        id: 'w-metrics',
        type: 'workload' as const,
        nodeID: 'node-a',
        parameters: { readOnly: false },
        requestedBy: {},
      };
      const held = await ctx.ledger.addTicket('shq', ticket);
      assert.equal(held?.status.nodes['node-a']?.phase, 'granted', 'node-a holds shq');
      try {
        const before = await figures();
        assert.equal(before.quota, 32 * MiB, 'the quota is the size');
        assert.ok(before.used !== undefined && before.used < MiB, `an empty volume: ${before.used}`);
        assert.equal(before.failures, 0);

        await withMount('shq', (dir) => writeFileSync(join(dir, 'data.bin'), Buffer.alloc(8 * MiB, 1)));
        const written = await until((f) => (f.used ?? 0) >= (before.used ?? 0) + 8 * MiB, 'used grows by the 8 MiB written');
        assert.ok((written.used ?? 0) < 9 * MiB, `the bytes written, not more: ${written.used}`);
        assert.equal(written.quota, 32 * MiB);

        printed = '';
        await volumeExpand({ name: 'shq', size: '48Mi' }, io);
        assert.match(printed, /quota raised to 48/);
        const grown = await figures();
        assert.equal(grown.quota, 48 * MiB, 'the new quota, at once');
        assert.equal(grown.used, written.used);
        assert.equal(grown.failures, 0, 'no read failed');
        // The agent's round sets the same gauges.
        const agent = await LatchMetrics.create();
        await runAgentTasks(
          ctx.config,
          () => ctx,
          agent,
          AGENT_TASKS.filter((task) => task.name === 'shared-volume-usage'),
        );
        const served = await agent.text();
        assert.match(served, new RegExp(`^latch_shared_volume_quota_bytes\\{volume="shq"\\} ${48 * MiB}$`, 'm'));
        assert.match(served, new RegExp(`^latch_shared_volume_used_bytes\\{volume="shq"\\} ${grown.used}$`, 'm'));

        // A held shared volume without a subvolume (the ledger's word only): no figures, counted and logged; shq's stay.
        await ctx.ledger.addTicket('shq-none', ticket, { sizeBytes: 32 * MiB, fsType: 'ext4', shared: true });
        const oneFailed = await figures();
        assert.deepEqual(oneFailed, { ...grown, failures: 1 });
        assert.doesNotMatch(printed, /volume="shq-none"/);
        const logged = readFileSync(join(work, 'latch.log'), 'utf8');
        assert.match(logged, /"command":"metrics".*"volume":"shq-none","error":"shared volume has no subvolume/);
        t.diagnostic(`shq: used ${before.used} -> ${written.used} bytes; quota ${before.quota} -> ${grown.quota} bytes`);
      } finally {
        await ctx.ledger.removeTicket('shq', ticket.id);
        await ctx.ledger.removeTicket('shq-none', ticket.id);
      }
      const released = await ctx.ledger.get('shq');
      assert.deepEqual(released?.status.nodes, {}, 'node-a no longer holds shq');
      assert.deepEqual(await figures(), { quota: undefined, used: undefined, failures: 0 }, 'no longer held: no series');
    },
  );
  it(
    "a shared volume's user attributes and ACLs come back from its backup; a crafted archive's security.* and ceph.* do not",
    { timeout: 120_000 },
    async () => {
      const { spawnSync } = await import('node:child_process');
      const sh = (command: string, args: string[], cwd?: string): string => {
        const r = spawnSync(command, args, { encoding: 'utf8', timeout: 30_000, cwd });
        assert.equal(r.status, 0, `${command} ${args.join(' ')}: ${r.stderr}`);
        return r.stdout;
      };
      const shared = await sharedVolumesOf(ctx);
      /** Mounts the volume as a backup or restore does (ACLs shown), runs `body`, unmounts it. */
      const withJobMount = async <T>(volume: string, body: (dir: string) => T): Promise<T> => {
        const dir = join(ceph.dir, 'mnt', 'scratch', `${volume}-job`);
        await shared.mountForJob(volume, dir, { readOnly: false });
        try {
          return body(dir);
        } finally {
          await shared.unmountForJob(dir);
        }
      };
      await createSharedVolume(ctx, 'shx', 32 * MiB, 'ext4');
      const podAcl = await withMount('shx', (dir) => {
        writeFileSync(join(dir, 'probe'), '');
        return spawnSync('setfacl', ['-m', 'u:1000:r', join(dir, 'probe')], { encoding: 'utf8' });
      });
      // Set through a pod's mount, which takes ACLs as a job's does: one of the five entries with attributes below.
      assert.equal(podAcl.status, 0, `setfacl on a pod's ceph-fuse mount: ${podAcl.stderr}`);
      const before = await withJobMount('shx', (dir) => {
        mkdirSync(join(dir, 'team'));
        writeFileSync(join(dir, 'team', 'notes'), 'n');
        writeFileSync(join(dir, 'bin'), 'b');
        sh('setfattr', ['-n', 'user.text', '-v', 'hello', join(dir, 'team', 'notes')]);
        sh('setfattr', ['-n', 'user.bin', '-v', '0sAAEC/w0KPSCA', join(dir, 'bin')]);
        sh('setfattr', ['-n', 'user.dir', '-v', 'yes', join(dir, 'team')]);
        sh('setfacl', ['-m', 'u:1000:rw', join(dir, 'bin')]);
        sh('setfacl', ['-m', 'g:3000:rwx', '-d', '-m', 'g:3000:rwx', join(dir, 'team')]);
        sh('setfacl', ['-d', '-m', 'g:4000:rx', dir]);
        return keptAttributesDump(dir);
      });
      assert.match(before, /# file: \.\nsystem.posix_acl_default/, "the job's mount shows ACLs, the volume root's too");
      printed = '';
      await withJobRunner(ctx, () => backupCreate({ volume: 'shx', name: 'xb1', output: 'table' }, io));
      assert.match(printed, /backup xb1 of shared volume shx created .*extended attributes of 5 entr\(ies\) kept/);
      printed = '';
      await withJobRunner(ctx, () => volumeRestore({ name: 'shx-r', fromBackup: 'xb1', wait: true, timeout: 60 }, io));
      assert.match(printed, /into shared volume shx-r: 3 file\(s\), 1 director\(ies\).*extended attributes of 5 entr\(ies\), checksum/);
      assert.equal(await withJobMount('shx-r', keptAttributesDump), before, 'every user attribute and ACL came back');

      // A crafted archive: file capabilities on a binary, a quota and a layout on a directory, beside a user attribute.
      const { encodePaxRecords } = await import('../../src/node/shared-xattrs.js');
      const { SHARED_ARCHIVE, streamChunkSource } = await import('../../src/node/shared-files.js');
      const { createBackup } = await import('../../src/backup/create.js');
      const { archiveWithPax } = await import('../fixtures/memory-xattrs.js');
      const attrs = (...pairs: [string, string][]) => new Map(pairs.map(([k, v]) => [k, Buffer.from(v)]));
      const image = await archiveWithPax([
        {
          header: { name: 'd', type: 'directory', mode: 0o755 },
          pax: encodePaxRecords('d', undefined, attrs(['ceph.quota.max_bytes', '4096'], ['ceph.dir.layout.pool', 'elsewhere'])),
        },
        {
          header: { name: 'd/tool', type: 'file', mode: 0o755, size: 4 },
          body: 'tool',
          pax: encodePaxRecords('d/tool', undefined, attrs(['security.capability', '\x01\0\0\x02\xff\xff\xff\xff'], ['user.fine', 'ok'])),
        },
      ]);
      const size = Math.ceil(image.length / 4096) * 4096;
      await createBackup({
        target: { type: 'dir', path: join(work, 'target') },
        source: streamChunkSource(once(image), size),
        volume: 'shx',
        name: 'xb-crafted',
        fsType: SHARED_ARCHIVE,
      });
      printed = '';
      await withJobRunner(ctx, () => volumeRestore({ name: 'shx-c', fromBackup: 'xb-crafted', wait: true, timeout: 60 }, io));
      assert.match(
        printed,
        /3 attribute\(s\) or pax record\(s\) skipped \(only user\.\* and POSIX ACLs are restored\): d: attribute "ceph\.quota\.max_bytes"/,
      );
      const job = (await ctx.ledger.get('shx-c'))?.status.jobs?.at(-1);
      assert.equal((job?.status.result as { skippedXattrs?: number } | undefined)?.skippedXattrs, 3, 'counted in the result');
      await withJobMount('shx-c', (dir) => {
        const all = sh('getfattr', ['-h', '-d', '-m', '-', join(dir, 'd', 'tool')]);
        assert.match(all, /user.fine="ok"/);
        assert.doesNotMatch(all, /security/, 'no file capability was set');
        const quota = spawnSync('getfattr', ['-n', 'ceph.quota.max_bytes', '--only-values', join(dir, 'd')], { encoding: 'utf8' });
        assert.ok(quota.status !== 0 || quota.stdout.trim() === '0', `no quota was set on d: ${quota.stdout}`);
      });
    },
  );

  it('a backup and a restore keep names and a symbolic link target that are not UTF-8, byte for byte', { timeout: 60_000 }, async () => {
    const { pathOf, treeOf } = await import('../fixtures/byte-tree.js');
    const latin1 = (text: string) => Buffer.from(text, 'latin1');
    await createSharedVolume(ctx, 'shn', 32 * MiB, 'ext4');
    const made = await withMount('shn', (dir) => {
      mkdirSync(pathOf(dir, latin1('r\xe9pertoire')));
      writeFileSync(pathOf(dir, latin1('r\xe9pertoire'), latin1('caf\xe9')), 'latin-1\n');
      writeFileSync(pathOf(dir, latin1('\xff\xfe')), 'no encoding\n');
      symlinkSync(latin1('r\xe9pertoire/caf\xe9'), pathOf(dir, latin1('lien-\xe0')));
      return treeOf(dir, true);
    });
    printed = '';
    await withJobRunner(ctx, () => backupCreate({ volume: 'shn', name: 'nb1', output: 'table' }, io));
    assert.match(printed, /backup nb1 of shared volume shn created/);
    printed = '';
    await withJobRunner(ctx, () => volumeRestore({ name: 'shn-r', fromBackup: 'nb1', wait: true, timeout: 60 }, io));
    assert.match(printed, /into shared volume shn-r: 2 file\(s\), 1 director\(ies\), 1 symbolic link\(s\)/);
    assert.equal(made.length, 4);
    assert.deepEqual(await withMount('shn-r', (dir) => treeOf(dir, true)), made, 'every name, target, content, owner and mode');
  });
});

// Jobs on shared (ReadWriteMany) volumes through the ticket flow, on a one-host Ceph cluster with a CephFS file system
// (test/ceph/mds.ts): `latch snapshot create` asks the node agent's job runner (in process here) for a CephFS
// subvolume snapshot through a snapshot ticket, `latch volume clone --from-snapshot` has the clone job make the
// manager copy it into a new shared volume, and `latch backup create` / `latch volume restore` carry a shared volume's
// files through a tar stream in the chunk engine into a new shared volume; `latch metrics` and the agent's round give
// the quota and use of the shared volumes node-a holds, as the cluster has them. Every command runs as node-a's own
// identity, whose caps reach only latch's subvolume group (cephfsNodeCaps): what it may do is what the jobs need.
// Every FUSE mount lives under the cluster's dir, whose teardown aborts them through fusectl, also after a failure.
// Needs root, Debian's ceph, ceph-mds and ceph-fuse packages; skips with a message otherwise.
import assert from 'node:assert/strict';
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
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { after, before, describe, it } from 'node:test';
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
import { withJobRunner } from '../fixtures/job-runner.js';
import { MemoryStore } from '../fixtures/memory-store.js';
import { cephSkipReason, procStat, startCephCluster, type CephCluster } from '../ceph/cluster.js';

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
    printed = '';
    await withJobRunner(ctx, () => backupCreate({ volume: 'shv', name: 'fb1', output: 'table' }, io));
    assert.match(printed, /backup fb1 of shared volume shv created \(snapshot latch-base-fb1, crash-consistent\): a tar archive/);
    const doc = await ctx.ledger.get('shv');
    assert.deepEqual(Object.keys(doc?.spec.tickets ?? {}), [], 'the backup ticket is finished');
    assert.deepEqual(doc?.status.nodes, {}, 'and its mount and hold are gone');
    const shared = await sharedVolumesOf(ctx);
    assert.deepEqual(
      (await shared.listSnapshots('shv')).map((s) => s.name),
      ['s1'],
      "the backup's own snapshot is removed",
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

  it(
    'a SIGSTOPped ceph-fuse under a backup fails the job once it made no progress for commandTimeout, and leaves nothing',
    { timeout: 180_000 },
    async () => {
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
    async (t) => {
      const { spawnSync } = await import('node:child_process');
      const sh = (command: string, args: string[], cwd?: string): string => {
        const r = spawnSync(command, args, { encoding: 'utf8', timeout: 30_000, cwd });
        assert.equal(r.status, 0, `${command} ${args.join(' ')}: ${r.stderr}`);
        return r.stdout;
      };
      /** The kept attributes under `dir`, as getfattr dumps them, blocks sorted (paths relative). */
      const dumpOf = (dir: string) =>
        sh('getfattr', ['-R', '-h', '-d', '-e', 'base64', '-m', '^(user\\..+|system\\.posix_acl_(access|default))$', '.'], dir)
          .split('\n\n')
          .filter((b) => b.trim() !== '')
          .sort()
          .join('\n\n');
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
      t.diagnostic(`setfacl on a pod's ceph-fuse mount (no client_acl_type): ${podAcl.status === 0 ? 'works' : podAcl.stderr.trim()}`);
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
        return dumpOf(dir);
      });
      assert.match(before, /# file: \.\nsystem.posix_acl_default/, "the job's mount shows ACLs, the volume root's too");
      printed = '';
      await withJobRunner(ctx, () => backupCreate({ volume: 'shx', name: 'xb1', output: 'table' }, io));
      assert.match(printed, /backup xb1 of shared volume shx created .*extended attributes of 4 entr\(ies\) kept/);
      printed = '';
      await withJobRunner(ctx, () => volumeRestore({ name: 'shx-r', fromBackup: 'xb1', wait: true, timeout: 60 }, io));
      assert.match(printed, /into shared volume shx-r: 3 file\(s\), 1 director\(ies\).*extended attributes of 4 entr\(ies\), checksum/);
      assert.equal(await withJobMount('shx-r', dumpOf), before, 'every user attribute and ACL came back');

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
      async function* once(b: Buffer) {
        yield b;
      }
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
});

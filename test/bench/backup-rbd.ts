// The rbd backup benchmark (issue 37): an rbd volume of 4 GiB with 1 GiB written (random, incompressible, in four
// runs of 256 MiB), backed up, then 1% of it (41 MiB, one run inside the data) changed and backed up again, on a
// one-host Ceph cluster (test/ceph/cluster.ts). For each backup: the bytes read from the cluster (what rbd
// export-diff gave), the node's local disk used (mountDir sampled every 100 ms: the old way exported the whole
// snapshot there), its time; the second against `rbd export-diff` of the same change to /dev/null (the ratio of
// throughputs); and the peak memory (maxRSS) of a backup and of a restore onto a fresh image, each in a process of
// its own (backup-rbd-child.ts). `npm run bench:backup` runs it after the directory benchmark (backup.ts).
import { execFileSync, spawnSync } from 'node:child_process';
import { closeSync, mkdirSync, mkdtempSync, openSync, readdirSync, rmSync, statSync, writeSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { RbdBackend } from '../../src/backend/rbd.js';
import { cephSkipReason, startCephCluster } from '../ceph/cluster.js';
import type { ChildJob } from './backup-rbd-child.js';
import type { Figure } from './figures.js';

const MiB = 1024 * 1024;
const GiB = 1024 * MiB;
const SIZE = 4 * GiB;
const WRITTEN = GiB;
const CHANGE = Math.round(SIZE / 100 / MiB) * MiB;

/** Bytes allocated under `dir` (every file, recursively). */
function allocatedUnder(dir: string): number {
  let total = 0;
  let entries;
  try {
    entries = readdirSync(dir, { withFileTypes: true });
  } catch {
    return 0;
  }
  for (const e of entries) {
    const path = join(dir, e.name);
    try {
      if (e.isDirectory()) total += allocatedUnder(path);
      else if (e.isFile()) total += statSync(path).blocks * 512;
    } catch {
      /* gone meanwhile */
    }
  }
  return total;
}

/** Runs `fn` while sampling the bytes allocated under `dir`; returns its value and the peak. */
async function sampling<T>(dir: string, fn: () => Promise<T>): Promise<{ value: T; peakBytes: number }> {
  let peakBytes = allocatedUnder(dir);
  const timer = setInterval(() => (peakBytes = Math.max(peakBytes, allocatedUnder(dir))), 100);
  try {
    const value = await fn();
    peakBytes = Math.max(peakBytes, allocatedUnder(dir));
    return { value, peakBytes };
  } finally {
    clearInterval(timer);
  }
}

function child(job: ChildJob): Record<string, unknown> & { ms: number; maxRssBytes: number } {
  const out = execFileSync(process.execPath, ['--import', 'tsx', join(__dirname, 'backup-rbd-child.ts'), JSON.stringify(job)], {
    encoding: 'utf8',
    maxBuffer: 1024 * 1024,
  });
  return JSON.parse(out.trim().split('\n').at(-1) ?? '{}') as Record<string, unknown> & { ms: number; maxRssBytes: number };
}

const mib = (n: number) => `${(n / MiB).toFixed(1)} MiB`;

export async function rbdBackupBench(): Promise<{ figures: Figure[]; details: Record<string, unknown> }> {
  const skip = cephSkipReason();
  if (skip) return { figures: [{ section: 'backup-rbd', what: 'rbd backups', value: `skipped: ${skip}`, target: '' }], details: {} };
  const ceph = await startCephCluster({ osdSizeGiB: 16 });
  const work = mkdtempSync('/var/tmp/latch-rbd-backup-bench-');
  try {
    const client = await ceph.createClient('node-a');
    const mountDir = join(ceph.dir, 'mnt', 'node-a');
    mkdirSync(mountDir, { recursive: true });
    const target = join(work, 'target');
    mkdirSync(target);
    const base = {
      pool: ceph.pool,
      cephConf: client.confPath,
      clientId: client.id,
      keyring: client.keyringPath,
      mountDir,
      work,
      target,
      sizeBytes: SIZE,
    };
    const backend = new RbdBackend({ ...base, maxSize: SIZE, timeoutMs: 60_000 });

    // The volume: a sparse 4 GiB file with 1 GiB of random bytes in four runs, imported sparsely.
    const file = join(work, 'vol.img');
    execFileSync('truncate', ['-s', String(SIZE), file]);
    const fd = openSync(file, 'r+');
    try {
      for (let run = 0; run < 4; run++) {
        for (let done = 0; done < WRITTEN / 4; done += 16 * MiB) writeSync(fd, randomBytes(16 * MiB), 0, 16 * MiB, run * GiB + done);
      }
    } finally {
      closeSync(fd);
    }
    await ceph.rbd(['import', '--no-progress', '--sparse-size', '4096', file, `${ceph.pool}/vol`], { timeoutMs: 900_000 });
    rmSync(file);

    const first = await sampling(mountDir, async () => child({ ...base, op: 'backup', volume: 'vol', name: 'b1' }));

    // 1% of the volume changes: one run of random bytes inside the second run of data.
    const device = await backend.attach('vol');
    const dev = openSync(device, 'r+');
    try {
      for (let done = 0; done < CHANGE; done += MiB) writeSync(dev, randomBytes(MiB), 0, MiB, GiB + 64 * MiB + done);
    } finally {
      closeSync(dev);
    }
    await backend.release('vol');

    // The baseline: rbd export-diff of the same change (from the first backup's base to a snapshot of now) to /dev/null.
    await ceph.rbd(['snap', 'create', '--no-progress', `${ceph.pool}/vol@bench-now`]);
    const exportDiff = () => {
      const nul = openSync('/dev/null', 'w');
      const started = performance.now();
      try {
        const r = spawnSync(
          'rbd',
          [
            '--conf',
            ceph.confPath,
            '--id',
            'admin',
            'export-diff',
            '--no-progress',
            '--from-snap',
            'latch-base-b1',
            `${ceph.pool}/vol@bench-now`,
            '-',
          ],
          { stdio: ['ignore', nul, 'pipe'], timeout: 600_000 },
        );
        if (r.status !== 0) throw new Error(`rbd export-diff failed: ${r.stderr.toString()}`);
      } finally {
        closeSync(nul);
      }
      return performance.now() - started;
    };
    const exportDiffMs = [exportDiff(), exportDiff(), exportDiff()].sort((a, b) => a - b)[1] ?? Number.NaN;
    await ceph.rbd(['snap', 'rm', '--no-progress', `${ceph.pool}/vol@bench-now`]);

    const second = await sampling(mountDir, async () => child({ ...base, op: 'backup', volume: 'vol', name: 'b2' }));
    // A third backup with nothing changed: what a backup costs whatever it reads (snapshots, listings, the manifests).
    const unchanged = child({ ...base, op: 'backup', volume: 'vol', name: 'b3' });
    const restore = child({ ...base, op: 'restore', volume: 'restored', name: 'b2' });
    const noop = child({ ...base, op: 'noop', volume: 'none', name: 'none' });
    const du = JSON.parse((await ceph.rbd(['du', '--format', 'json', `${ceph.pool}/restored`])).stdout) as {
      images: { used_size: number }[];
    };

    const read1 = Number(first.value.bytesRead);
    const read2 = Number(second.value.bytesRead);
    const ratio = exportDiffMs / second.value.ms;
    const figures: Figure[] = [
      {
        section: 'backup-rbd',
        what: 'rbd first backup (4 GiB volume, 1 GiB written): bytes read from the cluster / allocated',
        value: `${(read1 / WRITTEN).toFixed(3)} (${mib(read1)})`,
        target: '<= 1.00',
        pass: read1 <= WRITTEN * 1.001,
      },
      {
        section: 'backup-rbd',
        what: 'rbd second backup after a 1% change: bytes read from the cluster / changed bytes',
        value: `${(read2 / CHANGE).toFixed(2)} (${mib(read2)} for ${mib(CHANGE)})`,
        target: '<= 2.00',
        pass: read2 <= 2 * CHANGE,
      },
      {
        section: 'backup-rbd',
        what: "rbd backups: peak local disk in the node's mountDir (first, second)",
        value: `${mib(first.peakBytes)}, ${mib(second.peakBytes)}`,
        target: '0 (no local copy)',
        pass: first.peakBytes === 0 && second.peakBytes === 0,
      },
      {
        section: 'backup-rbd',
        what: 'rbd second backup / rbd export-diff of the same change to /dev/null: throughput',
        value: `${ratio.toFixed(2)} (${Math.round(second.value.ms)} ms vs ${Math.round(exportDiffMs)} ms)`,
        target: '',
      },
      {
        section: 'backup-rbd',
        what: 'rbd backup with nothing changed (its fixed cost): time, bytes read',
        value: `${Math.round(unchanged.ms)} ms, ${mib(Number(unchanged.bytesRead))}`,
        target: '',
      },
      {
        section: 'backup-rbd',
        what: 'rbd backup and restore: peak memory (maxRSS of the process: first backup, second, restore; the same process idle)',
        value: `${mib(first.value.maxRssBytes)}, ${mib(second.value.maxRssBytes)}, ${mib(restore.maxRssBytes)}; ${mib(noop.maxRssBytes)}`,
        target: '',
      },
    ];
    const details = {
      'first backup': { ...first.value, peakLocalBytes: first.peakBytes },
      'second backup': { ...second.value, peakLocalBytes: second.peakBytes },
      'export-diff ms (median of 3)': Math.round(exportDiffMs),
      'unchanged backup': unchanged,
      restore: { ...restore, imageUsedBytes: du.images[0]?.used_size },
      'target on disk MiB': Number((allocatedUnder(target) / MiB).toFixed(1)),
    };
    return { figures, details };
  } finally {
    await ceph.stop();
    rmSync(work, { recursive: true, force: true });
  }
}

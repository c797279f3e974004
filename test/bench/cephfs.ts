// npm run bench -- --only cephfs: a shared volume's throughput (mounted through the driver: ceph-fuse as the node's
// identity, bind-mounted into a pod dir) against ceph-fuse mounted by hand on another subvolume of the same file
// system as the same identity, as ratios. Four writers each: 1 MiB sequential writes, and 4 KiB random writes with an
// fsync after each. Rounds alternate the two, so the shared machine's noise falls on both alike.
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import type { Figure } from './figures.js';
import { ioSkipReason, type SectionResult } from './io.js';

const ROOT = resolve(__dirname, '..', '..');
const LATCH = join(ROOT, 'bin', 'latch');
const SECONDS = Number(process.env.BENCH_FIO_SECONDS ?? 3);
const ROUNDS = Number(process.env.BENCH_FIO_ROUNDS ?? 3);

const JOBS = [
  { name: '1M sequential write, 4 writers', args: ['--rw=write', '--bs=1M', '--size=64M', '--end_fsync=1'], unit: 'MiB/s' },
  { name: '4k random write + fsync, 4 writers', args: ['--rw=randwrite', '--bs=4k', '--size=16M', '--fsync=1'], unit: 'IOPS' },
] as const;

function fio(dir: string, job: (typeof JOBS)[number]): number {
  const out = execFileSync(
    'fio',
    [
      '--name=bench',
      `--directory=${dir}`,
      '--numjobs=4',
      '--group_reporting',
      '--time_based',
      `--runtime=${SECONDS}`,
      '--ioengine=psync',
      '--output-format=json',
      ...job.args,
    ],
    { encoding: 'utf8', timeout: (SECONDS + 120) * 1000 },
  );
  const write = (JSON.parse(out) as { jobs: { write: { bw_bytes: number; iops: number } }[] }).jobs[0]?.write;
  if (!write) throw new Error('fio printed no write figures');
  return job.unit === 'IOPS' ? write.iops : write.bw_bytes / 1024 / 1024;
}

const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)] ?? NaN;

export async function sharedIo(): Promise<SectionResult> {
  const section = 'cephfs';
  const { cephSkipReason, startCephCluster } = await import('../ceph/cluster.js');
  const { cephfsNodeCaps } = await import('../../src/sys/cephfs.js');
  const { run } = await import('../../src/sys/run.js');
  const skip =
    cephSkipReason() ??
    ioSkipReason() ??
    (existsSync('/usr/bin/ceph-fuse') ? undefined : 'ceph-fuse is not installed') ??
    (existsSync(LATCH) ? undefined : 'bin/latch is missing');
  if (skip) return { figures: [{ section, what: 'shared volume I/O', value: `skipped: ${skip}`, target: '' }], details: {} };
  const ceph = await startCephCluster({ cephfs: true });
  const details: Record<string, unknown> = {};
  const figures: Figure[] = [];
  try {
    const client = await ceph.createClient('latch-bench', { caps: cephfsNodeCaps(ceph.pool, 'cephfs', 'latch') });
    const config = join(ceph.dir, 'bench-config.json');
    writeFileSync(
      config,
      JSON.stringify({
        nodeName: 'node-a',
        oneHost: true,
        attach: false,
        stateDir: join(ceph.dir, 'state'),
        logFile: join(ceph.dir, 'latch.log'),
        backend: {
          type: 'rbd',
          pool: ceph.pool,
          cephConf: client.confPath,
          clientId: client.id,
          keyring: client.keyringPath,
          mountDir: join(ceph.dir, 'mnt', 'rbd'),
          cephfs: { fsName: 'cephfs', group: 'latch', client: 'ceph-fuse', mountDir: join(ceph.dir, 'mnt', 'cephfs') },
        },
      }),
    );
    const env = { ...process.env, LATCH_CONFIG: config };
    const podDir = join(ceph.dir, 'pods', 'uid-1', 'volumes', 'latch~latch', 'pv-bench');
    mkdirSync(podDir, { recursive: true });
    const options = JSON.stringify({
      'kubernetes.io/pvOrVolumeName': 'pv-bench',
      'kubernetes.io/pod.uid': 'uid-1',
      accessMode: 'ReadWriteMany',
      size: '2Gi',
    });
    const called = spawnSync(LATCH, ['mount', podDir, options], { encoding: 'utf8', env, timeout: 120_000 });
    const reply = JSON.parse(called.stdout || '{"status":"Failure","message":"no reply"}') as { status: string; message?: string };
    if (reply.status !== 'Success') throw new Error(`mount: ${reply.message ?? ''}`);
    // The baseline: another subvolume with the same quota, mounted by hand with ceph-fuse as the same identity.
    await ceph.ceph(['fs', 'subvolume', 'create', 'cephfs', 'by-hand', '--group_name', 'latch', '--size', String(2 * 1024 ** 3)]);
    const path = (await ceph.ceph(['fs', 'subvolume', 'getpath', 'cephfs', 'by-hand', '--group_name', 'latch'])).stdout.trim();
    const hand = join(ceph.dir, 'mnt', 'by-hand');
    mkdirSync(hand, { recursive: true });
    await run('ceph-fuse', ['--conf', client.confPath, '--id', client.id, '--client_fs', 'cephfs', '--client_mountpoint', path, hand], {
      timeoutMs: 30_000,
    });
    console.log(`\nShared volume I/O (ceph-fuse through the driver) vs ceph-fuse by hand; ${ROUNDS} x ${SECONDS} s per job`);
    for (const job of JOBS) {
      const volume: number[] = [];
      const baseline: number[] = [];
      for (let round = 0; round < ROUNDS; round++) {
        volume.push(fio(podDir, job));
        baseline.push(fio(hand, job));
        execFileSync('sh', ['-c', `rm -f "${podDir}"/bench.* "${hand}"/bench.*`]);
      }
      const [v, b] = [median(volume), median(baseline)];
      details[job.name] = { volume, baseline, unit: job.unit };
      figures.push({
        section,
        what: `shared volume vs ceph-fuse by hand: ${job.name}`,
        value: `${(v / b).toFixed(2)} (${v.toFixed(1)} vs ${b.toFixed(1)} ${job.unit})`,
        target: '',
      });
      console.log(`  ${job.name}: ${v.toFixed(1)} vs ${b.toFixed(1)} ${job.unit} (ratio ${(v / b).toFixed(2)})`);
    }
    await run('umount', [hand], { timeoutMs: 30_000 });
    spawnSync(LATCH, ['unmount', podDir], { encoding: 'utf8', env, timeout: 120_000 });
  } finally {
    await ceph.stop();
  }
  return { figures, details };
}

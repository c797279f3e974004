// The S3 backup benchmark (issue 37): the same image as the directory benchmark (backup-image.ts: 1 GiB ext4, about
// 10% full of real files), encrypted under one key, backed up to an S3 target (Ceph's RADOS Gateway on a one-host
// test cluster: test/ceph/cluster.ts, test/ceph/rgw.ts) and to a directory target, alternating over REPS rounds, each
// into an empty target (a new bucket, a new directory): the ratio of the medians. Then 1% of the image changes and
// both targets take an incremental backup. Each round's backup is restored on "another node": a process of its own
// (backup-s3-child.ts) with node-b's configuration file, which names the same target with node-b's own copies of the
// credentials and key files; from S3 against from the directory, alternating, each restored image's sha256 against
// the image's. `npm run bench:backup` runs it after the directory and rbd benchmarks (`-- --only s3`: alone).
import { execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { copyFileSync, createReadStream, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pipeline } from 'node:stream/promises';
import { CreateBucketCommand, S3Client } from '@aws-sdk/client-s3';
import { createBackup } from '../../src/backup/create.js';
import type { DirTarget, S3Target } from '../../src/backup/layout.js';
import type { Manifest } from '../../src/backup/manifest.js';
import { cephSkipReason, startCephCluster, type CephCluster } from '../ceph/cluster.js';
import { rgwSkipReason, startRgw } from '../ceph/rgw.js';
import { filledImage, IMAGE_SIZE, median, MiB, overwrite, timed } from './backup-image.js';
import type { Figure } from './figures.js';

const REPS = Number(process.env.BENCH_BACKUP_REPS ?? 3);
const CHANGE = IMAGE_SIZE / 100;

async function sha256(path: string): Promise<string> {
  const hash = createHash('sha256');
  await pipeline(createReadStream(path), hash);
  return hash.digest('hex');
}

interface Restored {
  node: string;
  bytesWritten: number;
  ms: number;
  maxRssBytes: number;
}

/** A restore by node-b: backup-s3-child.ts with node-b's configuration file. */
function restoreOnNodeB(configFile: string, name: string, destination: string): Restored {
  const out = execFileSync(process.execPath, ['--import', 'tsx', join(__dirname, 'backup-s3-child.ts'), configFile, name, destination], {
    encoding: 'utf8',
    timeout: 600_000,
  });
  return JSON.parse(out.trim().split('\n').at(-1) ?? '{}') as Restored;
}

export async function s3BackupBench(): Promise<{ figures: Figure[]; details: Record<string, unknown> }> {
  const skip = process.getuid?.() !== 0 ? 'needs root' : (cephSkipReason() ?? rgwSkipReason());
  if (skip) return { figures: [{ section: 'backup-s3', what: 'S3 backups', value: `skipped: ${skip}`, target: '' }], details: {} };
  const work = mkdtempSync(join(tmpdir(), 'latch-s3-backup-bench-'));
  let ceph: CephCluster | undefined;
  let s3: S3Client | undefined;
  try {
    const { image, allocated } = filledImage(work);
    const imageSha = await sha256(image);
    ceph = await startCephCluster();
    const rgw = await startRgw(ceph);
    s3 = new S3Client({
      endpoint: rgw.endpoint,
      region: 'us-east-1',
      forcePathStyle: true,
      credentials: { accessKeyId: rgw.accessKeyId, secretAccessKey: rgw.secretAccessKey },
    });

    // Each node's own files: node-a makes the backups, node-b restores them, with copies of the same secrets.
    const nodeDir = (node: string) => {
      const dir = join(work, node);
      mkdirSync(dir, { mode: 0o700 });
      const keyFile = join(dir, 'backup.key');
      const credentialsFile = join(dir, 'credentials.json');
      copyFileSync(rgw.credentialsFile, credentialsFile);
      return { dir, keyFile, credentialsFile };
    };
    const a = nodeDir('node-a');
    const b = nodeDir('node-b');
    const key = `${randomBytes(48).toString('base64')}\n`;
    for (const file of [a.keyFile, b.keyFile]) writeFileSync(file, key, { mode: 0o600 });
    /** node-b's configuration file naming `target` (with node-b's own secrets). */
    const nodeBConfig = (target: DirTarget | S3Target, tag: string) => {
      const file = join(b.dir, `config-${tag}.json`);
      const own =
        target.type === 's3' ? { ...target, keyFile: b.keyFile, credentialsFile: b.credentialsFile } : { ...target, keyFile: b.keyFile };
      const raw = {
        nodeName: 'node-b',
        poolDir: join(b.dir, 'pool'),
        stateDir: join(b.dir, 'state'),
        logFile: join(b.dir, 'latch.log'),
        backupTarget: own,
      };
      writeFileSync(file, JSON.stringify(raw), { mode: 0o600 });
      return file;
    };
    let made = 0;
    const fresh = (name: string) => mkdtempSync(join(work, `${name}-${made++}-`));

    const dirBackup: number[] = [];
    const s3Backup: number[] = [];
    const dirRestore: Restored[] = [];
    const s3Restore: Restored[] = [];
    let checksumsMatched = 0;
    let targets: { dir: DirTarget; s3: S3Target } | undefined;
    let first: Manifest | undefined;
    for (let i = 0; i < REPS; i++) {
      const bucket = `bench-${i}`;
      await s3.send(new CreateBucketCommand({ Bucket: bucket }));
      const round = {
        dir: { type: 'dir', path: fresh('target'), keyFile: a.keyFile } satisfies DirTarget,
        s3: {
          type: 's3',
          endpoint: rgw.endpoint,
          bucket,
          prefix: 'cluster-a/',
          credentialsFile: a.credentialsFile,
          keyFile: a.keyFile,
        } satisfies S3Target,
      };
      targets = round;
      // Alternating which goes first, so that the machine's drift and the page cache favour neither.
      for (const kind of i % 2 === 0 ? (['dir', 's3'] as const) : (['s3', 'dir'] as const)) {
        const backup = await timed(() => createBackup({ target: round[kind], source: image, volume: 'vol', name: 'first' }));
        (kind === 'dir' ? dirBackup : s3Backup).push(backup.ms);
        first = backup.value;
      }
      for (const kind of i % 2 === 0 ? (['s3', 'dir'] as const) : (['dir', 's3'] as const)) {
        const destination = join(fresh('restore'), 'vol.img');
        const restored = restoreOnNodeB(nodeBConfig(round[kind], `${kind}-${i}`), 'first', destination);
        (kind === 'dir' ? dirRestore : s3Restore).push(restored);
        const same = (await sha256(destination)) === imageSha;
        if (!same && kind === 'dir') throw new Error('the restore from the directory target differs from the image');
        if (same && kind === 's3') checksumsMatched++;
        rmSync(destination);
      }
    }
    if (!targets || !first) throw new Error('BENCH_BACKUP_REPS must be at least 1');
    const last = targets;

    // 1% of the image changes; the last round's targets take an incremental backup each.
    overwrite(image, IMAGE_SIZE / 2, CHANGE);
    const dirIncremental = await timed(() => createBackup({ target: last.dir, source: image, volume: 'vol', name: 'second' }));
    const s3Incremental = await timed(() => createBackup({ target: last.s3, source: image, volume: 'vol', name: 'second' }));

    const ms = (n: number) => `${Math.round(n)} ms`;
    const rate = (n: number) => `${((IMAGE_SIZE / MiB / n) * 1000).toFixed(0)} MiB/s`;
    const [dirMs, s3Ms] = [median(dirBackup), median(s3Backup)];
    const [dirRestoreMs, s3RestoreMs] = [median(dirRestore.map((r) => r.ms)), median(s3Restore.map((r) => r.ms))];
    const figures: Figure[] = [
      {
        section: 'backup-s3',
        what: 'S3 target (RADOS Gateway) / directory target: first backup time, the same 1 GiB image 10% full, encrypted',
        value: `${(s3Ms / dirMs).toFixed(2)} (${ms(s3Ms)} vs ${ms(dirMs)}; ${(first.stats.newBytesStored / MiB).toFixed(1)} MiB stored in ${first.stats.newChunks} chunks)`,
        target: '',
      },
      {
        section: 'backup-s3',
        what: 'S3 target / directory target: incremental backup time after a 1% change',
        value: `${(s3Incremental.ms / dirIncremental.ms).toFixed(2)} (${ms(s3Incremental.ms)} vs ${ms(dirIncremental.ms)}; ${s3Incremental.value.stats.newChunks} new chunks)`,
        target: '',
      },
      {
        section: 'backup-s3',
        what: 'restore on another node (node-b: its own configuration and process): from S3 / from the directory, time',
        value: `${(s3RestoreMs / dirRestoreMs).toFixed(2)} (${ms(s3RestoreMs)} vs ${ms(dirRestoreMs)}; ${rate(s3RestoreMs)} vs ${rate(dirRestoreMs)} of the image)`,
        target: '',
      },
      {
        section: 'backup-s3',
        what: 'restore from S3 on another node: sha256 of the restored image equal to the image',
        value: `${checksumsMatched} of ${REPS} restores`,
        target: 'every restore',
        pass: checksumsMatched === REPS,
      },
    ];
    const details = {
      image: `${IMAGE_SIZE / MiB} MiB, ${(allocated / MiB).toFixed(0)} MiB allocated`,
      rounds: REPS,
      'dir backup ms': dirBackup.map(Math.round),
      's3 backup ms': s3Backup.map(Math.round),
      'dir restore on node-b ms': dirRestore.map((r) => Math.round(r.ms)),
      's3 restore on node-b ms': s3Restore.map((r) => Math.round(r.ms)),
      's3 restore on node-b peak memory MiB': s3Restore.map((r) => Math.round(r.maxRssBytes / MiB)),
      'incremental ms (dir, s3)': [Math.round(dirIncremental.ms), Math.round(s3Incremental.ms)],
      'first backup stored': `${(first.stats.newBytesStored / MiB).toFixed(1)} MiB in ${first.stats.newChunks} chunks of ${first.chunks.length}`,
    };
    return { figures, details };
  } finally {
    s3?.destroy();
    await ceph?.stop();
    rmSync(work, { recursive: true, force: true });
  }
}

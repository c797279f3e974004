// Backup benchmark (root): a 1 GiB ext4 image with about 10% of it real files (/usr/include), backed up to a
// directory, against a plain sequential copy of the same image in the same run: `dd bs=4M conv=sparse,fsync`, which
// reads every byte, writes only the data and makes it durable (a backup does as much, less the holes of an image
// file, which it learns from the kernel and does not read, plus hashing and compressing); then an incremental
// backup after 1% of the image changed, and a restore. `cp --sparse=always` is shown too, for information: coreutils 9 copies only the
// data extents, in the kernel (copy_file_range), and leaves them unsynced in the page cache, so it does a small
// fraction of the work. `npm run bench` runs it as its
// `backup` section (figures with targets); `npm run bench:backup` runs it alone and prints the details, then the rbd
// benchmark (backup-rbd.ts) and the S3 one (backup-s3.ts).
// The machine is shared and noisy: the ratios to the copy matter, not the absolute times. The candidates alternate
// over REPS rounds and each figure is a ratio of medians; the image is read from the page cache by every candidate
// alike.
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { createBackup } from '../../src/backup/create.js';
import type { Manifest } from '../../src/backup/manifest.js';
import { restoreBackup } from '../../src/backup/restore.js';
import { filledImage, IMAGE_SIZE as SIZE, median, MiB, overwrite, timed } from './backup-image.js';
import { rbdBackupBench } from './backup-rbd.js';
import { s3BackupBench } from './backup-s3.js';
import type { Figure } from './figures.js';

const REPS = Number(process.env.BENCH_BACKUP_REPS ?? 3);
/** The incremental backup's change: 1% of the image, in one run of random (incompressible) bytes. */
const CHANGE = SIZE / 100;

function duBytes(path: string): number {
  return Number(execFileSync('du', ['-s', '-B1', path], { encoding: 'utf8' }).split('\t')[0]);
}

/** The backup section of `npm run bench`: figures with targets, and the details for the results file. */
export async function backupThroughput(): Promise<{ figures: Figure[]; details: Record<string, unknown> }> {
  if (process.getuid?.() !== 0) {
    return { figures: [{ section: 'backup', what: 'backup', value: 'skipped: needs root', target: '' }], details: {} };
  }
  const root = mkdtempSync('/tmp/latch-backup-bench-');
  try {
    const { image, allocated } = filledImage(root);
    const fresh = (name: string) => {
      const dir = join(root, name);
      rmSync(dir, { recursive: true, force: true });
      mkdirSync(dir);
      return dir;
    };

    // Rounds of: the copy, a first backup into an empty target, its restore, the extent copy. Alternating, so that
    // the machine's drift hits every candidate alike.
    const dd: number[] = [];
    const cp: number[] = [];
    const first: number[] = [];
    const restore: number[] = [];
    let target = { type: 'dir' as const, path: '' };
    let firstManifest: Manifest | undefined;
    for (let i = 0; i < REPS; i++) {
      const copy = join(fresh('dd'), 'vol.img');
      dd.push((await timed(() => execFileSync('dd', [`if=${image}`, `of=${copy}`, 'bs=4M', 'conv=sparse,fsync', 'status=none']))).ms);
      target = { type: 'dir', path: fresh('target') };
      const backup = await timed(() => createBackup({ target, source: image, volume: 'vol', name: 'first' }));
      first.push(backup.ms);
      firstManifest = backup.value;
      const restored = join(fresh('restore'), 'vol.img');
      restore.push((await timed(() => restoreBackup({ target, name: 'first', destination: restored }))).ms);
      execFileSync('cmp', [image, restored]);
      cp.push((await timed(() => execFileSync('cp', ['--sparse=always', image, join(fresh('cp'), 'vol.img')]))).ms);
    }
    if (!firstManifest) throw new Error('BENCH_BACKUP_REPS must be at least 1');
    const storedFirst = duBytes(join(target.path, 'chunks'));

    // 1% of the image changes (in the middle: inside the filesystem's data, chunk-aligned), then the same target.
    overwrite(image, SIZE / 2, CHANGE);
    const incremental = await timed(() => createBackup({ target, source: image, volume: 'vol', name: 'second' }));
    const moved = incremental.value.stats.newBytesStored;

    const ddMs = median(dd);
    const ratio = (ms: number) => ddMs / ms;
    const rate = (ms: number) => `${((SIZE / MiB / ms) * 1000).toFixed(0)} MiB/s`;
    const figures: Figure[] = [
      {
        section: 'backup',
        what: 'first backup / sequential copy (dd): throughput, 1 GiB image 10% full',
        value: `${ratio(median(first)).toFixed(2)} (${rate(median(first))} vs ${rate(ddMs)})`,
        target: '>= 0.50',
        pass: ratio(median(first)) >= 0.5,
      },
      {
        section: 'backup',
        what: 'incremental backup after a 1% change / sequential copy (dd): throughput',
        value: `${ratio(incremental.ms).toFixed(2)} (${rate(incremental.ms)})`,
        target: '>= 0.50',
        pass: ratio(incremental.ms) >= 0.5,
      },
      {
        section: 'backup',
        what: 'cp --sparse=always (extent copy, not synced) / sequential copy (dd): throughput',
        value: `${(ddMs / median(cp)).toFixed(2)} (${rate(median(cp))})`,
        target: '',
      },
      {
        section: 'backup',
        what: 'incremental backup after a 1% change: bytes written to the target / image size',
        value: `${((moved / SIZE) * 100).toFixed(2)}% (${(moved / MiB).toFixed(1)} MiB for ${(CHANGE / MiB).toFixed(1)} MiB changed)`,
        target: '',
      },
      {
        section: 'backup',
        what: 'restore / sequential copy (dd): throughput',
        value: `${ratio(median(restore)).toFixed(2)} (${rate(median(restore))})`,
        target: '>= 0.50',
        pass: ratio(median(restore)) >= 0.5,
      },
    ];
    const s = firstManifest.stats;
    const details = {
      image: `${SIZE / MiB} MiB, ${(allocated / MiB).toFixed(0)} MiB allocated (${((allocated / SIZE) * 100).toFixed(1)}%)`,
      rounds: REPS,
      'dd bs=4M conv=sparse,fsync ms': dd.map(Math.round),
      'cp --sparse=always ms': cp.map(Math.round),
      'first backup ms': first.map(Math.round),
      'restore ms': restore.map(Math.round),
      'incremental backup ms': Math.round(incremental.ms),
      'incremental new chunks': incremental.value.stats.newChunks,
      'data chunks': `${s.dataChunks} of ${firstManifest.chunks.length} (${(s.dataBytes / MiB).toFixed(0)} MiB)`,
      'stored (compressed)': `${(s.newBytesStored / MiB).toFixed(1)} MiB in ${s.newChunks} chunks (du: ${(storedFirst / MiB).toFixed(1)} MiB); ratio ${(s.dataBytes / s.newBytesStored).toFixed(2)} to the data chunks`,
      'dd copy on disk MiB': Number((duBytes(join(root, 'dd')) / MiB).toFixed(1)),
    };
    return { figures, details };
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
}

/** `npm run bench:backup [-- --only dir|rbd|s3]`: the directory benchmark, the rbd one (backup-rbd.ts), the S3 one (backup-s3.ts). */
async function main(): Promise<void> {
  if (process.getuid?.() !== 0) throw new Error('the backup benchmark needs root (it mounts a loop device to fill the image)');
  const only = process.argv.includes('--only') ? process.argv[process.argv.indexOf('--only') + 1] : undefined;
  const runs = [
    ...(only === undefined || only === 'dir' ? [backupThroughput] : []),
    ...(only === undefined || only === 'rbd' ? [rbdBackupBench] : []),
    ...(only === undefined || only === 's3' ? [s3BackupBench] : []),
  ];
  for (const bench of runs) {
    const { figures, details } = await bench();
    for (const f of figures) process.stdout.write(`${f.what}: ${f.value}${f.target ? ` (target ${f.target})` : ''}\n`);
    for (const [k, v] of Object.entries(details)) process.stdout.write(`  ${k}: ${JSON.stringify(v)}\n`);
  }
}

// `npm run bench:backup` runs this file; bench.ts imports it.
if (require.main === module) {
  main().catch((err: unknown) => {
    process.stderr.write(`${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exit(1);
  });
}

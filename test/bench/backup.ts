// Backup benchmark (root): a 1 GiB ext4 image with about 10% of it real files (/usr/include), backed
// up to a directory, against a plain sequential copy of the same image in the same run (cp --sparse=always, and tar
// --sparse), then an unchanged second backup, and a restore. Run: node --import tsx test/bench/backup.ts
// The machine is shared and noisy: the ratios to the copies matter, not the absolute times. The image is read from
// the page cache by every candidate alike.
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { createBackup } from '../../src/backup/create.js';
import { restoreBackup } from '../../src/backup/restore.js';

const MiB = 1024 * 1024;
const SIZE = 1024 * MiB;

function timed<T>(fn: () => T): { ms: number; value: T } {
  const start = performance.now();
  const value = fn();
  return { ms: performance.now() - start, value };
}

async function timedAsync<T>(fn: () => Promise<T>): Promise<{ ms: number; value: T }> {
  const start = performance.now();
  const value = await fn();
  return { ms: performance.now() - start, value };
}

function duBytes(path: string): number {
  return Number(execFileSync('du', ['-s', '-B1', path], { encoding: 'utf8' }).split('\t')[0]);
}

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) throw new Error('the backup benchmark needs root (it mounts a loop device to fill the image)');
  const root = mkdtempSync('/tmp/latch-backup-bench-');
  try {
    const image = join(root, 'vol.img');
    execFileSync('truncate', ['-s', String(SIZE), image]);
    execFileSync('mkfs.ext4', ['-q', '-F', image]);
    const mnt = join(root, 'mnt');
    mkdirSync(mnt);
    execFileSync('mount', ['-o', 'loop', image, mnt]);
    try {
      for (const dir of ['/usr/include']) {
        execFileSync('cp', ['-r', dir, join(mnt, dir.replaceAll('/', '_'))]);
      }
    } finally {
      execFileSync('umount', [mnt]);
    }
    const allocated = statSync(image).blocks * 512;

    const out = (name: string) => {
      const dir = join(root, name);
      mkdirSync(dir);
      return dir;
    };
    const cp = timed(() => execFileSync('cp', ['--sparse=always', image, join(out('cp'), 'vol.img')]));
    const tar = timed(() => execFileSync('tar', ['--sparse', '-cf', join(out('tar'), 'vol.tar'), '-C', root, 'vol.img']));
    const target = { type: 'dir' as const, path: out('target') };
    const first = await timedAsync(() => createBackup({ target, source: image, volume: 'vol', name: 'first' }));
    const stored = duBytes(join(target.path, 'chunks'));
    const second = await timedAsync(() => createBackup({ target, source: image, volume: 'vol', name: 'second' }));
    const restored = join(out('restore'), 'vol.img');
    const restore = await timedAsync(() => restoreBackup({ target, name: 'first', destination: restored }));
    execFileSync('cmp', [image, restored]);

    const s = first.value.stats;
    const rate = (ms: number) => `${((SIZE / MiB / ms) * 1000).toFixed(0)} MiB/s of image`;
    const report = {
      image: `${SIZE / MiB} MiB, ${(allocated / MiB).toFixed(0)} MiB allocated (${((allocated / SIZE) * 100).toFixed(1)}%)`,
      'cp --sparse=always': `${cp.ms.toFixed(0)} ms (${rate(cp.ms)})`,
      'tar --sparse': `${tar.ms.toFixed(0)} ms (${rate(tar.ms)})`,
      'first backup': `${first.ms.toFixed(0)} ms (${rate(first.ms)}), ${(first.ms / cp.ms).toFixed(2)}x cp, ${(first.ms / tar.ms).toFixed(2)}x tar`,
      'unchanged second backup': `${second.ms.toFixed(0)} ms (${rate(second.ms)}), ${second.value.stats.newChunks} new chunks, ${(second.ms / cp.ms).toFixed(2)}x cp`,
      restore: `${restore.ms.toFixed(0)} ms (${rate(restore.ms)}), ${(restore.ms / cp.ms).toFixed(2)}x cp, ${restore.value.holeChunks} hole chunks left as holes`,
      'data chunks': `${s.dataChunks} of ${first.value.chunks.length} (${(s.dataBytes / MiB).toFixed(0)} MiB)`,
      'stored (compressed)': `${(s.newBytesStored / MiB).toFixed(1)} MiB in ${s.newChunks} chunks (du: ${(stored / MiB).toFixed(1)} MiB); ratio ${(s.dataBytes / s.newBytesStored).toFixed(2)} to the data chunks, ${(allocated / s.newBytesStored).toFixed(2)} to the allocated image`,
      'cp copy on disk': `${(duBytes(join(root, 'cp')) / MiB).toFixed(1)} MiB; tar: ${(duBytes(join(root, 'tar')) / MiB).toFixed(1)} MiB`,
    };
    for (const [k, v] of Object.entries(report)) process.stdout.write(`${k.padEnd(24)} ${v}\n`);
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});

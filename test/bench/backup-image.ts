// What the backup benchmarks share (backup.ts: to a directory; backup-s3.ts: to S3 against a directory): the image
// they back up, a 1 GiB ext4 filesystem about 10% full of real files (a copy of /usr/include), and how they time.
import { execFileSync } from 'node:child_process';
import { closeSync, mkdirSync, openSync, statSync, writeSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';

export const MiB = 1024 * 1024;
export const IMAGE_SIZE = 1024 * MiB;

/** Makes `<root>/vol.img` (root only: it mounts a loop device to fill it); returns its path and bytes allocated. */
export function filledImage(root: string): { image: string; allocated: number } {
  const image = join(root, 'vol.img');
  execFileSync('truncate', ['-s', String(IMAGE_SIZE), image]);
  execFileSync('mkfs.ext4', ['-q', '-F', image]);
  const mnt = join(root, 'mnt');
  mkdirSync(mnt);
  execFileSync('mount', ['-o', 'loop', image, mnt]);
  try {
    execFileSync('cp', ['-r', '/usr/include', join(mnt, 'usr_include')]);
  } finally {
    execFileSync('umount', [mnt]);
  }
  return { image, allocated: statSync(image).blocks * 512 };
}

/** Overwrites `bytes` of the image at `offset` with random bytes (the "1% change" of an incremental backup). */
export function overwrite(image: string, offset: number, bytes: number): void {
  const fd = openSync(image, 'r+');
  try {
    for (let done = 0; done < bytes; done += MiB) writeSync(fd, randomBytes(Math.min(MiB, bytes - done)), 0, undefined, offset + done);
  } finally {
    closeSync(fd);
  }
}

export async function timed<T>(fn: () => T | Promise<T>): Promise<{ ms: number; value: T }> {
  const start = performance.now();
  const value = await fn();
  return { ms: performance.now() - start, value };
}

export function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  const at = (i: number) => sorted[i] ?? Number.NaN;
  return sorted.length % 2 === 1 ? at(mid) : (at(mid - 1) + at(mid)) / 2;
}

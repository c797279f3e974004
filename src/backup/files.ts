// The careful ways the engine reads files in a target that may be a network share (writes: atomic-file.ts).
import { chmod, mkdir, readdir, unlink } from 'node:fs/promises';
import type { FileHandle } from 'node:fs/promises';
import { join } from 'node:path';
import { leftoverOf } from '../atomic-file.js';
import { LatchError } from '../errors.js';
import { backupsDir, chunksDir, type DirTarget } from './layout.js';

/**
 * Reads exactly `length` bytes at `position` (into `into`, when given: a buffer of at least `length` bytes to reuse);
 * a short read means the source shrank underneath.
 */
export async function readExactly(handle: FileHandle, length: number, position: number, what: string, into?: Buffer): Promise<Buffer> {
  const buffer = into === undefined ? Buffer.allocUnsafe(length) : into.subarray(0, length);
  let done = 0;
  while (done < length) {
    const { bytesRead } = await handle.read(buffer, done, length - done, position + done);
    if (bytesRead === 0) throw new LatchError(`${what} ended at byte ${position + done}, before its size; did it shrink while being read?`);
    done += bytesRead;
  }
  return buffer;
}

/**
 * Removes the temp files of dead writers in `dir` (only call this holding the target's lock: every writer holds it, so
 * none is alive). Returns how many.
 */
export async function removeTempFiles(dir: string): Promise<number> {
  let removed = 0;
  for (const name of await readdirOrEmpty(dir)) {
    if (leftoverOf(name) === undefined) continue;
    await unlink(join(dir, name)).catch(() => undefined);
    removed++;
  }
  return removed;
}

export async function readdirOrEmpty(dir: string): Promise<string[]> {
  try {
    return await readdir(dir);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return [];
    throw err;
  }
}

/**
 * Makes the target's chunks/ and backups/ directories, or tightens them, to 0700 (layout.ts): a writer (holding the
 * lock) calls it first. Older versions left them 0755 with 0644 files inside; a 0700 directory closes all that is
 * below it, so the older files need not be visited. The target directory itself is the admin's and is left alone.
 */
export async function tightenTarget(target: DirTarget): Promise<void> {
  for (const dir of [chunksDir(target), backupsDir(target)]) {
    await mkdir(dir, { recursive: true, mode: 0o700 });
    await chmod(dir, 0o700);
  }
}

// The careful ways the engine writes and reads files in a target that may be a network share.
import { constants } from 'node:fs';
import { chmod, mkdir, open, readdir, rename, unlink } from 'node:fs/promises';
import type { FileHandle } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { LatchError } from '../errors.js';
import { syncDir } from '../sys/files.js';
import { TEMP_SUFFIX, backupsDir, chunksDir, tempPathFor, type DirTarget } from './layout.js';

/**
 * Writes `data` to `path` so that a reader sees the old state or the whole new file, never a part: a private temp
 * file, fsync, rename over, fsync of the directory (the rename itself must survive a power loss). `syncDirectory`
 * false leaves that last step to the caller (many chunks in one directory share one directory fsync).
 */
export async function writeFileAtomic(path: string, data: Uint8Array | string, syncDirectory = true, mode = 0o600): Promise<void> {
  const dir = dirname(path);
  const temp = tempPathFor(dir, basename(path));
  const handle = await open(temp, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, mode);
  try {
    try {
      await handle.writeFile(data);
      await handle.sync();
    } finally {
      await handle.close();
    }
    await rename(temp, path);
  } catch (err) {
    await unlink(temp).catch(() => undefined);
    throw err;
  }
  if (syncDirectory) await syncDir(dir);
}

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

/** Removes the temp files of dead writers in `dir` (only call this holding the target's lock). Returns how many. */
export async function removeTempFiles(dir: string): Promise<number> {
  let removed = 0;
  for (const name of await readdirOrEmpty(dir)) {
    if (!name.endsWith(TEMP_SUFFIX)) continue;
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

// Writing a file atomically, the one way latch does it: a reader (and a crash) sees the old file or the whole new one,
// never a part, and never the new content with a wider mode than asked for.
//
//   1. a private temp file beside the target, `.<name>.<pid>.<8 hex>.tmp`: created exclusively (O_EXCL, O_NOFOLLOW),
//      so two writers, in one process or in two (a pid namespace, a recycled pid), never share one;
//   2. its mode set (fchmod, whatever the umask) before the first byte is written;
//   3. the content, then fsync of the file, then rename over the target, then fsync of the directory (the rename
//      itself must survive a power loss).
//
// A writer killed in between leaves its temp file, which leftoverOf recognises (with the pid that wrote it), so each
// place that cleans up can tell its own leftovers from anyone else's files. A base module, not sys/: the configuration
// (config.ts, a base module itself) writes through it too, so it imports nothing of latch: every driver call loads it.
import { closeSync, constants, fchmodSync, fsyncSync, openSync, renameSync, unlinkSync, writeSync } from 'node:fs';
import { open, rename, unlink, type FileHandle } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';

const CREATE_PRIVATE = constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW;

/**
 * Eight random hex digits that keep one process's temp file names apart from another's with the same pid (a pid
 * namespace, a recycled pid). Not a secret and not a lock, so Math.random (node:crypto costs a call 2.5 ms to load):
 * every such name is created exclusively, so a clash fails the create, it never shares a file. The file store's temp
 * names (store/file.ts) use it too.
 */
export function tempTag(): string {
  return Math.floor(Math.random() * 0x1_0000_0000)
    .toString(16)
    .padStart(8, '0');
}

/** `.<name>.<pid>.<tempTag>.tmp`: hidden (kubelet's prober ignores dot-names), and what leftoverOf recognises. */
const LEFTOVER = /^\.(.+)\.([1-9][0-9]{0,9})\.([0-9a-f]{8})\.tmp$/;

export interface AtomicWriteOptions {
  /** The file's mode, set before its first byte is written (whatever the umask). Default 0600. */
  mode?: number;
  /**
   * What is fsynced. 'all' (the default): the file, and the directory after the rename. 'file': the file only, for a
   * caller that writes several files in one directory and fsyncs it once (syncDir). 'none': nothing, for a cache
   * that is rebuilt when lost.
   */
  sync?: 'all' | 'file' | 'none';
}

/** What is written: bytes, or a function that writes them through the temp file's handle (a streamed copy). */
export type AtomicContent = string | Uint8Array | ((handle: FileHandle) => Promise<void>);

/**
 * The path of a fresh temp file (or directory) beside `path`, to be renamed or linked onto it. Unique per writer:
 * the pid and a random tag, and every caller creates it exclusively, so a clash fails, it never shares.
 */
export function tempPathFor(path: string): string {
  return join(dirname(path), `.${basename(path)}.${process.pid}.${tempTag()}.tmp`);
}

/** A temp file (or directory) of tempPathFor's: the name it was to become, and the pid of its writer. */
export interface Leftover {
  name: string;
  pid: number;
}

/**
 * Whether a directory entry's name is a temp file of tempPathFor's (a writer's in progress, or one killed), and of
 * what; undefined for any other name, which no clean-up may touch.
 */
export function leftoverOf(entry: string): Leftover | undefined {
  const match = LEFTOVER.exec(entry);
  return match?.[1] === undefined ? undefined : { name: match[1], pid: Number(match[2]) };
}

/** Writes `content` to `path` atomically (see the top of this file). */
export async function writeFileAtomic(path: string, content: AtomicContent, options: AtomicWriteOptions = {}): Promise<void> {
  const { mode = 0o600, sync = 'all' } = options;
  const temp = tempPathFor(path);
  const handle = await open(temp, CREATE_PRIVATE, mode);
  try {
    try {
      await handle.chmod(mode);
      if (typeof content === 'function') await content(handle);
      else await handle.writeFile(content);
      if (sync !== 'none') await handle.sync();
    } finally {
      await handle.close();
    }
    await rename(temp, path);
  } catch (err) {
    await unlink(temp).catch(() => undefined);
    throw err;
  }
  if (sync === 'all') await syncDir(dirname(path));
}

/** writeFileAtomic for a caller that cannot wait (loading the configuration, before anything asynchronous runs). */
export function writeFileAtomicSync(path: string, content: string | Uint8Array, options: AtomicWriteOptions = {}): void {
  const { mode = 0o600, sync = 'all' } = options;
  const temp = tempPathFor(path);
  const fd = openSync(temp, CREATE_PRIVATE, mode);
  try {
    try {
      fchmodSync(fd, mode);
      const bytes = typeof content === 'string' ? Buffer.from(content, 'utf8') : content;
      for (let done = 0; done < bytes.length;) done += writeSync(fd, bytes, done, bytes.length - done);
      if (sync !== 'none') fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    renameSync(temp, path);
  } catch (err) {
    try {
      unlinkSync(temp);
    } catch {
      // Never made, or renamed already.
    }
    throw err;
  }
  if (sync === 'all') {
    const dir = openSync(dirname(path), 'r');
    try {
      fsyncSync(dir);
    } finally {
      closeSync(dir);
    }
  }
}

/** fsyncs a directory, so that a rename or link inside it survives a power loss. */
export async function syncDir(dir: string): Promise<void> {
  const handle = await open(dir, 'r');
  try {
    await handle.sync();
  } finally {
    await handle.close();
  }
}

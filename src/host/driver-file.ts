// The driver file kubelet runs: where it lives for a driver name, what is installed there, and which file this
// process is (the one install copies and doctor compares with).
import { createHash } from 'node:crypto';
import { lstat, open, realpath, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { isSingleExecutable } from '../config.js';
import { DRIVER_NAME_PATTERN, DEFAULT_DRIVER_NAME } from '../names.js';
import { LatchError } from '../errors.js';
import { applyEdits, type ByteEdit } from './elf.js';

/** Files are read in chunks of this size (a self-contained build is about 100 MB). */
export const CHUNK = 1024 * 1024;

/** `<pluginDir>/<vendor~driver>/<driver>` for a driver name vendor/driver. */
export function driverPath(pluginDir: string, driverName: string): { dir: string; file: string } {
  const [vendor, driver] = driverName.split('/');
  if (!DRIVER_NAME_PATTERN.test(driverName) || vendor === undefined || driver === undefined) {
    throw new LatchError(`driver name ${JSON.stringify(driverName)} must look like vendor/driver, e.g. ${DEFAULT_DRIVER_NAME}`);
  }
  const dir = join(pluginDir, `${vendor}~${driver}`);
  return { dir, file: join(dir, driver) };
}

/** The file kubelet should run: the SEA binary itself, or the bundle file node was started with. */
export async function runningExecutable(): Promise<{ path: string; selfContained: boolean }> {
  if (isSingleExecutable()) return { path: process.execPath, selfContained: true };
  const script = process.argv[1];
  if (!script) throw new LatchError('cannot tell which file is running: process.argv[1] is empty');
  return { path: await realpath(script), selfContained: false };
}

/** sha256 (hex) and size of a file, read in chunks; with `edits`, of the file as they would change it. */
export async function fileDigest(path: string, edits: readonly ByteEdit[] = []): Promise<{ sha256: string; size: number }> {
  const hash = createHash('sha256');
  const handle = await open(path, 'r');
  let size = 0;
  try {
    const buffer = Buffer.allocUnsafe(CHUNK);
    for (;;) {
      const { bytesRead } = await handle.read(buffer, 0, CHUNK, null);
      if (bytesRead === 0) break;
      applyEdits(buffer.subarray(0, bytesRead), size, edits);
      hash.update(buffer.subarray(0, bytesRead));
      size += bytesRead;
    }
  } finally {
    await handle.close();
  }
  return { sha256: hash.digest('hex'), size };
}

/** A sha256 short enough for messages. */
export function shortDigest(sha256: string): string {
  return sha256.slice(0, 12);
}

export type InstalledState =
  { state: 'missing' } | { state: 'present'; sha256: string; size: number; mode: number } | { state: 'not-a-file'; kind: string };

/** What is at the driver's path: nothing, a file (its digest and mode), or something kubelet cannot run. */
export async function installedState(file: string): Promise<InstalledState> {
  let info;
  try {
    info = await lstat(file);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return { state: 'missing' };
    throw err;
  }
  if (info.isSymbolicLink()) {
    try {
      info = await stat(file);
    } catch {
      return { state: 'not-a-file', kind: 'a dangling symbolic link' };
    }
  }
  if (!info.isFile()) return { state: 'not-a-file', kind: info.isDirectory() ? 'a directory' : 'not a regular file' };
  const digest = await fileDigest(file);
  return { state: 'present', ...digest, mode: info.mode & 0o7777 };
}

// Every latch build, old and new, bundle and single executable, carries the ledger's apiVersion as text (the single
// executable embeds the bundles' source as assets): another vendor's driver of the same name does not.
const LATCH_SIGNATURE = Buffer.from('latch/v1');

/** Whether the file at the driver's path is a latch build (and may be replaced by one), read in chunks. */
export async function isLatchDriver(file: string): Promise<boolean> {
  const handle = await open(file, 'r');
  try {
    const buffer = Buffer.alloc(CHUNK + LATCH_SIGNATURE.length);
    let carry = 0;
    for (;;) {
      const { bytesRead } = await handle.read(buffer, carry, CHUNK, null);
      if (bytesRead === 0) return false;
      const filled = carry + bytesRead;
      if (buffer.subarray(0, filled).includes(LATCH_SIGNATURE)) return true;
      // Keep the tail, so that a signature split across two chunks is still found.
      carry = Math.min(filled, LATCH_SIGNATURE.length - 1);
      buffer.copy(buffer, 0, filled - carry, filled);
    }
  } finally {
    await handle.close();
  }
}

// Deleting backups and collecting garbage: a chunk is garbage when no manifest names it. Both hold the target's
// lock, so no backup in progress can have counted on a chunk that gc removes.
import { LatchError } from '../errors.js';
import { CHUNKS, chunkKey, describeTarget, isChunkHash, manifestKey, type BackupTarget } from './layout.js';
import type { HeldLock, LockOptions } from './lock.js';
import { withTargetLock } from './target-lock.js';
import { listBackups, manifestExists } from './manifest.js';
import { checkTarget, storeOf } from './store.js';

export interface GcReport {
  removedChunks: number;
  freedBytes: number;
  keptChunks: number;
  removedTempFiles: number;
}

export interface DeleteOptions {
  target: BackupTarget;
  name: string;
  /** A backup that is already gone is fine (for a caller repeating a delete after a crash). */
  missingOk?: boolean | undefined;
  node?: string | undefined;
  lock?: LockOptions | undefined;
}

/** Removes the backup's manifest (even a damaged one), then every chunk no other backup needs. */
export async function deleteBackup(options: DeleteOptions): Promise<GcReport> {
  const { target, name } = options;
  await checkTarget(target);
  const key = manifestKey(name);
  return withTargetLock(target, `delete backup ${name}`, { ...options.lock, node: options.node }, async (lock) => {
    const store = await storeOf(target);
    if (await manifestExists(target, name)) {
      await store.delete(key);
      await store.flush();
    } else if (!options.missingOk) {
      throw new LatchError(`backup ${name} does not exist in ${describeTarget(target)} (latch backup list shows the backups)`);
    }
    return collect(target, lock);
  });
}

/** Removes the chunks no backup needs and the temp files of dead writers. */
export async function collectGarbage(options: { target: BackupTarget; node?: string; lock?: LockOptions }): Promise<GcReport> {
  await checkTarget(options.target);
  return withTargetLock(options.target, 'garbage collection', { ...options.lock, node: options.node }, (lock) =>
    collect(options.target, lock),
  );
}

async function collect(target: BackupTarget, lock: HeldLock): Promise<GcReport> {
  const needed = new Set<string>();
  const backups = await listBackups(target, undefined, (chunks) => {
    for (const hash of chunks) if (hash !== null) needed.add(hash);
  });
  const damaged = backups.filter((b) => b.error !== undefined);
  if (damaged.length > 0) {
    throw new LatchError(
      `not collecting garbage: the manifest of ${damaged.map((b) => b.name).join(', ')} cannot be read, so which chunks it ` +
        `needs is unknown (${damaged[0]?.error}). Delete that backup (latch backup delete) and run this again`,
    );
  }

  const report: GcReport = { removedChunks: 0, freedBytes: 0, keptChunks: 0, removedTempFiles: 0 };
  const store = await storeOf(target);
  report.removedTempFiles += await store.tidy();
  await lock.check();
  for (const { key, size } of await store.list(CHUNKS)) {
    const id = key.slice(key.lastIndexOf('/') + 1);
    // Only what is certainly a chunk of ours, at its own place, is removed; anything else in chunks/ is left alone.
    if (!isChunkHash(id) || key !== chunkKey(id) || needed.has(id)) {
      report.keptChunks++;
      continue;
    }
    const freed = await store.delete(key);
    report.removedChunks++;
    report.freedBytes += size ?? freed ?? 0;
  }
  await store.flush();
  return report;
}

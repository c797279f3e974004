// Deleting backups and collecting garbage: a chunk is garbage when no manifest names it. Both hold the target's
// lock, so no backup in progress can have counted on a chunk that gc removes.
import { stat, unlink } from 'node:fs/promises';
import { join } from 'node:path';
import { LatchError } from '../errors.js';
import { leftoverOf, syncDir } from '../atomic-file.js';
import { readdirOrEmpty, removeTempFiles, tightenTarget } from './files.js';
import { backupsDir, checkTarget, chunksDir, isChunkHash, manifestPath, type BackupTarget } from './layout.js';
import { withTargetLock, type HeldLock, type LockOptions } from './lock.js';
import { listBackups } from './manifest.js';

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
  const path = manifestPath(target, name);
  return withTargetLock(target, `delete backup ${name}`, { ...options.lock, node: options.node }, async (lock) => {
    try {
      await unlink(path);
      await syncDir(backupsDir(target));
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
      if (!options.missingOk) throw new LatchError(`backup ${name} does not exist in ${target.path} (latch backup list shows the backups)`);
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
  const backups = await listBackups(target);
  const damaged = backups.filter((b) => b.error !== undefined);
  if (damaged.length > 0) {
    throw new LatchError(
      `not collecting garbage: the manifest of ${damaged.map((b) => b.name).join(', ')} cannot be read, so which chunks it ` +
        `needs is unknown (${damaged[0]?.error}). Delete that backup (latch backup delete) and run this again`,
    );
  }
  const needed = new Set<string>();
  for (const b of backups) for (const hash of b.manifest?.chunks ?? []) if (hash !== null) needed.add(hash);

  const report: GcReport = { removedChunks: 0, freedBytes: 0, keptChunks: 0, removedTempFiles: 0 };
  await tightenTarget(target);
  report.removedTempFiles += await removeTempFiles(backupsDir(target));
  await lock.check();
  for (const shard of await readdirOrEmpty(chunksDir(target))) {
    const dir = join(chunksDir(target), shard);
    let removedHere = 0;
    for (const file of await readdirOrEmpty(dir)) {
      if (leftoverOf(file) !== undefined) continue;
      if (!isChunkHash(file) || needed.has(file)) {
        report.keptChunks++;
        continue;
      }
      const path = join(dir, file);
      const size = (await stat(path).catch(() => undefined))?.size ?? 0;
      await unlink(path).catch(() => undefined);
      report.removedChunks++;
      report.freedBytes += size;
      removedHere++;
    }
    report.removedTempFiles += await removeTempFiles(dir);
    if (removedHere > 0) await syncDir(dir);
  }
  return report;
}

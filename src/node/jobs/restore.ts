// The restore job (`latch volume restore NEW --from-backup B`, docs/jobs.md, "Restore"): fills the new volume's device
// with backup B from the configured backup target. The ticket (restore, 2000, never preempted) keeps every workload
// away from the volume until the job is done; a failed restore keeps its ticket, so a half-made volume is never used.
//
// Repeating after a kill starts over from the first chunk (restoreBackup zeroes holes and rewrites data, so whatever
// an interrupted run wrote is overwritten); the job is done only once the whole image hashed to the manifest's
// checksum. Only then is the filesystem found on the device recorded in the ledger: from then on kubelet's
// mountdevice mounts it and never formats the volume.
import { open } from 'node:fs/promises';
import { LatchError, errorMessage } from '../../errors.js';
import { readManifest } from '../../backup/manifest.js';
import { restoreBackup } from '../../backup/restore.js';
import { observed, triggerOf } from '../backup-outcome.js';
import type { JobHandler, JobOf, JobOutcome, JobRun } from './types.js';

export const restoreJob: JobHandler<'restore'> = {
  kind: 'restore',
  cleanUp: async (_job, run) => {
    if (run.doc.spec.shared) await (await import('./shared-files.js')).unmountJobMount(run.ctx, run.volume);
  },
  run: (job, run) =>
    observed(
      run.ctx.config,
      { kind: 'restore', ...triggerOf(run.ticket), volume: run.volume, name: job.backup },
      () => restore(job, run),
      (outcome) => ({ read: Number(outcome.result?.bytesWritten ?? 0), written: Number(outcome.result?.bytesWritten ?? 0) }),
      { signal: run.signal },
    ).catch((err: unknown) => {
      throw run.signal.aborted ? err : halfMade(run.volume, `latch volume restore ${run.volume} --from-backup ${job.backup}`, err);
    }),
};

/**
 * The error of a failed restore or clone, saying what it means for the volume: the runner keeps the ticket (nothing
 * may use the half-made volume), and what a person can do.
 */
export function halfMade(volume: string, repeat: string, err: unknown): LatchError {
  return new LatchError(
    `${errorMessage(err)}; volume ${volume} is incomplete and keeps its ticket so that nothing uses it: run \`${repeat}\` ` +
      `again, or delete it (latch volume delete ${volume})`,
    { cause: err },
  );
}

async function restore(job: JobOf<'restore'>, run: JobRun): Promise<JobOutcome> {
  const { ctx, volume, device, signal } = run;
  const target = ctx.config.backupTarget;
  if (!target) throw new LatchError(`node ${ctx.config.nodeName} has no backup target configured (backupTarget in ${ctx.config.source})`);
  // A new shared volume: the backup's tar archive becomes its files (node/jobs/shared-files.ts).
  if (run.doc.spec.shared) return (await import('./shared-files.js')).restoreShared(job, run, target);
  const manifest = await readManifest(target, job.backup);
  // restoreBackup refuses a device smaller than the backup, before it writes anything.
  // A volume nothing was ever written to reads zeros: only the data chunks are written (the storage stays thin). One
  // that an earlier attempt wrote to (killed, or failed and asked for again) gets its holes zeroed. The device's
  // dirty pages (an attempt killed on this node) are flushed first, so that the storage says all that was written.
  await flushDevice(device);
  const fresh = (await ctx.backend.isUnwritten?.(volume)) === true;
  const report = await restoreBackup({ target, name: job.backup, destination: device, signal, fresh });
  // The image matched the manifest's checksum (restoreBackup throws otherwise): what is on it now is the backup's.
  const filesystem = await ctx.system.probeFsType(device);
  return {
    message:
      `restored backup ${job.backup} (volume ${manifest.volume}) onto volume ${volume}: ${report.dataChunks} data chunk(s), ` +
      `${report.holeChunks} hole(s), checksum verified` +
      (filesystem === undefined ? ', no filesystem on it' : `, ${filesystem} filesystem`) +
      // Unauthenticated only when no backup key is configured: with one, restoreBackup refuses such a manifest.
      (report.authenticated ? '; manifest authenticated' : '; manifest UNAUTHENTICATED (no backup key configured)'),
    result: {
      backup: job.backup,
      sourceVolume: manifest.volume,
      sizeBytes: report.sizeBytes,
      dataChunks: report.dataChunks,
      holeChunks: report.holeChunks,
      bytesWritten: report.bytesWritten,
      authenticated: report.authenticated,
      encrypted: report.encrypted,
      // The checksum the restored image matched: v2 manifests carry the chunk list's, v1 the whole image's.
      ...(manifest.chunkListSha256 !== undefined ? { chunkListSha256: manifest.chunkListSha256 } : { imageSha256: manifest.imageSha256 }),
      ...(filesystem !== undefined && { filesystem }),
    },
    ...(filesystem !== undefined && { filesystem }),
  };
}

/** Writes the device's dirty pages to the storage (a restore or clone killed on this node may have left some). */
export async function flushDevice(device: string): Promise<void> {
  const handle = await open(device, 'r');
  try {
    await handle.sync();
  } finally {
    await handle.close();
  }
}

// The backup job: backup `job.backup` of the volume (or of its snapshot `job.fromSnapshot`) into the configured
// target, on the node that holds the volume. Idempotent by name: a backup exists only once its manifest is published
// (written last, atomically: src/backup/create.ts), so a complete manifest of that name for this volume is this job's,
// done by an earlier attempt; an interrupted attempt left no manifest, and is redone (its stored chunks are reused).
import { createBackup } from '../../backup/create.js';
import { describeTarget, type BackupTarget } from '../../backup/layout.js';
import { checkTarget } from '../../backup/store.js';
import { manifestExists, readManifest, type Manifest } from '../../backup/manifest.js';
import { JobInterruptedError, LatchError } from '../../errors.js';
import { isSatisfied } from '../../ledger/arbitrate.js';
import { formatSize } from '../../size.js';
import { diffingBackend, incrementalBackup } from '../backup.js';
import { observed, triggerOf } from '../backup-outcome.js';
import { openBackupSource, type BackupSource } from '../snapshot.js';
import { setUpForJobsOnly } from './snapshot.js';
import type { JobHandler, JobRun } from './types.js';

/** What a backup job's result carries (also a backup run beside a pod's record: cli/backup/create.ts). */
export function backupSummary(manifest: Manifest, consistency: string, note?: string): Record<string, unknown> {
  const s = manifest.stats;
  return {
    backup: manifest.name,
    sizeBytes: manifest.sizeBytes,
    dataChunks: s.dataChunks,
    newChunks: s.newChunks,
    newBytesStored: s.newBytesStored,
    presentChunks: s.presentChunks,
    consistency,
    ...(note !== undefined && { consistencyNote: note }),
    ...(manifest.parent !== undefined && { parent: manifest.parent }),
  };
}

/**
 * The device itself as the source, when the runner set it up for jobs only (setUpForJobsOnly): no pod's ticket on
 * this node and nothing mounts it, so nothing writes it while it is read, and no snapshot (a full copy on pools
 * without reflink) is needed. Before publishing, the ledger must still say so: the job's ticket still granted here,
 * still no pod's ticket on this node (a workload preempts a backup: the abort comes too, this is the last check).
 */
async function deviceSource(run: JobRun): Promise<BackupSource | undefined> {
  const { ctx, volume, device, ticket } = run;
  if (!setUpForJobsOnly(run) || (await ctx.system.isDeviceMounted(device))) return undefined;
  return {
    image: {
      path: device,
      description: `device ${device} of volume ${volume} (set up for this backup only)`,
      release: async () => undefined,
    },
    consistency: 'idle',
    beforePublish: async () => {
      const doc = await ctx.ledger.get(volume);
      if (!doc || !isSatisfied(doc, ticket.id) || !setUpForJobsOnly({ ctx, doc }) || (await ctx.system.isDeviceMounted(device))) {
        // Redone at once, not failed: the next attempt sees the pod's ticket and reads a frozen snapshot instead.
        throw new JobInterruptedError(
          `volume ${volume} was asked for by a pod while its device was being read; nothing was published, and the backup is redone`,
        );
      }
    },
    release: async () => undefined,
  };
}

/** The job itself; backupJob logs its outcome for the metrics. */
const backUp: JobHandler<'backup'> = {
  kind: 'backup',
  async run(job, run) {
    const { ctx, volume, signal } = run;
    const config = ctx.config;
    if (!config.backupTarget) throw new LatchError(`no backup target is configured on node ${config.nodeName} (config: backupTarget)`);
    const target: BackupTarget = config.backupTarget;
    await checkTarget(target);
    // A shared volume's files, archived from a CephFS snapshot (node/jobs/shared-files.ts).
    if (run.doc.spec.shared) return (await import('./shared-files.js')).backUpShared(job, run, target);
    if (await manifestExists(target, job.backup)) {
      // readManifest checks it whole (checksum): a damaged one is an error, never "done".
      const manifest = await readManifest(target, job.backup);
      if (manifest.volume !== volume)
        throw new LatchError(`a backup named ${job.backup} already exists in ${describeTarget(target)}, of volume ${manifest.volume}`);
      return {
        message: `backup ${job.backup} of volume ${volume} exists (made by an earlier attempt)`,
        result: backupSummary(manifest, 'done before'),
      };
    }
    signal.throwIfAborted();
    if (diffingBackend(ctx)) {
      // Ceph: read only what changed since the previous backup's snapshot, straight from the cluster (node/backup.ts).
      const idle = job.fromSnapshot === undefined && setUpForJobsOnly(run) && !(await ctx.system.isDeviceMounted(run.device));
      const made = await incrementalBackup(ctx, {
        target,
        volume,
        name: job.backup,
        node: config.nodeName,
        fsType: run.doc.status.filesystem,
        fromSnapshot: job.fromSnapshot,
        idle,
        signal,
      });
      const s = made.manifest.stats;
      const how =
        'parent' in made.base ? `the extents changed since backup ${made.base.parent}` : `every allocated extent (${made.base.none})`;
      return {
        message:
          `backup ${made.manifest.name} of volume ${volume} created (${made.consistency}${made.note ? `: ${made.note}` : ''}): ` +
          `${formatSize(made.manifest.sizeBytes)}, read ${formatSize(made.bytesRead)} from the cluster (${how}), ` +
          `${s.newChunks} new chunk(s) (${formatSize(s.newBytesStored)} written), ${s.presentChunks} already in the target`,
        result: {
          ...backupSummary(made.manifest, made.consistency, made.note),
          bytesRead: made.bytesRead,
          ...('parent' in made.base ? { incrementalFrom: made.base.parent } : { fullRead: made.base.none }),
        },
      };
    }
    const source = (job.fromSnapshot === undefined && (await deviceSource(run))) || (await openBackupSource(ctx, volume, job.fromSnapshot));
    let manifest: Manifest;
    try {
      manifest = await createBackup({
        target,
        source: source.image.path,
        volume,
        name: job.backup,
        sourceDescription: source.image.description,
        node: config.nodeName,
        // The filesystem it holds, so that a restore recreates the volume with it.
        fsType: run.doc.status.filesystem,
        // Preempted or stopped: stop between chunks, and never publish; without a manifest nothing looks complete.
        onChunk: () => signal.throwIfAborted(),
        beforePublish: async () => {
          signal.throwIfAborted();
          await source.beforePublish?.();
        },
      });
    } finally {
      await source.release();
    }
    const s = manifest.stats;
    return {
      message:
        `backup ${manifest.name} of volume ${volume} created (${source.consistency}${source.note ? `: ${source.note}` : ''}): ` +
        `${formatSize(manifest.sizeBytes)}, ` +
        `${s.newChunks} new chunk(s) (${formatSize(s.newBytesStored)} written), ${s.presentChunks} already in the target`,
      result: { ...backupSummary(manifest, source.consistency, source.note), bytesRead: manifest.stats.dataBytes },
    };
  },
};

export const backupJob: JobHandler<'backup'> = {
  kind: 'backup',
  cleanUp: async (_job, run) => {
    if (run.doc.spec.shared) await (await import('./shared-files.js')).unmountJobMount(run.ctx, run.volume);
  },
  run: (job, run) =>
    observed(
      run.ctx.config,
      { kind: 'backup', ...triggerOf(run.ticket), volume: run.volume, name: job.backup },
      () => backUp.run(job, run),
      (outcome) => ({ read: Number(outcome.result?.bytesRead ?? 0), written: Number(outcome.result?.newBytesStored ?? 0) }),
      { signal: run.signal },
    ),
};

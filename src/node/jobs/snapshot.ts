// The snapshot job: snapshot `job.snapshot` of the volume, taken on the node that holds it (node/snapshot.ts: frozen
// while mounted here). Idempotent by name: the backend makes a snapshot appear only complete (a temp file linked into
// place), so a snapshot of that name that exists is this job's, done by an earlier attempt, and is reported done.
// A shared volume's snapshot is a CephFS subvolume snapshot (`ceph fs subvolume snapshot create`), cut by the MDS
// whatever mounts the volume: no device, no freeze; the volumes module too shows a snapshot only once it is made.
import { hasSnapshots } from '../../backend/types.js';
import { NotSupportedError } from '../../errors.js';
import { formatSize } from '../../size.js';
import { snapshotVolume, type Consistency } from '../snapshot.js';
import type { JobHandler, JobOutcome, JobRun } from './types.js';
import { refuseBaseName } from '../backup.js';

/**
 * Whether the device is the runner's own, set up for jobs only: no pod's ticket on this node (the runner never
 * mounts it; kubelet mounts only for a workload ticket). Then nothing writes the volume, and what the device holds is
 * what the last holder left when it unmounted: a copy of it is as consistent as a copy of an idle volume.
 */
export function setUpForJobsOnly(run: Pick<JobRun, 'doc' | 'ctx'>): boolean {
  const node = run.ctx.config.nodeName;
  return Object.values(run.doc.spec.tickets).every(
    (t) => t.nodeID !== node || (t.job !== undefined && t.parameters.disableFrontend === true),
  );
}

export const snapshotJob: JobHandler<'snapshot'> = {
  kind: 'snapshot',
  async run(job, run) {
    const { ctx, volume, signal } = run;
    const backend = ctx.backend;
    if (!hasSnapshots(backend)) throw new NotSupportedError(`${backend.storage} cannot take snapshots`);
    refuseBaseName(job.snapshot);
    if (run.doc.spec.shared) return snapshotShared(job.snapshot, run);
    const existing = (await backend.listSnapshots(volume)).find((s) => s.name === job.snapshot);
    if (existing) {
      return {
        message: `snapshot ${job.snapshot} of volume ${volume} exists (made by an earlier attempt)`,
        result: { snapshot: existing.name, sharing: existing.sharing, sizeBytes: existing.sizeBytes, createdAt: existing.createdAt },
      };
    }
    signal.throwIfAborted();
    const { info, consistency, note } = await snapshotVolume(ctx, volume, job.snapshot);
    // Not mounted here and only jobs hold it: nothing wrote it since its last clean unmount (see setUpForJobsOnly).
    const how: Consistency = consistency === 'crash-consistent' && setUpForJobsOnly(run) ? 'idle' : consistency;
    return {
      message: `snapshot ${info.name} of volume ${volume} created (${info.sharing}, ${formatSize(info.sizeBytes)}, ${how}${note ? `: ${note}` : ''})`,
      result: {
        snapshot: info.name,
        sharing: info.sharing,
        sizeBytes: info.sizeBytes,
        createdAt: info.createdAt,
        consistency: how,
        ...(note !== undefined && { consistencyNote: note }),
      },
    };
  },
};

/** A shared volume's snapshot: the manager's `ceph fs subvolume snapshot create`, crash-consistent (nothing frozen). */
async function snapshotShared(name: string, { ctx, volume, signal }: JobRun): Promise<JobOutcome> {
  const shared = await (await import('../shared.js')).sharedVolumesOf(ctx);
  const existing = (await shared.listSnapshots(volume)).find((s) => s.name === name);
  const consistency = 'crash-consistent';
  const note = 'a CephFS snapshot, cut by the MDS while the clients of the volume may write (nothing is frozen)';
  if (existing) {
    return {
      message: `snapshot ${name} of shared volume ${volume} exists (made by an earlier attempt)`,
      result: { snapshot: name, sharing: existing.sharing, sizeBytes: existing.sizeBytes, createdAt: existing.createdAt, consistency },
    };
  }
  signal.throwIfAborted();
  const info = await shared.createSnapshot(volume, name);
  return {
    message: `snapshot ${name} of shared volume ${volume} created (native, ${formatSize(info.sizeBytes)}, ${consistency}: ${note})`,
    result: {
      snapshot: name,
      sharing: info.sharing,
      sizeBytes: info.sizeBytes,
      createdAt: info.createdAt,
      consistency,
      consistencyNote: note,
    },
  };
}

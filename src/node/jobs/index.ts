// The node agent's job handlers by kind (docs/jobs.md), each module loaded only when a job of its kind runs.
import type { JobHandler, JobKind, JobOf } from './types.js';

type Loaders = { [K in JobKind]: () => Promise<JobHandler<K>> };

const JOB_HANDLERS: Loaders = {
  snapshot: async () => (await import('./snapshot.js')).snapshotJob,
  backup: async () => (await import('./backup.js')).backupJob,
  restore: async () => (await import('./restore.js')).restoreJob,
  clone: async () => (await import('./clone.js')).cloneJob,
  attach: async () => (await import('./attach.js')).attachJob,
};

/** The handler of a job, typed for its spec (the table guarantees the kinds match). */
export async function handlerOf<K extends JobKind>(job: JobOf<K>): Promise<JobHandler<K>> {
  return (await (JOB_HANDLERS[job.kind] as () => Promise<JobHandler>)()) as unknown as JobHandler<K>;
}

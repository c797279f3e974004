// A job a command runs itself, beside a pod, without a ticket (docs/jobs.md, "Run beside a pod"): `latch backup
// create` on the node that holds the volume. Its outcome goes into the volume's status.jobs as a finished ticket's
// does, under the ID its ticket would have had, so that `latch backup list` and anything else reading the history
// sees a failed one too (a failed backup has no manifest).
import type { Context } from '../context.js';
import { errorMessage } from '../errors.js';
import { jobTicketId } from '../ledger/ids.js';
import type { FinishedJob, JobStatus } from '../ledger/types.js';
import { writeLog } from '../log.js';

/** How a direct run ended. */
export interface DirectOutcome {
  state: 'succeeded' | 'failed';
  message: string;
  startedAt: string;
  finishedAt: string;
  result?: Record<string, unknown>;
}

/** The status.jobs entry of a backup run beside a pod on `node`: one attempt, by that node, no ticket. */
export function directBackupRecord(volume: string, backup: string, node: string, outcome: DirectOutcome): FinishedJob & { direct: true } {
  const status: JobStatus = {
    state: outcome.state,
    node,
    startedAt: outcome.startedAt,
    finishedAt: outcome.finishedAt,
    attempts: 1,
    message: outcome.message,
    ...(outcome.result !== undefined && { result: outcome.result }),
  };
  return { ticket: jobTicketId('backup', volume, backup), type: 'backup', node, job: { kind: 'backup', backup }, status, direct: true };
}

/**
 * Records a backup run beside a pod in the ledger, after its outcome is known. A record that cannot be written fails
 * nothing (the backup's own outcome stands): it is logged, and returned as the reason for the caller to say.
 */
export async function recordDirectBackup(
  ctx: Context,
  volume: string,
  backup: string,
  outcome: Omit<DirectOutcome, 'finishedAt'>,
): Promise<string | undefined> {
  const record = directBackupRecord(volume, backup, ctx.config.nodeName, { ...outcome, finishedAt: ctx.ledger.now() });
  try {
    await ctx.ledger.recordDirectJob(volume, record);
    return undefined;
  } catch (err) {
    const reason = errorMessage(err);
    writeLog(ctx.config, { volume, backup, outcome: outcome.state, error: `its outcome could not be recorded in the ledger: ${reason}` });
    return reason;
  }
}

// Every backup and restore, manual or recurring, leaves one line in the log with its outcome, duration and bytes
// read and written (`backupOutcome`): the agent's metrics are read from the log (agent/call-log.ts), so a
// backup done by a command beside a pod counts as much as one the agent did. Only bounded values go in labels: the
// kind, the trigger, the outcome, and for a recurring job its name and the volume (jobs times volumes it selects).
import type { Config } from '../config.js';
import { JobInterruptedError } from '../errors.js';
import { writeLog } from '../log.js';
import type { Ticket } from '../ledger/types.js';

export interface BackupOutcome {
  kind: 'backup' | 'restore';
  /** recurring: asked for by a recurring job of the configuration (`recurring` names it); manual: by a person. */
  trigger: 'manual' | 'recurring';
  recurring?: string;
  volume: string;
  name: string;
  /** interrupted: preempted or stopped, redone later (not a failure). */
  outcome: 'succeeded' | 'failed' | 'interrupted';
  durationMs: number;
  /** Bytes read from the volume's storage (a backup) or from the target (a restore). */
  bytesRead: number;
  /** Bytes written to the target (a backup) or to the volume (a restore). */
  bytesWritten: number;
  finishedAt: string;
}

const RECURRING_OWNER = /^recurring job ([a-z0-9-]{1,63})$/;

/** Who asked for a job: the recurring job named in its ticket's owner, or a person. */
export function triggerOf(ticket: Pick<Ticket, 'owner'> | undefined): Pick<BackupOutcome, 'trigger' | 'recurring'> {
  const recurring = ticket?.owner === undefined ? undefined : RECURRING_OWNER.exec(ticket.owner)?.[1];
  return recurring === undefined ? { trigger: 'manual' } : { trigger: 'recurring', recurring };
}

/**
 * Runs a backup or restore and logs its outcome. `bytes` says what a success read and wrote; a failure counts what
 * `partial` says was done by then (0 when it cannot tell).
 */
export async function observed<T>(
  config: Pick<Config, 'logFile' | 'logMaxBytes'>,
  what: Pick<BackupOutcome, 'kind' | 'trigger' | 'recurring' | 'volume' | 'name'>,
  work: () => Promise<T>,
  bytes: (value: T) => { read: number; written: number },
  options: { signal?: AbortSignal | undefined; partial?: () => { read: number; written: number } } = {},
): Promise<T> {
  const started = Date.now();
  const line = (outcome: BackupOutcome['outcome'], counted: { read: number; written: number }) => {
    const entry: BackupOutcome = {
      ...what,
      outcome,
      durationMs: Date.now() - started,
      bytesRead: counted.read,
      bytesWritten: counted.written,
      finishedAt: new Date().toISOString(),
    };
    writeLog(config, { volume: what.volume, backupOutcome: entry });
  };
  try {
    const value = await work();
    line('succeeded', bytes(value));
    return value;
  } catch (err) {
    const interrupted = options.signal?.aborted === true || err instanceof JobInterruptedError;
    line(interrupted ? 'interrupted' : 'failed', options.partial?.() ?? { read: 0, written: 0 });
    throw err;
  }
}

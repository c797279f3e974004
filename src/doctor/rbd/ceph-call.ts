// How doctor asks the cluster something as the node's identity: every call bounded, keys redacted from failures, and
// the errors Ceph's tools answer with.
import { errorMessage } from '../../errors.js';
import { cephClientArgs, redactKeys, type CephIdentity } from '../../sys/rbd.js';
import { CommandError, run, type RunResult } from '../../sys/run.js';

// Every Ceph call here is bounded twice: by Ceph's own timeouts (so the tool says what it waited for) and by run()'s
// deadline a little later (so not even a client stuck elsewhere can hang doctor).
export const CEPH_TIMEOUT_S = 10;
export const RUN_DEADLINE_MS = (CEPH_TIMEOUT_S + 5) * 1000;
const CLIENT_TIMEOUTS = [
  '--client-mount-timeout',
  String(CEPH_TIMEOUT_S),
  '--rados-mon-op-timeout',
  String(CEPH_TIMEOUT_S),
  '--rados-osd-op-timeout',
  String(CEPH_TIMEOUT_S),
];
// Ceph's errno values as its tools' exit codes and messages.
export const ENOENT = 2;
const EACCES = 13;

interface Outcome {
  result?: RunResult;
  /** The failure, with keys redacted, when the command failed or ran out of time. */
  failure?: { message: string; exitCode: number | undefined; timedOut: boolean };
}

export async function cephCall(
  command: 'rbd' | 'ceph' | 'rados',
  identity: CephIdentity,
  args: string[],
  okExitCodes: number[] = [],
): Promise<Outcome> {
  const timeouts = command === 'ceph' ? ['--connect-timeout', String(CEPH_TIMEOUT_S), ...CLIENT_TIMEOUTS] : CLIENT_TIMEOUTS;
  try {
    return { result: await run(command, [...cephClientArgs(identity), ...timeouts, ...args], { timeoutMs: RUN_DEADLINE_MS, okExitCodes }) };
  } catch (err) {
    const cmdErr = err instanceof CommandError ? err : undefined;
    const detail = cmdErr?.stderrTail.trim().split('\n').at(-1) || errorMessage(err);
    return {
      failure: { message: redactKeys(detail), exitCode: cmdErr?.exitCode, timedOut: cmdErr?.timedOut ?? false },
    };
  }
}

export function isPermissionError(text: string, exitCode: number | undefined): boolean {
  return exitCode === EACCES || /\((1|13)\) (Operation not permitted|Permission denied)|EACCES|access denied/i.test(text);
}

export function parseJsonObject(text: string | undefined): Record<string, unknown> | undefined {
  try {
    const value = JSON.parse(text ?? '') as unknown;
    return value !== null && typeof value === 'object' && !Array.isArray(value) ? (value as Record<string, unknown>) : undefined;
  } catch {
    return undefined;
  }
}

export function parseJsonArray(text: string | undefined): unknown[] | undefined {
  try {
    const value = JSON.parse(text ?? '') as unknown;
    return Array.isArray(value) ? value : undefined;
  } catch {
    return undefined;
  }
}

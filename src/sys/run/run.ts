// run(): one child with a deadline, its output captured, its failure a CommandError.
import { LatchError, errorMessage } from '../../errors.js';
import { CommandError, formatDuration, lastLineSuffix, outputTail, showCommand } from './command-error.js';
import { MAX_BUFFER } from './output-files.js';
import { KILL_GRACE_MS, running, signalGroup, untilGroupGone } from './process-groups.js';
import { locateCommand } from './search-path.js';
import { spawnCollecting } from './spawn.js';

export interface RunOptions {
  /** Deadline for the child; default DEFAULT_COMMAND_TIMEOUT_MS (120 s). */
  timeoutMs?: number;
  /** Written to the child's stdin (otherwise stdin is /dev/null). Never put secrets on the command line; here is fine. */
  input?: string;
  /**
   * The child's stdin instead: this descriptor, which stays this process's (flock(1) locks the open file it is given,
   * which the lock's holder keeps: sys/lock.ts).
   */
  stdinFd?: number;
  /** Exit codes besides 0 that are not failures (e.g. blkid's 2 = "nothing found"). */
  okExitCodes?: number[];
  /** The child's environment instead of this process's; LC_ALL and PATH are set over it either way. */
  env?: NodeJS.ProcessEnv;
}

/** The deadline a caller passes on to the children it runs (the configuration's commandTimeout, from its context). */
export type ChildDeadline = Pick<RunOptions, 'timeoutMs'>;

export interface RunResult {
  stdout: string;
  stderr: string;
  exitCode: number;
  durationMs: number;
}

/**
 * The deadline of a child whose caller names none: the configuration's default commandTimeout. What a driver call
 * runs gets the configured one from its context (the host system, the backend and the storage's identity carry it).
 */
export const DEFAULT_COMMAND_TIMEOUT_MS = 120_000;

/**
 * Whole milliseconds since `started` (process.hrtime.bigint()). Not performance.now(): its first use loads Node's
 * perf_hooks, about 1 ms of every call that runs a child.
 */
export function elapsedMs(started: bigint): number {
  return Math.round(Number(process.hrtime.bigint() - started) / 1e6);
}

/**
 * Runs `command args...` and returns its captured output. Throws CommandError when the exit code is neither 0 nor
 * in okExitCodes, when a signal killed it, when it could not be started, or when the deadline passed (the whole
 * process group then gets SIGTERM, and SIGKILL 2 s later; a child that has not exited 2 s after that is stuck in the
 * kernel and is no longer waited for).
 */
export async function run(command: string, args: string[], options: RunOptions = {}): Promise<RunResult> {
  checkArgv(command, args);
  const timeoutMs = options.timeoutMs ?? DEFAULT_COMMAND_TIMEOUT_MS;
  if (!Number.isFinite(timeoutMs) || timeoutMs <= 0) {
    throw new LatchError(`timeout for ${command} must be a positive number of milliseconds, got ${timeoutMs}`);
  }
  const okExitCodes = options.okExitCodes ?? [];

  const { executable, searchPath } = locateCommand(command, args);
  const path = searchPath.join(':');
  const started = process.hrtime.bigint();
  const child = spawnCollecting(executable, args, {
    input: options.input,
    stdinFd: options.stdinFd,
    env: { ...(options.env ?? process.env), LC_ALL: 'C', PATH: path },
  });

  const pgid = child.pid;
  let timedOut = false;
  let deadline: NodeJS.Timeout | undefined;
  let forceKill: NodeJS.Timeout | undefined;
  let abandon: NodeJS.Timeout | undefined;
  let forceKilled: Promise<void> | undefined;
  const unkillable = new Promise<undefined>((resolve) => {
    if (pgid === undefined) return;
    running.add(pgid);
    deadline = setTimeout(() => {
      timedOut = true;
      signalGroup(pgid, 'SIGTERM');
      forceKilled = new Promise<void>((resolveKilled) => {
        forceKill = setTimeout(() => {
          signalGroup(pgid, 'SIGKILL');
          resolveKilled();
          abandon = setTimeout(() => resolve(undefined), KILL_GRACE_MS);
        }, KILL_GRACE_MS);
      });
    }, timeoutMs);
  });

  let result;
  try {
    // A child in uninterruptible sleep (D state: a umount whose writeback waits on a stalled cluster, a stat on a
    // FUSE mount whose daemon stopped answering) does not die of SIGKILL until the kernel lets it go, perhaps never.
    // The call must still end: the child is left to the kernel (it dies, by PR_SET_PDEATHSIG at the latest, once
    // it leaves that wait) and the call fails as timed out.
    result = await Promise.race([child.done, unkillable]);
    // After a timeout the leader may be gone while other members of its group ignore SIGTERM and hold no pipe:
    // they still get their SIGKILL at the end of the grace period. A group with a live member keeps its id, so
    // this cannot hit a stranger's group.
    if (result !== undefined && timedOut && pgid !== undefined && forceKilled !== undefined) await untilGroupGone(pgid, forceKilled);
  } finally {
    clearTimeout(deadline);
    clearTimeout(forceKill);
    clearTimeout(abandon);
    if (pgid !== undefined) running.delete(pgid);
  }

  const durationMs = elapsedMs(started);
  const shown = showCommand(command, args);
  if (result === undefined) {
    throw new CommandError(
      `${shown} timed out after ${formatDuration(timeoutMs)} and did not exit when killed (it waits in the kernel, on I/O ` +
        `that does not complete); it was left to end by itself`,
      { command, args: [...args], exitCode: undefined, signal: 'SIGKILL', stderrTail: '', timedOut: true, durationMs },
    );
  }
  const { stdout, stderr, exitCode } = result;
  const tail = outputTail(stderr || stdout);
  const details = { command, args: [...args], exitCode, signal: result.signal, stderrTail: tail, timedOut, durationMs };

  if (timedOut) {
    throw new CommandError(`${shown} timed out after ${formatDuration(timeoutMs)}`, details, { cause: result });
  }
  if (result.readError !== undefined) {
    throw new CommandError(`${shown} ran, but its output could not be read: ${errorMessage(result.readError)}`, details, {
      cause: result.readError,
    });
  }
  if (result.isMaxBuffer) {
    throw new CommandError(`${shown} produced more than ${MAX_BUFFER} bytes of output`, details, { cause: result });
  }
  if (exitCode === undefined) {
    if (result.signal) {
      throw new CommandError(`${shown} was killed by ${result.signal}${lastLineSuffix(tail)}`, details, { cause: result });
    }
    const code = result.errorCode;
    const why = code === 'ENOENT' ? `command not found (PATH=${path})` : (code ?? 'unknown error');
    throw new CommandError(`${shown} could not be started: ${why}`, details, { cause: result });
  }
  if (exitCode !== 0 && !okExitCodes.includes(exitCode)) {
    throw new CommandError(`${shown} failed (exit ${exitCode})${lastLineSuffix(tail)}`, details, { cause: result });
  }
  return { stdout, stderr, exitCode, durationMs };
}

export function checkArgv(command: string, args: string[]): void {
  if (typeof command !== 'string' || command.length === 0 || command.includes('\0')) {
    throw new LatchError('refusing to run an empty or malformed command name');
  }
  if (!Array.isArray(args)) throw new LatchError(`arguments for ${command} must be an array`);
  for (const arg of args) {
    if (typeof arg !== 'string' || arg.includes('\0')) {
      throw new LatchError(`refusing to run ${command}: an argument is not a string or contains a NUL byte`);
    }
  }
}

// runStreaming(): a child whose stdout is read as it comes, for output too large to hold (an rbd export-diff).
import { spawn } from 'node:child_process';
import { LatchError } from '../../errors.js';
import { CommandError, formatDuration, lastLineSuffix, outputTail, showCommand } from './command-error.js';
import { running, signalGroup } from './process-groups.js';
import { checkArgv, elapsedMs, type RunResult } from './run.js';
import { locateCommand, setprivPath } from './search-path.js';

/** A child whose stdout is read as it comes (runStreaming). */
export interface StreamingChild {
  /** The child's stdout; reading it slowly slows the child down (the pipe's back-pressure), nothing piles up here. */
  stdout: NodeJS.ReadableStream & AsyncIterable<Buffer>;
  /** Settles once the child is gone: resolves on exit 0, rejects with a CommandError otherwise (a deadline, a kill). */
  done: Promise<RunResult>;
  /** Kills the child's process group (a reader that stops early). */
  kill(): void;
}

/**
 * Runs `command args...` with its stdout as a stream, for output too large to hold (an rbd export-diff of a volume):
 * the same rules as run() (no shell, its own process group, killed with this process through setpriv --pdeathsig, a
 * deadline after which the group gets SIGKILL), stderr kept to its last lines. Through node:child_process: the helper
 * writes children's output to files, and a stream must come from a pipe.
 */
export function runStreaming(command: string, args: string[], options: { timeoutMs: number }): StreamingChild {
  checkArgv(command, args);
  const { timeoutMs } = options;
  if (!Number.isFinite(timeoutMs) || timeoutMs <= 0) {
    throw new LatchError(`timeout for ${command} must be a positive number of milliseconds, got ${timeoutMs}`);
  }
  const { executable, searchPath } = locateCommand(command, args);
  const shown = showCommand(command, args);
  const details = { command, args: [...args], exitCode: undefined, stderrTail: '', timedOut: false, durationMs: 0 };
  const setpriv = setprivPath();
  const [file, argv] = setpriv ? [setpriv, ['--pdeathsig', 'SIGKILL', '--', executable, ...args]] : [executable, args];
  const started = process.hrtime.bigint();
  const child = spawn(file, argv, {
    detached: true,
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, LC_ALL: 'C', PATH: searchPath.join(':') },
  });
  const pgid = child.pid;
  if (pgid !== undefined) running.add(pgid);
  let stderr = '';
  child.stderr?.setEncoding('utf8');
  child.stderr?.on('data', (text: string) => {
    stderr = (stderr + text).slice(-4096);
  });
  let timedOut = false;
  let settled = false;
  // A reader that stopped reading leaves the pipe full: its end is dropped too, or the child's 'close' never comes.
  // Once the child is gone its group ID may be another's: a stop after that signals nothing.
  const stop = () => {
    if (pgid !== undefined && !settled) signalGroup(pgid, 'SIGKILL');
    child.stdout?.destroy();
  };
  const deadline = setTimeout(() => {
    timedOut = true;
    stop();
  }, timeoutMs);
  const done = new Promise<RunResult>((resolve, reject) => {
    const settle = (code: number | null, signal: NodeJS.Signals | null, error?: NodeJS.ErrnoException) => {
      settled = true;
      clearTimeout(deadline);
      if (pgid !== undefined) running.delete(pgid);
      const durationMs = elapsedMs(started);
      const tail = outputTail(stderr);
      const info = { ...details, exitCode: code ?? undefined, signal: signal ?? undefined, stderrTail: tail, timedOut, durationMs };
      if (timedOut) reject(new CommandError(`${shown} timed out after ${formatDuration(timeoutMs)}`, info));
      else if (error) reject(new CommandError(`${shown} could not be started: ${error.code ?? error.message}`, info));
      else if (code === null) reject(new CommandError(`${shown} was killed by ${signal ?? 'a signal'}${lastLineSuffix(tail)}`, info));
      else if (code !== 0) reject(new CommandError(`${shown} failed (exit ${code})${lastLineSuffix(tail)}`, info));
      else resolve({ stdout: '', stderr, exitCode: 0, durationMs });
    };
    child.once('error', (error: NodeJS.ErrnoException) => {
      if (child.pid === undefined) settle(null, null, error);
    });
    child.once('close', (code, signal) => settle(code, signal));
  });
  // Awaited by the caller in its turn; until then a failure must not count as an unhandled rejection.
  done.catch(() => undefined);
  return {
    stdout: child.stdout as NodeJS.ReadableStream & AsyncIterable<Buffer>,
    done,
    kill: stop,
  };
}

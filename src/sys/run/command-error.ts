// A child that failed, and how a command and its output are shown in messages (never more than a few lines of it).
import { LatchError } from '../../errors.js';

/** A child process failed: non-zero exit (not in okExitCodes), killed by a signal, past its deadline, or not startable. */
export class CommandError extends LatchError {
  override name = 'CommandError';
  readonly command: string;
  readonly args: string[];
  /** undefined when the child was killed by a signal or could not be started. */
  readonly exitCode: number | undefined;
  readonly signal: string | undefined;
  /** The last few lines of stderr (or of stdout when stderr was empty). */
  readonly stderrTail: string;
  readonly timedOut: boolean;
  readonly durationMs: number;

  constructor(
    message: string,
    details: {
      command: string;
      args: string[];
      exitCode: number | undefined;
      signal?: string | undefined;
      stderrTail: string;
      timedOut: boolean;
      durationMs: number;
    },
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.command = details.command;
    this.args = details.args;
    this.exitCode = details.exitCode;
    this.signal = details.signal;
    this.stderrTail = details.stderrTail;
    this.timedOut = details.timedOut;
    this.durationMs = details.durationMs;
  }
}

export function showCommand(command: string, args: string[]): string {
  const text = [command, ...args].map((a) => (/^[\w@%+=:,./-]+$/.test(a) ? a : JSON.stringify(a))).join(' ');
  return text.length > 200 ? `${text.slice(0, 197)}...` : text;
}

export function outputTail(text: string): string {
  const lines = text
    .split('\n')
    .map((l) => l.trimEnd())
    .filter((l) => l.length > 0);
  const tail = lines.slice(-5).join('\n');
  return tail.length > 1000 ? tail.slice(-1000) : tail;
}

export function lastLineSuffix(tail: string): string {
  const last = tail.split('\n').pop() ?? '';
  if (!last) return '';
  return `: ${last.length > 300 ? `${last.slice(0, 297)}...` : last}`;
}

export function formatDuration(ms: number): string {
  if (ms < 1000) return `${ms} ms`;
  const s = ms / 1000;
  return `${Number.isInteger(s) ? s : s.toFixed(1)} s`;
}

// The call log: one JSON line per driver call in config.logFile, rotated by size.
// Logging must never break a call, never reach stdout/stderr, and never carry a secret.
import { closeSync, mkdirSync, openSync, renameSync, statSync, writeSync } from 'node:fs';
import { dirname } from 'node:path';
import { K8S_OPTION_PREFIX, LATCH_OPTIONS, SECRET_OPTION_PREFIX } from './names.js';
import { isoTime } from './time.js';

const KEEP_ROTATED = 3;
const MAX_FIELD = 2000;

/** What a call learned (volume, node, device, ...): the fields of its log line. */
export type CallLog = Record<string, unknown>;

export interface LogTarget {
  logFile: string;
  logMaxBytes: number;
}

/**
 * Appends one entry. `createDir` is false for init, which must have no side effects beyond the line itself.
 * Returns false when the line could not be written (the caller carries on regardless).
 */
export function writeLog(target: LogTarget, entry: Record<string, unknown>, createDir = true): boolean {
  try {
    const line = `${JSON.stringify({ time: isoTime(new Date()), ...entry })}\n`;
    rotateIfLarge(target);
    try {
      append(target.logFile, line);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT' || !createDir) return false;
      mkdirSync(dirname(target.logFile), { recursive: true, mode: 0o700 });
      append(target.logFile, line);
    }
    return true;
  } catch {
    return false;
  }
}

/**
 * Appends `line` with one write(2) on a descriptor opened for appending, so that the lines of concurrent calls never
 * interleave: what appendFileSync does, but with the calls a driver call has compiled anyway (writeSync for its reply,
 * openSync and closeSync for its configuration). appendFileSync, and the writeFileSync it runs, are two more of Node's
 * functions to compile in every call.
 */
function append(file: string, line: string): void {
  const fd = openSync(file, 'a', 0o600);
  try {
    writeSync(fd, line);
  } finally {
    closeSync(fd);
  }
}

function rotateIfLarge(target: LogTarget): void {
  let size: number;
  try {
    size = statSync(target.logFile).size;
  } catch {
    return;
  }
  if (size < target.logMaxBytes) return;
  // Two processes may rotate at once; a lost rename only loses an old rotated file, never the current line.
  for (let i = KEEP_ROTATED - 1; i >= 1; i--) {
    try {
      renameSync(`${target.logFile}.${i}`, `${target.logFile}.${i + 1}`);
    } catch {
      /* missing: nothing to shift */
    }
  }
  try {
    renameSync(target.logFile, `${target.logFile}.1`);
  } catch {
    /* another process rotated it first */
  }
}

/** Whether an option's value may be logged: latch's own options and the kubernetes.io/* keys other than secrets. */
function isLoggableOption(key: string): boolean {
  if (key.startsWith(K8S_OPTION_PREFIX)) return !key.startsWith(SECRET_OPTION_PREFIX);
  return (LATCH_OPTIONS as readonly string[]).includes(key);
}

/**
 * The call's arguments as they may be logged: JSON arguments with long values cut, and the value of every key that is
 * neither latch's own nor a non-secret kubernetes.io/* key replaced: secrets, and the options of other tools
 * (a free-form dictionary that may hold a password), whose names alone are logged.
 */
export function redactArgs(args: readonly string[]): unknown[] {
  return args.map((arg) => {
    const trimmed = arg.trimStart();
    if (!trimmed.startsWith('{')) return clip(arg);
    try {
      const parsed = JSON.parse(arg) as unknown;
      if (typeof parsed !== 'object' || parsed === null) return clip(arg);
      const out: Record<string, unknown> = {};
      for (const [k, v] of Object.entries(parsed)) {
        out[clip(k)] = !isLoggableOption(k) ? '<redacted>' : typeof v === 'string' ? clip(v) : v;
      }
      return out;
    } catch {
      // Unparsable JSON may still hold a secret: log only its size.
      return `<unparsable JSON, ${arg.length} bytes>`;
    }
  });
}

function clip(text: string): string {
  return text.length > MAX_FIELD ? `${text.slice(0, MAX_FIELD)}...(${text.length} bytes)` : text;
}

// The driver's own record of its calls, read back for metrics: every driver call already appends one JSON line to
// the log file (src/log.ts), so counting calls, their latency and the automatic actions from those lines costs a
// call nothing more. `latch metrics` reads the retained files whole; `latch agent` follows the current one, also
// across rotation (the file it read is renamed to .1 and a new one begins).
import { open, stat } from 'node:fs/promises';

/** How many rotated files log.ts keeps (latch.log.1 .. .3). */
const KEEP_ROTATED = 3;
const CHUNK = 1 << 20;

/** What metrics take from one log line: a driver call (op, status, durationMs) and/or automatic actions. */
export interface CallLogLine {
  op?: string;
  status?: string;
  durationMs?: number;
  agent?: string;
  automatic?: Array<{ kind?: string }>;
  /** A backup's or restore's outcome (node/backup-outcome.ts). */
  backupOutcome?: {
    kind?: unknown;
    trigger?: unknown;
    recurring?: unknown;
    volume?: unknown;
    outcome?: unknown;
    durationMs?: unknown;
    bytesRead?: unknown;
    bytesWritten?: unknown;
    finishedAt?: unknown;
  };
}

/** Every line of the retained log files, oldest first (without the current file with `skipCurrent`: a LogFollower reads it). */
export async function readWholeLog(
  logFile: string,
  onLine: (line: CallLogLine) => void,
  options: { skipCurrent?: boolean } = {},
): Promise<void> {
  for (let i = KEEP_ROTATED; i >= 1; i--) await readFrom(`${logFile}.${i}`, 0, onLine);
  if (!options.skipCurrent) await readFrom(logFile, 0, onLine);
}

/**
 * Follows the log file: each `readNew` hands over the lines appended since the last one. Calls run one after another
 * (two scrapes at once must not both read from the same offset and count the same lines twice).
 */
export class LogFollower {
  private ino: number | undefined;
  private offset = 0;
  /** The end of the chain of reads: each starts where the one before left the offset. */
  private reading: Promise<void> = Promise.resolve();

  constructor(private readonly logFile: string) {}

  readNew(onLine: (line: CallLogLine) => void): Promise<void> {
    const next = this.reading.then(() => this.readNewNow(onLine));
    // A failed read leaves the offset where it was; the next one goes on from there.
    this.reading = next.catch(() => undefined);
    return next;
  }

  private async readNewNow(onLine: (line: CallLogLine) => void): Promise<void> {
    const now = await stat(this.logFile).catch(() => undefined);
    if (this.ino !== undefined && now?.ino !== this.ino) {
      // Rotated: finish the file we were reading, wherever rotation moved it.
      for (let i = 1; i <= KEEP_ROTATED; i++) {
        const rotated = await stat(`${this.logFile}.${i}`).catch(() => undefined);
        if (rotated?.ino === this.ino) {
          await readFrom(`${this.logFile}.${i}`, this.offset, onLine);
          break;
        }
      }
      this.offset = 0;
    }
    this.ino = now?.ino;
    if (!now) return;
    if (now.size < this.offset) this.offset = 0; // truncated by someone
    this.offset = await readFrom(this.logFile, this.offset, onLine);
  }
}

/** Reads whole lines from `offset`; returns the offset after the last complete line (a half-written one waits). */
async function readFrom(path: string, offset: number, onLine: (line: CallLogLine) => void): Promise<number> {
  let handle;
  try {
    handle = await open(path, 'r');
  } catch {
    return offset;
  }
  try {
    let position = offset;
    let pending = Buffer.alloc(0);
    for (;;) {
      const buffer = Buffer.alloc(CHUNK);
      const { bytesRead } = await handle.read(buffer, 0, CHUNK, position);
      if (bytesRead === 0) break;
      position += bytesRead;
      // Split at newline bytes: 0x0a never occurs inside a multi-byte UTF-8 character.
      const data = Buffer.concat([pending, buffer.subarray(0, bytesRead)]);
      const end = data.lastIndexOf(0x0a);
      pending = end < 0 ? data : data.subarray(end + 1);
      if (end >= 0) for (const line of data.subarray(0, end).toString('utf8').split('\n')) parseLine(line, onLine);
    }
    return position - pending.length;
  } finally {
    await handle.close();
  }
}

function parseLine(line: string, onLine: (line: CallLogLine) => void): void {
  if (line.trim() === '') return;
  try {
    const parsed: unknown = JSON.parse(line);
    if (typeof parsed === 'object' && parsed !== null) onLine(parsed);
  } catch {
    /* not one of ours: skipped */
  }
}

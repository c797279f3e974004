// A child's stdout and stderr go to two files without a name, read once it has exited (cheaper than pipes: spawn.ts).
import { closeSync, constants, fstatSync, openSync, readSync } from 'node:fs';

/** The most output a child may give: more is a failure, not a truncated answer. */
export const MAX_BUFFER = 16 * 1024 * 1024;

/** A child's output as collected. */
export interface Output {
  stdout: string;
  stderr: string;
  isMaxBuffer: boolean;
  /** Why its output files could not be read. */
  readError?: unknown;
}

/** Where a child's output files are made: a tmpfs that Linux hosts mount, so nothing of it is ever written to a disk. */
const OUTPUT_DIR = '/dev/shm';
/** open(2)'s O_TMPFILE (with O_DIRECTORY, as the kernel defines it), which node:fs does not name. */
const O_TMPFILE = 0o20000000 | constants.O_DIRECTORY;

/**
 * Two files for a child's stdout and stderr: readable and writable by root only, and without a name (O_TMPFILE), so
 * that nothing is left behind whatever happens to the call, and nobody else can open them. undefined where the
 * directory or the flag is not there (the caller uses pipes).
 */
export function outputFiles(): { out: number; err: number } | undefined {
  const make = (): number | undefined => {
    try {
      return unnamedFile();
    } catch {
      return undefined;
    }
  };
  const out = make();
  if (out === undefined) return undefined;
  const err = make();
  if (err === undefined) {
    closeSync(out);
    return undefined;
  }
  return { out, err };
}

/** A file in OUTPUT_DIR without a name, readable and writable by root only; throws where it cannot be made. */
export function unnamedFile(): number {
  return openSync(OUTPUT_DIR, constants.O_RDWR | O_TMPFILE, 0o600);
}

/**
 * What the child wrote to its output files, which are closed after. Over MAX_BUFFER, isMaxBuffer and nothing of it: a
 * child cannot be stopped at that size as with a pipe, its deadline bounds what it writes. A file that cannot be read
 * is readError: an output taken as empty could read as "nothing found".
 */
export function readFiles(files: { out: number; err: number }): Output {
  try {
    const stdout = readOutput(files.out);
    const stderr = readOutput(files.err);
    if (stdout === undefined || stderr === undefined) return { stdout: '', stderr: '', isMaxBuffer: true };
    return { stdout, stderr, isMaxBuffer: false };
  } catch (readError) {
    return { stdout: '', stderr: '', isMaxBuffer: false, readError };
  } finally {
    closeFiles(files);
  }
}

/** One output file from its start; undefined when it is over MAX_BUFFER. */
function readOutput(fd: number): string | undefined {
  const size = fstatSync(fd).size;
  if (size > MAX_BUFFER) return undefined;
  const buffer = Buffer.allocUnsafe(size);
  let read = 0;
  while (read < size) {
    const n = readSync(fd, buffer, read, size - read, read);
    if (n === 0) break;
    read += n;
  }
  return buffer.toString('utf8', 0, read);
}

export function closeFiles(files: { out: number; err: number }): void {
  closeSync(files.out);
  closeSync(files.err);
}

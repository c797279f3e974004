// Copying a file so that the copy costs space only for later changes: a reflink (FICLONE) where the filesystem can
// (xfs with reflink, btrfs), else a sparse copy (holes stay holes, data is copied: ext4). And how much of a file's
// space it shares with others, from its extents' flags (FIEMAP, through filefrag).
import { constants } from 'node:fs';
import { copyFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { tempPathFor } from '../atomic-file.js';
import { run, type ChildDeadline } from './run.js';

/** How a copy was made: 'reflink' shares every block with the source until either changes; 'copy' shares none. */
export type CloneMethod = 'reflink' | 'copy';

/** Errors with which the kernel says "this filesystem (or this pair of files) cannot be cloned". */
const CANNOT_CLONE = new Set(['EOPNOTSUPP', 'ENOTSUP', 'EXDEV', 'EINVAL', 'ENOSYS', 'ENOTTY']);

/** Copies `source` to `dest` (which must not exist) by reflink, else sparsely with cp. `copyTimeoutMs` bounds the cp. */
export async function cloneFile(source: string, dest: string, copyTimeoutMs: number): Promise<CloneMethod> {
  try {
    await copyFile(source, dest, constants.COPYFILE_EXCL | constants.COPYFILE_FICLONE_FORCE);
    return 'reflink';
  } catch (err) {
    if (!CANNOT_CLONE.has((err as NodeJS.ErrnoException).code ?? '')) throw err;
  }
  await run('cp', ['--sparse=always', '--no-dereference', '--', source, dest], { timeoutMs: copyTimeoutMs });
  return 'copy';
}

/** Whether files in `dir` can be reflinked (a clone of an empty temp file there, removed again). */
export async function canReflink(dir: string): Promise<boolean> {
  const source = tempPathFor(join(dir, '.reflink-probe'));
  const dest = tempPathFor(join(dir, '.reflink-probe-clone'));
  try {
    await writeFile(source, '', { flag: 'wx', mode: 0o600 });
    await copyFile(source, dest, constants.COPYFILE_EXCL | constants.COPYFILE_FICLONE_FORCE);
    return true;
  } catch (err) {
    if (CANNOT_CLONE.has((err as NodeJS.ErrnoException).code ?? '')) return false;
    throw err;
  } finally {
    await rm(source, { force: true });
    await rm(dest, { force: true });
  }
}

export interface ExtentUsage {
  /** Bytes in the file's extents. */
  allocated: number;
  /** Bytes in extents flagged shared (with a clone of it, or the file it was cloned from). */
  shared: number;
}

/** The file's allocated and shared bytes from `filefrag -v`; undefined when filefrag cannot tell. */
export async function extentUsage(path: string, timeout: ChildDeadline = {}): Promise<ExtentUsage | undefined> {
  let stdout: string;
  try {
    ({ stdout } = await run('filefrag', ['-v', '--', path], timeout));
  } catch {
    return undefined;
  }
  return parseFilefrag(stdout);
}

/** Parses `filefrag -v`: the block size from its header, and per extent its length and flags. */
export function parseFilefrag(text: string): ExtentUsage | undefined {
  const block = /\(\d+ blocks? of (\d+) bytes\)/.exec(text)?.[1];
  if (block === undefined) return undefined;
  const blockSize = Number(block);
  const usage: ExtentUsage = { allocated: 0, shared: 0 };
  for (const line of text.split('\n')) {
    const m = /^\s*\d+:\s+\d+\.\.\s*\d+:\s+\d+\.\.\s*\d+:\s+(\d+):(.*)$/.exec(line);
    if (!m?.[1]) continue;
    const bytes = Number(m[1]) * blockSize;
    usage.allocated += bytes;
    if (/\bshared\b/.test(m[2] ?? '')) usage.shared += bytes;
  }
  return usage;
}

// A shared volume's files as one image for the backup engine, and back (docs/operations.md, "Backups of shared
// volumes"). A backup reads a CephFS snapshot of the volume (immutable: nothing changes under the walk) and streams
// it as a POSIX tar (pax) archive, made by tar-stream, into the chunk engine as the backup's image; a restore streams
// the image back through tar-stream's parser and makes each entry in the new volume's (empty) root.
//
// The image's size must be known before its first chunk (the chunk engine's manifest says it), and a tar archive's is
// not until it is written: a first walk lists the entries and bounds the archive's size from above (headers, pax
// records and padding at their largest), and the archive is padded with zeros up to that bound (tar readers stop at
// the end-of-archive blocks; the zero chunks are holes, which cost nothing in the target). An archive that would
// outgrow its bound fails the backup; nothing is ever cut short.
//
// What an archive holds: directories, regular files (a file's other hard links as links to its first path), symbolic
// links, each with its owner, group, permission bits and modification time. Not kept: extended attributes (POSIX
// ACLs, file capabilities), holes inside files (read as zeros; the chunk engine stores zero chunks as holes, and the
// restore writes no all-zero block, so a sparse file comes back sparse in 64 KiB steps), and what is no file: device
// nodes, FIFOs and sockets are skipped by a backup (counted in its result).
//
// A restore treats the archive as hostile (the target may be written by anyone with its credentials): an entry whose
// path is absolute or climbs out with `..`, a symbolic link whose target is absolute or resolves outside the root, a
// hard link to anything but a regular file already restored inside the root, a device node, FIFO or any other type,
// and a second entry at a path already made are refused, and the restore fails. It never follows a symbolic link: each
// parent directory is checked with lstat, and files are created with O_NOFOLLOW | O_EXCL. Set-user-ID and
// set-group-ID bits are not restored.
import { constants, type Stats } from 'node:fs';
import { chmod, lchown, link, lstat, lutimes, mkdir, open, readdir, readlink, rm, symlink, type FileHandle } from 'node:fs/promises';
import { once } from 'node:events';
import { posix } from 'node:path';
import { LatchError } from '../errors.js';
import type { ChunkSource } from '../backup/source.js';
import { isAllZero } from '../backup/chunks.js';

/** What a shared volume's backup records as its "filesystem" (a manifest allows [a-z0-9]{1,16}): a restore makes a shared volume of it. */
export const SHARED_ARCHIVE = 'sharedtar';

/** One thing a backup archives, found by the first walk. */
interface Entry {
  /** Relative to the root, `/`-separated, no leading `./`. */
  path: string;
  stats: Stats;
  type: 'directory' | 'file' | 'symlink' | 'link';
  /** A symlink's target; a hard link's first path. */
  linkname?: string;
}

/** What the first walk found: the entries in archive order, what it skipped, and the bound of the archive's size. */
export interface TreeListing {
  entries: Entry[];
  skipped: { path: string; kind: string }[];
  sizeBound: number;
}

const BLOCK = 512;
const roundUp = (n: number, to = BLOCK) => Math.ceil(n / to) * to;

/**
 * The size of one entry in a tar-stream archive, at most: a ustar header, and before it a pax header block with its
 * records (path, linkpath, size, owner and times where ustar's fields cannot hold them), then the data padded to 512.
 */
function entryBound(entry: Pick<Entry, 'path' | 'linkname' | 'type'>, size: number): number {
  const names = Buffer.byteLength(entry.path) + Buffer.byteLength(entry.linkname ?? '');
  // Each pax record is "LEN key=value\n": the values, and 40 bytes of length, key and separators for each of 8 keys.
  const pax = BLOCK + roundUp(names + 8 * 40 + 8 * 24);
  return BLOCK + pax + (entry.type === 'file' ? roundUp(size) : 0);
}

/**
 * Walks `root` without following any symbolic link (lstat), in a stable order (names sorted), and lists what a
 * backup archives. `onEntry` is called for each entry (a stall watchdog's tick).
 */
export async function listTree(root: string, onEntry: () => void = () => undefined): Promise<TreeListing> {
  const entries: Entry[] = [];
  const skipped: { path: string; kind: string }[] = [];
  const firstPathOf = new Map<string, string>();
  // Two 512-byte end-of-archive blocks, and tar-stream's own record padding, at most one 10 KiB record.
  let sizeBound = 2 * BLOCK + 10240;
  const walk = async (dir: string, rel: string): Promise<void> => {
    const names = (await readdir(dir)).sort();
    for (const name of names) {
      onEntry();
      const path = rel === '' ? name : `${rel}/${name}`;
      const full = posix.join(dir, name);
      const stats = await lstat(full);
      let entry: Entry | undefined;
      if (stats.isDirectory()) entry = { path, stats, type: 'directory' };
      else if (stats.isSymbolicLink()) entry = { path, stats, type: 'symlink', linkname: await readlink(full) };
      else if (stats.isFile()) {
        const key = `${stats.dev}:${stats.ino}`;
        const first = stats.nlink > 1 ? firstPathOf.get(key) : undefined;
        if (first !== undefined) entry = { path, stats, type: 'link', linkname: first };
        else {
          if (stats.nlink > 1) firstPathOf.set(key, path);
          entry = { path, stats, type: 'file' };
        }
      } else {
        skipped.push({ path, kind: kindOf(stats) });
        continue;
      }
      entries.push(entry);
      sizeBound += entryBound(entry, entry.type === 'file' ? stats.size : 0);
      if (entry.type === 'directory') await walk(full, path);
    }
  };
  await walk(root, '');
  return { entries, skipped, sizeBound: roundUp(sizeBound, 4096) };
}

function kindOf(stats: Stats): string {
  if (stats.isBlockDevice()) return 'block device';
  if (stats.isCharacterDevice()) return 'character device';
  if (stats.isFIFO()) return 'FIFO';
  if (stats.isSocket()) return 'socket';
  return 'unknown';
}

/**
 * The archive of `listing` (from `root`) as a stream: tar-stream's pack, fed entry by entry; each file read from an
 * O_NOFOLLOW handle, and refused if it no longer has the size the walk saw (a snapshot never changes: something is
 * wrong). `onProgress` is called as data moves (a stall watchdog's tick).
 */
export async function packTree(
  root: string,
  listing: TreeListing,
  onProgress: () => void = () => undefined,
): Promise<AsyncIterable<Buffer>> {
  const { pack: makePack } = await import('tar-stream');
  const pack = makePack();
  const feed = async () => {
    for (const entry of listing.entries) {
      const s = entry.stats;
      const header = {
        name: entry.path,
        mode: s.mode & 0o7777,
        uid: s.uid,
        gid: s.gid,
        mtime: s.mtime,
        type: entry.type,
        ...(entry.linkname !== undefined && { linkname: entry.linkname }),
        size: entry.type === 'file' ? s.size : 0,
      };
      if (entry.type !== 'file') {
        await new Promise<void>((resolve, reject) => pack.entry(header, (err) => (err ? reject(err) : resolve())));
        continue;
      }
      const handle = await open(posix.join(root, entry.path), constants.O_RDONLY | constants.O_NOFOLLOW);
      try {
        let done: (err?: Error | null) => void = () => undefined;
        const written = new Promise<void>((resolve, reject) => (done = (err) => (err ? reject(err) : resolve())));
        const sink = pack.entry(header, (err) => done(err));
        const buffer = Buffer.allocUnsafe(1024 * 1024);
        let left = s.size;
        while (left > 0) {
          const { bytesRead } = await handle.read(buffer, 0, Math.min(buffer.length, left));
          if (bytesRead === 0) throw new LatchError(`${entry.path} ended ${left} bytes before the size the walk saw`);
          left -= bytesRead;
          onProgress();
          if (!sink.write(Buffer.from(buffer.subarray(0, bytesRead)))) await once(sink, 'drain');
        }
        sink.end(undefined);
        await written;
      } finally {
        await handle.close();
      }
    }
    pack.finalize();
  };
  feed().catch((err: unknown) => pack.destroy(err instanceof Error ? err : new Error(String(err))));
  return pack as AsyncIterable<Buffer>;
}

/**
 * A chunk source over a stream whose length is at most `sizeBytes`: the chunk engine reads it position by position,
 * and what follows the stream's end reads as zeros (a hole when a whole chunk is). A stream longer than `sizeBytes`
 * fails the backup at finish().
 */
export function streamChunkSource(stream: AsyncIterable<Buffer>, sizeBytes: number): ChunkSource {
  const iterator = stream[Symbol.asyncIterator]();
  let pending: Buffer = Buffer.alloc(0);
  let ended = false;
  let read = 0;
  const pull = async (): Promise<boolean> => {
    if (ended) return false;
    const next = await iterator.next();
    if (next.done) {
      ended = true;
      return false;
    }
    pending = pending.length === 0 ? next.value : Buffer.concat([pending, next.value]);
    read += next.value.length;
    return true;
  };
  return {
    sizeBytes,
    async chunk(_index, length, into) {
      let filled = 0;
      while (filled < length) {
        if (pending.length === 0 && !(await pull())) break;
        const n = Math.min(length - filled, pending.length);
        pending.copy(into, filled, 0, n);
        pending = pending.subarray(n);
        filled += n;
      }
      if (filled === 0) return null;
      into.fill(0, filled, length);
      return into.subarray(0, length);
    },
    bytesRead: () => read,
    async finish() {
      if (pending.length > 0 || (await pull())) {
        throw new LatchError(`the archive outgrew its bound of ${sizeBytes} bytes; nothing was published`);
      }
    },
    cancel() {
      void iterator.return?.();
    },
  };
}

// ---- restore -------------------------------------------------------------------------------------------------------

/** The checked relative path of an archive entry: no absolute path, no `..`, nothing empty; `.` parts dropped. */
export function checkEntryPath(name: string): string {
  if (name.includes('\0')) throw refused(name, 'has a NUL byte');
  if (name.startsWith('/')) throw refused(name, 'is an absolute path');
  const parts = name.split('/').filter((p) => p !== '' && p !== '.');
  if (parts.includes('..')) throw refused(name, 'climbs out of the volume with ..');
  if (parts.length === 0) throw refused(name, 'names the root itself');
  return parts.join('/');
}

/** A symbolic link's target must stay inside the root, resolved from the link's own directory, without any absolute path. */
export function checkSymlinkTarget(path: string, target: string): void {
  if (target === '' || target.includes('\0')) throw refused(path, 'is a symbolic link with an empty or NUL target');
  if (target.startsWith('/')) throw refused(path, `is a symbolic link to the absolute path ${JSON.stringify(target.slice(0, 200))}`);
  const resolved = posix.normalize(posix.join(posix.dirname(path), target));
  if (resolved === '..' || resolved.startsWith('../')) {
    throw refused(path, `is a symbolic link to ${JSON.stringify(target.slice(0, 200))}, outside the volume`);
  }
}

function refused(name: string, why: string): LatchError {
  return new LatchError(`the backup's entry ${JSON.stringify(name.slice(0, 200))} ${why}: refused, the restore stops`);
}

export interface ExtractReport {
  files: number;
  directories: number;
  symlinks: number;
  hardLinks: number;
  bytes: number;
}

/** Writes this much at most per write; an all-zero block of it is left a hole. */
const WRITE_BLOCK = 64 * 1024;

/**
 * Makes every entry of the archive `bytes` inside `root` (an empty directory), refusing hostile entries (see the top
 * of this file). `onProgress` is called as data moves (a stall watchdog's tick). The owners, modes and times of
 * directories are set last, deepest first, so that making their contents does not change them.
 */
export async function extractTree(
  bytes: AsyncIterable<Buffer>,
  root: string,
  onProgress: () => void = () => undefined,
): Promise<ExtractReport> {
  const { extract: makeExtract } = await import('tar-stream');
  const { Readable } = await import('node:stream');
  const extract = makeExtract();
  const input = Readable.from(bytes);
  input.on('error', (err) => extract.destroy(err));
  input.pipe(extract);
  const report: ExtractReport = { files: 0, directories: 0, symlinks: 0, hardLinks: 0, bytes: 0 };
  const directories: { path: string; header: Header }[] = [];
  for await (const entry of extract) {
    const header = entry.header as Header;
    const path = checkEntryPath(header.name);
    const full = posix.join(root, path);
    await checkParents(root, path);
    switch (header.type) {
      case 'directory':
        await mkdir(full, { mode: 0o700 }).catch((err: NodeJS.ErrnoException) => {
          throw err.code === 'EEXIST' ? refused(header.name, 'is made twice') : err;
        });
        directories.push({ path: full, header });
        report.directories++;
        break;
      case 'file':
      case 'contiguous-file': {
        const handle = await open(full, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o600).catch(
          (err: NodeJS.ErrnoException) => {
            throw err.code === 'EEXIST' || err.code === 'ELOOP' ? refused(header.name, 'is made twice') : err;
          },
        );
        try {
          report.bytes += await writeSparse(handle, entry as AsyncIterable<Buffer>, onProgress);
          await handle.truncate(header.size ?? 0);
          await handle.chown(header.uid ?? 0, header.gid ?? 0);
          await handle.chmod(safeMode(header.mode));
          if (header.mtime) await handle.utimes(header.mtime, header.mtime);
        } finally {
          await handle.close();
        }
        report.files++;
        break;
      }
      case 'symlink': {
        const target = header.linkname ?? '';
        checkSymlinkTarget(path, target);
        await symlink(target, full).catch((err: NodeJS.ErrnoException) => {
          throw err.code === 'EEXIST' ? refused(header.name, 'is made twice') : err;
        });
        await lchown(full, header.uid ?? 0, header.gid ?? 0);
        if (header.mtime) await lutimes(full, header.mtime, header.mtime);
        report.symlinks++;
        break;
      }
      case 'link': {
        const first = checkEntryPath(header.linkname ?? '');
        await checkParents(root, first);
        const info = await lstat(posix.join(root, first)).catch(() => undefined);
        if (!info?.isFile())
          throw refused(header.name, `is a hard link to ${JSON.stringify(first.slice(0, 200))}, which is no file restored here`);
        await link(posix.join(root, first), full).catch((err: NodeJS.ErrnoException) => {
          throw err.code === 'EEXIST' ? refused(header.name, 'is made twice') : err;
        });
        report.hardLinks++;
        break;
      }
      default:
        throw refused(header.name, `is a ${header.type ?? 'typeless entry'}, which a restore never makes`);
    }
    entry.resume();
    onProgress();
  }
  for (const dir of directories.reverse()) {
    await lchown(dir.path, dir.header.uid ?? 0, dir.header.gid ?? 0);
    await chmod(dir.path, safeMode(dir.header.mode));
    if (dir.header.mtime) await lutimes(dir.path, dir.header.mtime, dir.header.mtime);
  }
  return report;
}

interface Header {
  name: string;
  type?: string | null;
  size?: number | null;
  mode?: number | null;
  uid?: number | null;
  gid?: number | null;
  mtime?: Date | null;
  linkname?: string | null;
}

/** Permission bits and the sticky bit; never set-user-ID or set-group-ID. */
function safeMode(mode: number | null | undefined): number {
  return (mode ?? 0o600) & 0o1777;
}

/** Each parent directory of `path` below `root` exists as a real directory (lstat: never a symbolic link). */
async function checkParents(root: string, path: string): Promise<void> {
  const parts = path.split('/').slice(0, -1);
  let at = root;
  for (const part of parts) {
    at = posix.join(at, part);
    const info = await lstat(at).catch(() => undefined);
    if (!info?.isDirectory() || info.isSymbolicLink()) {
      throw refused(
        path,
        `goes through ${JSON.stringify(posix.relative(root, at))}, which is ${info ? 'no directory' : 'missing'} in the archive`,
      );
    }
  }
}

/** Writes a file's content, leaving every all-zero block a hole; returns the bytes it was given. */
async function writeSparse(handle: FileHandle, data: AsyncIterable<Buffer>, onProgress: () => void): Promise<number> {
  let offset = 0;
  for await (const piece of data) {
    for (let at = 0; at < piece.length; at += WRITE_BLOCK) {
      const block = piece.subarray(at, Math.min(piece.length, at + WRITE_BLOCK));
      if (!isAllZero(block)) {
        let written = 0;
        while (written < block.length) {
          written += (await handle.write(block, written, block.length - written, offset + at + written)).bytesWritten;
        }
      }
    }
    offset += piece.length;
    onProgress();
  }
  return offset;
}

/** Empties `root` (what an interrupted restore made there), leaving the directory itself. */
export async function emptyDirectory(root: string): Promise<void> {
  for (const name of await readdir(root)) await rm(posix.join(root, name), { recursive: true, force: true });
}

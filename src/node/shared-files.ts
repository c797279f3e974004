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
// What an archive holds: the root directory (its metadata: `./`, first), directories, regular files (a file's other
// hard links as links to its first path), symbolic links, each with its owner, group, permission bits and modification
// time, and its `user.*` extended attributes and POSIX ACLs (node/shared-xattrs.ts: pax `SCHILY.xattr.*` records).
// Names and symbolic link targets are kept byte for byte: the walk reads them as Buffers (a name that is not UTF-8,
// such as a legacy Latin-1 one, read as text would name no file), tar-stream writes the UTF-8 ones, and latch writes
// the pax header of any other itself, its `path` and `linkpath` records as bytes after `hdrcharset=BINARY` (POSIX).
// The attr tools take paths as text: the attributes of an entry whose path is not UTF-8 are not kept (listed). Not
// kept: other extended attributes (`security.*` such as file capabilities, `trusted.*`, CephFS's virtual `ceph.*`),
// holes inside files (read as zeros; the chunk engine stores zero chunks as holes, and the restore writes no all-zero
// block, so a sparse file comes back sparse in 64 KiB steps), and what is no file: device nodes, FIFOs and sockets are
// skipped by a backup (counted in its result).
//
// A restore treats the archive as hostile (the target may be written by anyone with its credentials), and reads names
// as bytes (pax `path` and `linkpath` records from the raw pax header, ustar fields as latin1; an `hdrcharset` other
// than BINARY or UTF-8 is refused), so that every check below holds whatever the name's encoding: an entry whose
// path is absolute or climbs out with `..`, a symbolic link whose target is absolute or resolves outside the root, a
// hard link to anything but a regular file already restored inside the root, a device node, FIFO or any other type,
// and a second entry at a path already made are refused, and the restore fails. It never follows a symbolic link: each
// parent directory is checked with lstat, and files are created with O_NOFOLLOW | O_EXCL. Set-user-ID and
// set-group-ID bits are not restored. Of an entry's attributes it sets only those a backup keeps; any other attribute
// or unknown pax record is skipped and counted, a malformed one stops the restore (shared-xattrs.ts).
import { isUtf8 } from 'node:buffer';
import { constants, type Stats } from 'node:fs';
import { chmod, lchown, link, lstat, lutimes, mkdir, open, readdir, readlink, rm, symlink, type FileHandle } from 'node:fs/promises';
import { once } from 'node:events';
import { posix } from 'node:path';
import type { extract as TarExtract } from 'tar-stream';
import { LatchError } from '../errors.js';
import type { ChunkSource } from '../backup/source.js';
import { isAllZero } from '../backup/chunks.js';
import {
  MAX_XATTR_BYTES,
  XATTR_BATCH,
  encodePaxRecords,
  entryXattrs,
  isKeptXattr,
  parsePaxRecords,
  xattrBytes,
  xattrRecordsBound,
  type EntryXattrs,
  type XattrIO,
  type Xattrs,
  shownName,
} from './shared-xattrs.js';

/** What a shared volume's backup records as its "filesystem" (a manifest allows [a-z0-9]{1,16}): a restore makes a shared volume of it. */
export const SHARED_ARCHIVE = 'sharedtar';

/** One thing a backup archives, found by the first walk. */
interface Entry {
  /** Relative to the root, `/`-separated, no leading `./`: the name's bytes as the file system has them. */
  path: Buffer;
  stats: Stats;
  type: 'directory' | 'file' | 'symlink' | 'link';
  /** A symlink's target (its bytes); a hard link's first path. */
  linkname?: Buffer;
  /** The bytes its attributes' pax records take at most (xattrRecordsBound), when it has any. */
  xattrBound?: number;
}

/** What the first walk found: the entries in archive order, what it skipped, and the bound of the archive's size. */
export interface TreeListing {
  entries: Entry[];
  skipped: { path: string; kind: string }[];
  /** How many entries have attributes to keep. */
  xattrEntries: number;
  sizeBound: number;
}

const BLOCK = 512;
const roundUp = (n: number, to = BLOCK) => Math.ceil(n / to) * to;

/** The absolute path of an entry (`.` is the root itself), on bytes. */
function fullPath(root: Buffer, path: Buffer): Buffer {
  return path.equals(DOT) ? root : joinBytes(root, path);
}
const DOT = Buffer.from('.');

/** `a/b`, on bytes (a name need not be UTF-8). */
function joinBytes(dir: Buffer, name: Buffer): Buffer {
  return dir.length === 0 ? name : Buffer.concat([dir, SLASH, name]);
}
const SLASH = Buffer.from('/');

/** Whether an entry's names are UTF-8: tar-stream writes those; latch writes the pax header of any other itself. */
const namesAreUtf8 = (entry: Pick<Entry, 'path' | 'linkname'>) =>
  isUtf8(entry.path) && (entry.linkname === undefined || isUtf8(entry.linkname));

/**
 * The size of one entry in a tar-stream archive, at most: a ustar header, and before it a pax header block with its
 * records (path, linkpath, size, owner and times where ustar's fields cannot hold them), then the data padded to 512.
 */
function entryBound(entry: Pick<Entry, 'path' | 'linkname' | 'type'>, size: number): number {
  const names = entry.path.length + (entry.linkname?.length ?? 0);
  // Each pax record is "LEN key=value\n": the values, and 40 bytes of length, key and separators for each of 8 keys;
  // latch's own pax header of names that are not UTF-8 (hdrcharset, and padding to whole blocks), at most 1 KiB more.
  const pax = BLOCK + roundUp(names + 8 * 40 + 8 * 24) + (namesAreUtf8(entry) ? 0 : 2 * BLOCK);
  return BLOCK + pax + (entry.type === 'file' ? roundUp(size) : 0);
}

/**
 * Walks `root` without following any symbolic link (lstat), in a stable order (names sorted), and lists what a
 * backup archives, with the size of each entry's attributes (read through `xattrs`, and not kept: packTree reads them
 * again, so that the listing stays small). `onEntry` is called for each entry (a stall watchdog's tick).
 */
export async function listTree(root: string, xattrs: XattrIO, onEntry: () => void = () => undefined): Promise<TreeListing> {
  const entries: Entry[] = [];
  const skipped: { path: string; kind: string }[] = [];
  const firstPathOf = new Map<string, Buffer>();
  // Two 512-byte end-of-archive blocks, and tar-stream's own record padding, at most one 10 KiB record.
  let sizeBound = 2 * BLOCK + 10240;
  // The root first, as `./` (as GNU tar names it): its owner, mode, time and attributes (a default ACL on the root).
  const dot = Buffer.from('.');
  entries.push({ path: dot, stats: await lstat(root), type: 'directory' });
  sizeBound += entryBound({ path: dot, type: 'directory' }, 0);
  // On bytes: a name that is not UTF-8 (a legacy Latin-1 one) would read as text with U+FFFD in it, which names no file.
  const walk = async (dir: Buffer, rel: Buffer): Promise<void> => {
    const names = (await readdir(dir, { encoding: 'buffer' })).sort((a, b) => Buffer.compare(a, b));
    for (const name of names) {
      onEntry();
      const path = joinBytes(rel, name);
      const full = joinBytes(dir, name);
      const stats = await lstat(full);
      let entry: Entry | undefined;
      if (stats.isDirectory()) entry = { path, stats, type: 'directory' };
      else if (stats.isSymbolicLink()) entry = { path, stats, type: 'symlink', linkname: await readlink(full, { encoding: 'buffer' }) };
      else if (stats.isFile()) {
        const key = `${stats.dev}:${stats.ino}`;
        const first = stats.nlink > 1 ? firstPathOf.get(key) : undefined;
        if (first !== undefined) entry = { path, stats, type: 'link', linkname: first };
        else {
          if (stats.nlink > 1) firstPathOf.set(key, path);
          entry = { path, stats, type: 'file' };
        }
      } else {
        skipped.push({ path: shownName(path), kind: kindOf(stats) });
        continue;
      }
      entries.push(entry);
      sizeBound += entryBound(entry, entry.type === 'file' ? stats.size : 0);
      if (entry.type === 'directory') await walk(full, path);
    }
  };
  await walk(Buffer.from(root), Buffer.alloc(0));
  // A hard link's attributes are its first path's. Linux allows neither user.* attributes nor ACLs on a symbolic link.
  const withInode = entries.filter((e) => e.type === 'file' || e.type === 'directory');
  const rootBytes = Buffer.from(root);
  let xattrEntries = 0;
  for (let at = 0; at < withInode.length; at += XATTR_BATCH) {
    const batch = withInode.slice(at, at + XATTR_BATCH);
    const found = await xattrs.read(batch.map((e) => fullPath(rootBytes, e.path)));
    onEntry();
    for (const [i, entry] of batch.entries()) {
      const values = found[i];
      if (values === undefined) continue;
      const kept = keptXattrs(entry.path.toString(), values, skipped);
      if (kept.size === 0) continue;
      entry.xattrBound = xattrRecordsBound(kept);
      sizeBound += entry.xattrBound;
      xattrEntries++;
    }
  }
  return { entries, skipped, xattrEntries, sizeBound: roundUp(sizeBound, 4096) };
}

/**
 * The attributes of `values` a backup keeps; one whose name is not UTF-8 (which a pax keyword must be) is skipped and
 * listed. More than a restore accepts fails the backup: an archive that no restore takes is no backup.
 */
function keptXattrs(path: string, values: Xattrs, skipped: { path: string; kind: string }[]): Xattrs {
  const kept: Xattrs = new Map();
  for (const [name, value] of values) {
    if (!isKeptXattr(name)) continue;
    if (name.includes('\ufffd')) skipped.push({ path, kind: `attribute ${JSON.stringify(name)} (its name is not UTF-8)` });
    else kept.set(name, value);
  }
  if (xattrBytes(kept) > MAX_XATTR_BYTES) {
    throw new LatchError(
      `${JSON.stringify(path.slice(0, 200))} has more than ${MAX_XATTR_BYTES} bytes of extended attributes, more than a restore accepts: the backup stops`,
    );
  }
  return kept;
}

/**
 * A name tar-stream writes in an entry's own ustar header when a pax header of ours precedes it (the pax `path` and
 * `linkpath` records say the real ones): printable ASCII, short enough for the header's field with no pax of its own.
 */
function ustarStandIn(name: string): string {
  const ascii = name.replace(/[^\x21-\x7e]/g, '_');
  return ascii.length <= 90 ? ascii : ascii.slice(-90);
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
  xattrs: XattrIO,
  onProgress: () => void = () => undefined,
): Promise<AsyncIterable<Buffer>> {
  const { pack: makePack } = await import('tar-stream');
  const pack = makePack();
  const entryDone = (header: Parameters<typeof pack.entry>[0]) =>
    new Promise<void>((resolve, reject) => pack.entry(header, (err) => (err ? reject(err) : resolve())));
  const withXattrs = listing.entries.filter((e) => e.xattrBound !== undefined);
  const rootBytes = Buffer.from(root);
  let read = new Map<Entry, Xattrs | undefined>();
  let nextBatch = 0;
  const xattrsOf = async (entry: Entry): Promise<Xattrs> => {
    if (!read.has(entry)) {
      const batch = withXattrs.slice(nextBatch, nextBatch + XATTR_BATCH);
      nextBatch += batch.length;
      const values = await xattrs.read(batch.map((e) => fullPath(rootBytes, e.path)));
      read = new Map(batch.map((e, i) => [e, values[i]]));
    }
    const kept = keptXattrs(entry.path.toString(), read.get(entry) ?? new Map<string, Buffer>(), []);
    if (kept.size === 0 || xattrRecordsBound(kept) !== entry.xattrBound) {
      throw new LatchError(`the extended attributes of ${JSON.stringify(shownName(entry.path).slice(0, 200))} changed since the walk`);
    }
    return kept;
  };
  const feed = async () => {
    for (const entry of listing.entries) {
      const s = entry.stats;
      const header = {
        name: entry.path.toString(),
        mode: s.mode & 0o7777,
        uid: s.uid,
        gid: s.gid,
        mtime: s.mtime,
        type: entry.type,
        ...(entry.linkname !== undefined && { linkname: entry.linkname.toString() }),
        size: entry.type === 'file' ? s.size : 0,
      };
      if (entry.xattrBound !== undefined || !namesAreUtf8(entry)) {
        // Our own pax header before the entry's (tar-stream's cannot carry bytes that are not UTF-8), pushed whole
        // after tar-stream's typeflag-x header for it: its records fill whole blocks, so tar-stream pads nothing.
        const kept = entry.xattrBound === undefined ? new Map<string, Buffer>() : await xattrsOf(entry);
        const records = encodePaxRecords(entry.path, entry.linkname, kept);
        const paxHeader = { name: 'PaxHeader', type: 'pax-header', size: records.length, mode: 0o644, mtime: s.mtime };
        await entryDone(paxHeader as unknown as Parameters<typeof pack.entry>[0]);
        pack.push(records);
        header.name = ustarStandIn(entry.path.toString('latin1'));
        if (entry.linkname !== undefined) header.linkname = ustarStandIn(entry.linkname.toString('latin1'));
      }
      if (entry.type !== 'file') {
        await entryDone(header);
        continue;
      }
      const handle = await open(joinBytes(rootBytes, entry.path), constants.O_RDONLY | constants.O_NOFOLLOW);
      try {
        let done: (err?: Error | null) => void = () => undefined;
        const written = new Promise<void>((resolve, reject) => (done = (err) => (err ? reject(err) : resolve())));
        const sink = pack.entry(header, (err) => done(err));
        const buffer = Buffer.allocUnsafe(1024 * 1024);
        let left = s.size;
        while (left > 0) {
          const { bytesRead } = await handle.read(buffer, 0, Math.min(buffer.length, left));
          if (bytesRead === 0) throw new LatchError(`${shownName(entry.path)} ended ${left} bytes before the size the walk saw`);
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

// Names are checked on their bytes (a name need not be UTF-8): as latin1 text, one character a byte, where `/`, `.`
// and NUL are what they are in the bytes, so that the checks hold for any name.

/** The checked relative path of an archive entry: no absolute path, no `..`, nothing empty; `.` parts dropped. */
export function checkEntryPath(name: Buffer): Buffer {
  const text = name.toString('latin1');
  if (text.includes('\0')) throw refused(name, 'has a NUL byte');
  if (text.startsWith('/')) throw refused(name, 'is an absolute path');
  const parts = text.split('/').filter((p) => p !== '' && p !== '.');
  if (parts.includes('..')) throw refused(name, 'climbs out of the volume with ..');
  if (parts.length === 0) throw refused(name, 'names the root itself');
  return Buffer.from(parts.join('/'), 'latin1');
}

/** A symbolic link's target must stay inside the root, resolved from the link's own directory, without any absolute path. */
export function checkSymlinkTarget(path: Buffer, target: Buffer): void {
  const text = target.toString('latin1');
  if (text === '' || text.includes('\0')) throw refused(path, 'is a symbolic link with an empty or NUL target');
  if (text.startsWith('/'))
    throw refused(path, `is a symbolic link to the absolute path ${JSON.stringify(shownName(target).slice(0, 200))}`);
  const resolved = posix.normalize(posix.join(posix.dirname(path.toString('latin1')), text));
  if (resolved === '..' || resolved.startsWith('../')) {
    throw refused(path, `is a symbolic link to ${JSON.stringify(shownName(target).slice(0, 200))}, outside the volume`);
  }
}

function refused(name: Buffer, why: string): LatchError {
  return new LatchError(`the backup's entry ${JSON.stringify(shownName(name).slice(0, 200))} ${why}: refused, the restore stops`);
}

/** The values of `hdrcharset` a restore takes: names as bytes, or as UTF-8 (kept as bytes alike). */
const HDRCHARSETS = new Set(['BINARY', 'ISO-IR 10646 2000 UTF-8']);

/** An entry's own pax records as bytes, and its names as bytes (what its pax `path` and `linkpath` say, else its header's). */
function entryNames(
  header: Header,
  globalRecords: PaxRecords,
): { name: Buffer; linkname: Buffer | undefined; raw: PaxRecords | undefined } {
  const pax = header.pax as Record<string | symbol, unknown> | null | undefined;
  const raw = pax ? (pax[RAW_PAX] as PaxRecords | undefined) : undefined;
  const record = (key: string) => raw?.find((r) => r.key === key)?.value ?? globalRecords.find((r) => r.key === key)?.value;
  const charset = record('hdrcharset');
  // The header's own fields are read as latin1 (extract's filenameEncoding): their bytes, one character each.
  const headerName = Buffer.from(header.name, 'latin1');
  if (charset !== undefined && !HDRCHARSETS.has(charset.toString('latin1'))) {
    throw refused(headerName, `names its character set ${JSON.stringify(shownName(charset).slice(0, 100))}, neither BINARY nor UTF-8`);
  }
  const linkname = record('linkpath') ?? (header.linkname ? Buffer.from(header.linkname, 'latin1') : undefined);
  return { name: record('path') ?? headerName, linkname, raw };
}

type PaxRecords = { key: string; value: Buffer }[];

export interface ExtractReport {
  files: number;
  directories: number;
  symlinks: number;
  hardLinks: number;
  bytes: number;
  /** Entries whose extended attributes were set. */
  xattrEntries: number;
  /** Attributes and pax records skipped (never set: not user.* nor a POSIX ACL, or unknown), counted... */
  skippedXattrs: number;
  /** ...and the first of them, in words. */
  skippedXattrsSample: string[];
}

/** The most bytes of directories' default ACLs a restore holds until its end (where it sets them). */
const MAX_DEFERRED_XATTR_BYTES = 64 * 1024 * 1024;

/** Where the raw records of an entry's pax header travel with it (on tar-stream's decoded pax object). */
const RAW_PAX = Symbol('the raw records of the pax header');

/**
 * tar-stream's extract, made to keep each pax header's records as bytes: its own parser reads them as UTF-8 strings
 * (an ACL's binary value would not survive it) and stops at a malformed record without a word. The hook is on
 * tar-stream's (pinned) extract's method that decodes a long header; an entry whose decoded pax names an attribute
 * but lacks our records fails the restore, so that a tar-stream without that method cannot lose them silently.
 */
function rawPaxExtract(makeExtract: typeof TarExtract, globalRecords: PaxRecords) {
  // latin1: the bytes of the names in tar headers, one character each (entryNames).
  const extract = makeExtract({ filenameEncoding: 'latin1' } as Parameters<typeof TarExtract>[0]);
  type Internals = { _header?: { type?: string } | null; _pax?: Record<string | symbol, unknown> | null };
  const hooked = extract as unknown as Internals & { _decodeLongHeader?: (this: Internals, buf: Buffer) => void };
  const decode = hooked._decodeLongHeader;
  if (typeof decode !== 'function') throw new LatchError("tar-stream's extract has no _decodeLongHeader: it cannot read attributes");
  hooked._decodeLongHeader = function (this: Internals, buf: Buffer) {
    const type = this._header?.type;
    decode.call(this, buf);
    if (type === 'pax-header' && this._pax) this._pax[RAW_PAX] = parsePaxRecords(buf);
    if (type === 'pax-global-header') {
      const records = parsePaxRecords(buf);
      if (records.some((r) => r.key.startsWith('SCHILY.xattr.') || r.key === 'path' || r.key === 'linkpath')) {
        throw new LatchError("the backup's archive has extended attributes or names in a global pax header: refused, the restore stops");
      }
      globalRecords.splice(0, globalRecords.length, ...records);
    }
  };
  return extract;
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
  xattrs: XattrIO,
  onProgress: () => void = () => undefined,
): Promise<ExtractReport> {
  const { extract: makeExtract } = await import('tar-stream');
  const { Readable } = await import('node:stream');
  const globalRecords: PaxRecords = [];
  const extract = rawPaxExtract(makeExtract, globalRecords);
  const input = Readable.from(bytes);
  input.on('error', (err) => extract.destroy(err));
  input.pipe(extract);
  const report: ExtractReport = {
    files: 0,
    directories: 0,
    symlinks: 0,
    hardLinks: 0,
    bytes: 0,
    xattrEntries: 0,
    skippedXattrs: 0,
    skippedXattrsSample: [],
  };
  const directories: { path: Buffer; header: Header }[] = [];
  const rootBytes = Buffer.from(root);
  // Attributes to set, a batch at a time (one setfattr each); a directory's default ACL only once all is made, or
  // every entry made inside it would inherit it (and keep it, though it had its own in the backup, or none).
  let pending: { path: Buffer; xattrs: Xattrs }[] = [];
  const defaults: { path: Buffer; xattrs: Xattrs }[] = [];
  let deferredBytes = 0;
  const flush = async () => {
    await xattrs.write(pending);
    pending = [];
  };
  let first = true;
  for await (const entry of extract) {
    const header = entry.header as Header;
    const names = entryNames(header, globalRecords);
    const name = names.name;
    const nameText = name.toString('latin1');
    // The root's own entry (`./`), first and a directory only: it makes nothing, it sets the root's metadata.
    const isRoot =
      first && header.type === 'directory' && !nameText.startsWith('/') && nameText.split('/').every((p) => p === '' || p === '.');
    first = false;
    const path = isRoot ? Buffer.from('.') : checkEntryPath(name);
    const full = isRoot ? rootBytes : joinBytes(rootBytes, path);
    const shown = shownName(path).slice(0, 200);
    const { kept, skipped } = attributesOf(header, names.raw, shown);
    for (const what of skipped) {
      report.skippedXattrs++;
      if (report.skippedXattrsSample.length < 20) report.skippedXattrsSample.push(`${shown}: ${what}`);
    }
    await checkParents(rootBytes, path);
    switch (header.type) {
      case 'directory':
        if (!isRoot) {
          await mkdir(full, { mode: 0o700 }).catch((err: NodeJS.ErrnoException) => {
            throw err.code === 'EEXIST' ? refused(name, 'is made twice') : err;
          });
          report.directories++;
        }
        directories.push({ path: full, header });
        {
          const acl = kept.get('system.posix_acl_default');
          if (acl !== undefined) {
            kept.delete('system.posix_acl_default');
            deferredBytes += acl.length + full.length;
            if (deferredBytes > MAX_DEFERRED_XATTR_BYTES) {
              throw refused(name, `brings the directories' default ACLs past ${MAX_DEFERRED_XATTR_BYTES} bytes`);
            }
            defaults.push({ path: full, xattrs: new Map([['system.posix_acl_default', acl]]) });
            if (kept.size === 0) report.xattrEntries++;
          }
        }
        break;
      case 'file':
      case 'contiguous-file': {
        const handle = await open(full, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o600).catch(
          (err: NodeJS.ErrnoException) => {
            throw err.code === 'EEXIST' || err.code === 'ELOOP' ? refused(name, 'is made twice') : err;
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
        const target = names.linkname ?? Buffer.alloc(0);
        checkSymlinkTarget(path, target);
        await symlink(target, full).catch((err: NodeJS.ErrnoException) => {
          throw err.code === 'EEXIST' ? refused(name, 'is made twice') : err;
        });
        await lchown(full, header.uid ?? 0, header.gid ?? 0);
        if (header.mtime) await lutimes(full, header.mtime, header.mtime);
        report.symlinks++;
        // Linux has user.* attributes and ACLs on files and directories only: a symbolic link's are skipped.
        for (const attribute of kept.keys()) {
          report.skippedXattrs++;
          if (report.skippedXattrsSample.length < 20)
            report.skippedXattrsSample.push(`${shown}: attribute ${attribute} of a symbolic link`);
        }
        kept.clear();
        break;
      }
      case 'link': {
        const first = checkEntryPath(names.linkname ?? Buffer.alloc(0));
        await checkParents(rootBytes, first);
        const info = await lstat(joinBytes(rootBytes, first)).catch(() => undefined);
        if (!info?.isFile())
          throw refused(name, `is a hard link to ${JSON.stringify(shownName(first).slice(0, 200))}, which is no file restored here`);
        await link(joinBytes(rootBytes, first), full).catch((err: NodeJS.ErrnoException) => {
          throw err.code === 'EEXIST' ? refused(name, 'is made twice') : err;
        });
        report.hardLinks++;
        break;
      }
      default:
        throw refused(name, `is a ${header.type ?? 'typeless entry'}, which a restore never makes`);
    }
    if (kept.size > 0) {
      pending.push({ path: full, xattrs: kept });
      report.xattrEntries++;
      if (pending.length >= XATTR_BATCH) await flush();
    }
    entry.resume();
    onProgress();
  }
  await flush();
  onProgress();
  for (const dir of directories.reverse()) {
    await lchown(dir.path, dir.header.uid ?? 0, dir.header.gid ?? 0);
    await chmod(dir.path, safeMode(dir.header.mode));
    if (dir.header.mtime) await lutimes(dir.path, dir.header.mtime, dir.header.mtime);
  }
  for (let at = 0; at < defaults.length; at += XATTR_BATCH) {
    await xattrs.write(defaults.slice(at, at + XATTR_BATCH));
    onProgress();
  }
  return report;
}

/** The attributes of an entry's pax header that a restore sets, and what it skips (shared-xattrs.ts, entryXattrs). */
function attributesOf(header: Header, raw: PaxRecords | undefined, shown: string): EntryXattrs {
  const pax = header.pax as Record<string | symbol, unknown> | null | undefined;
  if (!pax) return { kept: new Map(), skipped: [] };
  if (raw === undefined) {
    if (Object.keys(pax).some((k) => k.startsWith('SCHILY.xattr.'))) {
      throw new LatchError(`the attributes of ${JSON.stringify(shown)} could not be read as bytes: the restore stops`);
    }
    return entryXattrs(Object.keys(pax).map((key) => ({ key, value: Buffer.alloc(0) })));
  }
  return entryXattrs(raw);
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
  pax?: unknown;
}

/** Permission bits and the sticky bit; never set-user-ID or set-group-ID. */
function safeMode(mode: number | null | undefined): number {
  return (mode ?? 0o600) & 0o1777;
}

/** Each parent directory of `path` (checked) below `root` exists as a real directory (lstat: never a symbolic link). */
async function checkParents(root: Buffer, path: Buffer): Promise<void> {
  const parts = path.toString('latin1').split('/').slice(0, -1);
  let rel: Buffer = Buffer.alloc(0);
  for (const part of parts) {
    rel = joinBytes(rel, Buffer.from(part, 'latin1'));
    const info = await lstat(joinBytes(root, rel)).catch(() => undefined);
    if (!info?.isDirectory() || info.isSymbolicLink()) {
      throw refused(path, `goes through ${JSON.stringify(shownName(rel))}, which is ${info ? 'no directory' : 'missing'} in the archive`);
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
  const rootBytes = Buffer.from(root);
  for (const name of await readdir(rootBytes, { encoding: 'buffer' }))
    await rm(joinBytes(rootBytes, name), { recursive: true, force: true });
}

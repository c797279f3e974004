// The extended attributes a shared volume's backup keeps (docs/operations.md, "Backups of shared volumes"): each
// entry's `user.*` attributes and POSIX ACLs (`system.posix_acl_access`, `system.posix_acl_default`), carried in the
// entry's pax extended header as `SCHILY.xattr.<name>=<value>` records, the form GNU tar and star write and read, the
// value's bytes as they are (an ACL is binary).
//
// tar-stream writes and reads pax records as UTF-8 strings, which cannot carry arbitrary bytes: the archive's pax
// blocks of entries with attributes, or with a name that is not UTF-8 (under `hdrcharset=BINARY`), are made here
// (encodePaxRecords), and a restore parses the raw block itself (parsePaxRecords), strictly: a malformed block fails
// the restore instead of being cut short, as tar-stream's own parser does.
//
// A restore treats these records as hostile: it sets only the names a backup keeps (never `security.*`, whose
// `security.capability` would grant file capabilities to a binary, nor `trusted.*`, nor CephFS's virtual `ceph.*`
// such as quotas and layouts); any other attribute or unknown record is skipped and counted. An entry's attributes are
// bounded (MAX_XATTR_BYTES) so that a hostile archive cannot make a restore hold much.
//
// Node has no call for extended attributes: Debian's `attr` tools read and write them, `getfattr` and `setfattr`, a
// batch of paths a child (a deadline each, no shell), with `-h` (a symbolic link's own, never its target's). Their
// paths are arguments, which are text: an entry whose name is not UTF-8 is reached through a descriptor this process
// opens on it (O_NOFOLLOW: the entry itself, never where a link points), as `/proc/<pid>/fd/<fd>`, which the tool
// follows (without `-h`) to that entry.
import { isUtf8 } from 'node:buffer';
import { constants } from 'node:fs';
import { open, type FileHandle } from 'node:fs/promises';
import { LatchError } from '../errors.js';
import { run } from '../sys/run.js';

/** An entry's attributes: name -> value, names in the order read. */
export type Xattrs = Map<string, Buffer>;

/** The most bytes of attribute names and values one entry may carry, in a backup and in a restore. */
export const MAX_XATTR_BYTES = 64 * 1024;

/** The attributes a backup keeps and a restore sets. */
export function isKeptXattr(name: string): boolean {
  return (name.startsWith('user.') && name.length > 5) || name === 'system.posix_acl_access' || name === 'system.posix_acl_default';
}

/** getfattr's pattern (a regular expression on names) for the same names. */
const KEPT_PATTERN = '^(user\\..+|system\\.posix_acl_(access|default))$';

const XATTR_KEY = 'SCHILY.xattr.';

/** The pax keywords tar-stream or a restore reads, or that carry nothing a restore would set (not counted as skipped). */
const PLAIN_PAX_KEYS = new Set([
  'hdrcharset',
  'path',
  'linkpath',
  'size',
  'uid',
  'gid',
  'uname',
  'gname',
  'mtime',
  'atime',
  'ctime',
  'comment',
]);

/**
 * Reads and writes the kept attributes of files and directories on a mounted file system (the `attr` tools here; a
 * fake in tests). Paths are absolute, as bytes: a name need not be UTF-8.
 */
export interface XattrIO {
  /** The kept attributes of each of `paths` (existing), in their order; undefined for one that has none. */
  read(paths: Buffer[]): Promise<(Xattrs | undefined)[]>;
  /** Sets each item's attributes on its path, never through a symbolic link. */
  write(items: { path: Buffer; xattrs: Xattrs }[]): Promise<void>;
}

// ---- pax records ---------------------------------------------------------------------------------------------------

/** One pax record: `LEN key=value\n`, LEN counting the whole record, its own digits too. */
function paxRecord(key: string, value: Buffer): Buffer {
  const body = Buffer.concat([Buffer.from(` ${key}=`), value, Buffer.from('\n')]);
  let length = body.length + String(body.length).length;
  if (String(length).length !== String(body.length).length) length = body.length + String(length).length;
  return Buffer.concat([Buffer.from(String(length)), body]);
}

/**
 * A pax extended header's records for an entry: its path (and link target), its attributes, and a `comment` record
 * that pads the whole to a multiple of 512 bytes (tar-stream pads an entry's header right after it: a block of whole
 * 512-byte records needs none, so the records can follow it as they are).
 */
export function encodePaxRecords(path: string | Buffer, linkname: string | Buffer | undefined, xattrs: Xattrs): Buffer {
  const pathBytes = Buffer.from(path);
  const linkBytes = linkname === undefined ? undefined : Buffer.from(linkname);
  // A name that is not UTF-8 goes as its bytes, under `hdrcharset=BINARY` (POSIX; GNU tar, libarchive and Python's
  // tarfile write and read it): a reader then takes path and linkpath as bytes rather than convert them from UTF-8.
  const records =
    isUtf8(pathBytes) && (linkBytes === undefined || isUtf8(linkBytes)) ? [] : [paxRecord('hdrcharset', Buffer.from('BINARY'))];
  records.push(paxRecord('path', pathBytes));
  if (linkBytes !== undefined) records.push(paxRecord('linkpath', linkBytes));
  for (const [name, value] of xattrs) records.push(paxRecord(`${XATTR_KEY}${encodeXattrName(name)}`, value));
  const length = records.reduce((n, r) => n + r.length, 0);
  let pad = (512 - (length % 512)) % 512;
  if (pad > 0 && pad < 16) pad += 512;
  if (pad > 0) {
    // `LEN comment=...\n`: LEN's digits, a space, "comment=", the filler, the newline.
    const filler = pad - String(pad).length - 10;
    records.push(Buffer.from(`${pad} comment=${'-'.repeat(filler)}\n`));
  }
  return Buffer.concat(records);
}

/** The bytes of a pax extended header the records in `paxRecords` take at most, besides the path's and link's. */
export function xattrRecordsBound(xattrs: Xattrs): number {
  let bytes = 0;
  for (const [name, value] of xattrs) bytes += Buffer.byteLength(name) + value.length + XATTR_KEY.length + 16;
  return bytes + 1024; // the comment record's padding
}

/** The attribute bytes (names and values) of `xattrs`, which MAX_XATTR_BYTES bounds. */
export function xattrBytes(xattrs: Xattrs): number {
  let bytes = 0;
  for (const [name, value] of xattrs) bytes += Buffer.byteLength(name) + value.length;
  return bytes;
}

/**
 * An attribute's name in a pax keyword, as GNU tar writes it: `%` as `%25` and `=` as `%3D` (a keyword ends at the
 * first `=`); and back.
 */
function encodeXattrName(name: string): string {
  return name.replace(/%/g, '%25').replace(/=/g, '%3D');
}

function decodeXattrName(keyword: string): string {
  return keyword.replace(/%(25|3D)/gi, (_, code: string) => (code === '25' ? '%' : '='));
}

function malformed(why: string): LatchError {
  return new LatchError(`the backup holds a malformed pax extended header (${why}): refused, the restore stops`);
}

/** Every record of a pax extended header, strictly: any malformed record fails (tar-stream's parser stops silently). */
export function parsePaxRecords(block: Buffer): { key: string; value: Buffer }[] {
  const records: { key: string; value: Buffer }[] = [];
  let at = 0;
  // A block may end in NUL padding (some writers pad it); nothing else may follow the last record.
  while (at < block.length && block[at] !== 0) {
    const space = block.indexOf(0x20, at);
    const digits = space < 0 ? '' : block.subarray(at, space).toString('latin1');
    if (!/^[1-9][0-9]{0,7}$/.test(digits)) throw malformed(`a record at byte ${at} has no length`);
    const length = Number(digits);
    const end = at + length;
    if (end > block.length || block[end - 1] !== 0x0a) throw malformed(`the record at byte ${at} does not end where its length says`);
    const equals = block.indexOf(0x3d, space + 1);
    if (equals < 0 || equals >= end) throw malformed(`the record at byte ${at} has no '='`);
    const key = block.subarray(space + 1, equals).toString('utf8');
    if (key === '' || key.includes('\ufffd')) throw malformed(`the record at byte ${at} has an empty or non-UTF-8 keyword`);
    records.push({ key, value: Buffer.from(block.subarray(equals + 1, end - 1)) });
    at = end;
  }
  if (block.subarray(at).some((b) => b !== 0)) throw malformed('bytes follow its NUL padding');
  return records;
}

/** What a restore makes of an entry's pax records: the attributes it sets, and what it skips (in words). */
export interface EntryXattrs {
  kept: Xattrs;
  skipped: string[];
}

/**
 * The attributes of an entry's pax records that a restore sets, and the attribute records it skips (any other
 * attribute, any unknown keyword). Fails, as malformed, on an attribute without a name or with a NUL in it, a name
 * longer than the kernel's 255 bytes, one named twice, an ACL that is none, or more than MAX_XATTR_BYTES in all.
 */
export function entryXattrs(records: { key: string; value: Buffer }[]): EntryXattrs {
  const kept: Xattrs = new Map();
  const skipped: string[] = [];
  const seen = new Set<string>();
  let bytes = 0;
  for (const { key, value } of records) {
    if (!key.startsWith(XATTR_KEY)) {
      if (!PLAIN_PAX_KEYS.has(key)) skipped.push(`unknown record ${JSON.stringify(key.slice(0, 100))}`);
      continue;
    }
    const name = decodeXattrName(key.slice(XATTR_KEY.length));
    if (name === '' || name.includes('\0')) throw malformed('an attribute without a name, or with a NUL in it');
    if (Buffer.byteLength(name) > 255)
      throw malformed(`the attribute name ${JSON.stringify(name.slice(0, 100))}... is longer than 255 bytes`);
    if (seen.has(name)) throw malformed(`the attribute ${JSON.stringify(name.slice(0, 100))} is named twice`);
    seen.add(name);
    bytes += Buffer.byteLength(name) + value.length;
    if (bytes > MAX_XATTR_BYTES) throw malformed(`an entry's attributes take more than ${MAX_XATTR_BYTES} bytes`);
    if (!isKeptXattr(name)) {
      skipped.push(`attribute ${JSON.stringify(name.slice(0, 100))}`);
      continue;
    }
    if (name.startsWith('system.posix_acl_') && !isPosixAcl(value)) throw malformed(`${name} is not a POSIX ACL`);
    kept.set(name, value);
  }
  return { kept, skipped };
}

/** The kernel's xattr form of a POSIX ACL: version 2 (little-endian), then 8-byte entries (tag, permissions, id). */
function isPosixAcl(value: Buffer): boolean {
  return value.length >= 4 && (value.length - 4) % 8 === 0 && value.readUInt32LE(0) === 2;
}

// ---- the attr tools ------------------------------------------------------------------------------------------------

/** Paths a getfattr or setfattr child handles at most: each entry's attributes are at most 64 KiB (88 KiB in base64). */
export const XATTR_BATCH = 128;

/**
 * A path or name as getfattr and setfattr write and read it: a backslash, a newline, a carriage return, `=` and
 * every byte outside printable ASCII as a backslash and three octal digits (setfattr reads any such escape).
 */
function escapeForAttr(bytes: Buffer): string {
  let out = '';
  for (const b of bytes) {
    out += b < 0x21 || b > 0x7e || b === 0x5c || b === 0x3d ? `\\${b.toString(8).padStart(3, '0')}` : String.fromCharCode(b);
  }
  return out;
}

/** getfattr's escapes undone: `\ooo` is the byte. */
function unescapeFromAttr(text: string): string {
  const bytes: number[] = [];
  const raw = Buffer.from(text, 'utf8');
  for (let i = 0; i < raw.length; i++) {
    const octal = raw[i] === 0x5c ? /^[0-7]{3}/.exec(raw.subarray(i + 1, i + 4).toString('latin1')) : null;
    if (octal) {
      bytes.push(parseInt(octal[0], 8));
      i += 3;
    } else bytes.push(raw[i] as number);
  }
  return Buffer.from(bytes).toString('utf8');
}

/**
 * getfattr's dump (`-d -e base64 --absolute-names`) of `paths`, given in that order: each file's block names it and
 * lists `name=0s<base64>` lines. Every block must name the next of `paths` that has one, or the dump is refused.
 */
export function parseGetfattrDump(dump: string, paths: string[]): Map<string, Xattrs> {
  const found = new Map<string, Xattrs>();
  let next = 0;
  let current: Xattrs | undefined;
  for (const line of dump.split('\n')) {
    if (line === '') continue;
    if (line.startsWith('# file: ')) {
      const path = unescapeFromAttr(line.slice('# file: '.length));
      while (next < paths.length && paths[next] !== path) next++;
      if (next === paths.length) throw new LatchError(`getfattr named a file it was not asked for: ${JSON.stringify(path.slice(0, 200))}`);
      current = new Map();
      found.set(path, current);
      next++;
      continue;
    }
    const equals = line.indexOf('=');
    if (current === undefined || equals <= 0)
      throw new LatchError(`getfattr wrote a line it should not: ${JSON.stringify(line.slice(0, 200))}`);
    const name = unescapeFromAttr(line.slice(0, equals));
    const value = line.slice(equals + 1);
    if (!value.startsWith('0s') && value !== '') throw new LatchError(`getfattr wrote ${name} in another encoding than base64`);
    current.set(name, Buffer.from(value.slice(2), 'base64'));
  }
  return found;
}

/** setfattr's `--restore` input for `items`. */
export function formatSetfattrDump(items: { path: string; xattrs: Xattrs }[]): string {
  let dump = '';
  for (const { path, xattrs } of items) {
    dump += `# file: ${escapeForAttr(Buffer.from(path))}\n`;
    for (const [name, value] of xattrs) dump += `${escapeForAttr(Buffer.from(name))}=0s${value.toString('base64')}\n`;
    dump += '\n';
  }
  return dump;
}

/** A name as text for messages and results: as it is when UTF-8, else each byte outside printable ASCII as `\xNN`. */
export function shownName(name: Buffer): string {
  if (isUtf8(name)) return name.toString('utf8');
  let out = '';
  for (const b of name) out += b >= 0x20 && b < 0x7f && b !== 0x5c ? String.fromCharCode(b) : `\\x${b.toString(16).padStart(2, '0')}`;
  return out;
}

/**
 * The attr tools' arguments for `paths`: a UTF-8 path as it is (`followed` false: the tool is given `-h`), any other
 * as `/proc/<pid>/fd/<fd>` of a descriptor opened on it without following a link (`followed` true: the tool must
 * follow that magic link, to the entry itself). `body` runs with them; the descriptors are closed after it.
 */
async function withToolPaths<T>(paths: Buffer[], body: (args: { text: string; followed: boolean }[]) => Promise<T>): Promise<T> {
  const handles: FileHandle[] = [];
  try {
    const args: { text: string; followed: boolean }[] = [];
    for (const path of paths) {
      if (isUtf8(path)) {
        args.push({ text: path.toString('utf8'), followed: false });
        continue;
      }
      // O_NONBLOCK: nothing here is a FIFO (a backup skips them, a restore makes none), but an open must never wait.
      const handle = await open(path, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK).catch(
        (err: NodeJS.ErrnoException) => {
          throw err.code === 'ELOOP'
            ? new LatchError(`${JSON.stringify(shownName(path).slice(0, 200))} is a symbolic link: its attributes are not touched`)
            : err;
        },
      );
      handles.push(handle);
      args.push({ text: `/proc/${process.pid}/fd/${handle.fd}`, followed: true });
    }
    return await body(args);
  } finally {
    for (const handle of handles) await handle.close().catch(() => undefined);
  }
}

/** The attr tools, each child with the deadline `timeoutMs`. */
export function attrTools(timeoutMs: number): XattrIO {
  const getfattr = async (texts: string[], followed: boolean): Promise<Map<string, Xattrs>> => {
    if (texts.length === 0) return new Map();
    const args = [...(followed ? [] : ['-h']), '-d', '-e', 'base64', '--absolute-names', '-m', KEPT_PATTERN, '--', ...texts];
    return parseGetfattrDump((await run('getfattr', args, { timeoutMs })).stdout, texts);
  };
  const setfattr = async (items: { path: string; xattrs: Xattrs }[], followed: boolean): Promise<void> => {
    const noFollow = followed ? [] : ['-h'];
    // setfattr's --restore reads a name up to its first '=', escaped or not: a name with one is set on its own.
    const restorable = items
      .map(({ path, xattrs }) => ({ path, xattrs: new Map([...xattrs].filter(([name]) => !name.includes('='))) }))
      .filter((i) => i.xattrs.size > 0);
    if (restorable.length > 0) await run('setfattr', [...noFollow, '--restore=-'], { timeoutMs, input: formatSetfattrDump(restorable) });
    for (const { path, xattrs } of items) {
      for (const [name, value] of xattrs) {
        if (name.includes('='))
          await run('setfattr', [...noFollow, '-n', name, '-v', `0s${value.toString('base64')}`, '--', path], { timeoutMs });
      }
    }
  };
  return {
    async read(paths) {
      return withToolPaths(paths, async (args) => {
        const texts = (followed: boolean) => args.filter((a) => a.followed === followed).map((a) => a.text);
        const found = new Map([...(await getfattr(texts(false), false)), ...(await getfattr(texts(true), true))]);
        return args.map((a) => found.get(a.text));
      });
    },
    async write(items) {
      await withToolPaths(
        items.map((i) => i.path),
        async (args) => {
          const named = args.map((a, i) => ({ path: a.text, followed: a.followed, xattrs: (items[i] as { xattrs: Xattrs }).xattrs }));
          for (const followed of [false, true])
            await setfattr(
              named.filter((n) => n.followed === followed),
              followed,
            );
        },
      );
    },
  };
}

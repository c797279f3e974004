// The embedded `file` store: one directory per key, one file per revision, compare-and-swap by exclusive link.
// Layout, the writer's steps and why garbage collection cannot resurrect a revision: docs/ledger.md, "The file store".
import {
  chmodSync,
  closeSync,
  fchmodSync,
  fsyncSync,
  linkSync,
  lstatSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  unlinkSync,
  watch as watchPath,
  writeFileSync,
  type Dirent,
  type FSWatcher,
} from 'node:fs';
import type * as NodeFs from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { ConflictError, DamagedDocumentError, LatchError, StoreError } from '../errors.js';
import { tempTag } from '../atomic-file.js';
import { checkKind, checkRevision, encodeValue } from './checks.js';
import { parseKey, type Store, type Versioned } from './types.js';
import { ChangeSignal } from './watch.js';

/** The few file system calls the store makes; tests pass a wrapper to count or delay them. */
export type FileStoreFs = {
  open(path: string, flags: string, mode?: number): Promise<StoreFileHandle>;
  readdir: (typeof NodeFs)['readdir'];
} & Pick<typeof NodeFs, 'readFile' | 'link' | 'unlink' | 'mkdir' | 'chmod' | 'lstat'>;

/** What the store does with an open file: write a revision, sync it (or a directory), close it. */
export type StoreFileHandle = Pick<NodeFs.FileHandle, 'writeFile' | 'sync' | 'chmod' | 'close'>;

/**
 * Node's file system calls, made synchronously behind fs/promises' shape. A driver call is a short process that
 * waits for each call anyway, and its first asynchronous one starts libuv's thread pool (four threads): measured at
 * 5 ms of an `isattached`, whose whole job is two reads, and 3-5 ms of each `attach` and `detach`, which write. The
 * files are a few KiB and a write's fsyncs are of one small file and its directory, so a long-running process
 * (latch agent) is not held up by them much longer than by its own await.
 */
const inline: FileStoreFs = {
  open: (path, flags, mode) => afterAwait(() => inlineHandle(openSync(path, flags, mode))),
  readdir: ((path: string, options?: { withFileTypes: true }) =>
    afterAwait(() => (options ? readdirSync(path, options) : readdirSync(path)))) as unknown as FileStoreFs['readdir'],
  readFile: ((path: string, encoding: BufferEncoding) =>
    afterAwait(() => readFileSync(path, encoding))) as unknown as FileStoreFs['readFile'],
  link: (from, to) => afterAwait(() => linkSync(from as string, to as string)),
  unlink: (path) => afterAwait(() => unlinkSync(path as string)),
  mkdir: ((path: string, options: { recursive?: boolean; mode?: number }) =>
    afterAwait(() => mkdirSync(path, options))) as unknown as FileStoreFs['mkdir'],
  chmod: (path, mode) => afterAwait(() => chmodSync(path as string, mode)),
  lstat: ((path: string) => afterAwait(() => lstatSync(path))) as unknown as FileStoreFs['lstat'],
};

function inlineHandle(fd: number): StoreFileHandle {
  return {
    writeFile: (text) => afterAwait(() => writeFileSync(fd, text as string, 'utf8')),
    sync: () => afterAwait(() => fsyncSync(fd)),
    chmod: (mode) => afterAwait(() => fchmodSync(fd, mode)),
    close: () => afterAwait(() => closeSync(fd)),
  };
}

/**
 * A promise of `call()`'s result that runs it one microtask later, once the caller awaits it. A call that fails
 * (ENOENT, which every lookup of an absent key meets) then rejects a promise that already has its handler: one
 * rejected before it is awaited, as an async function's would be, sets off Node's unhandled-rejection tracking
 * (six of Node's functions to compile in every call that meets it).
 */
function afterAwait<T>(call: () => T): Promise<T> {
  return Promise.resolve().then(call);
}

export interface FileStoreOptions {
  fs?: FileStoreFs;
}

const DIR_MODE = 0o700;
const FILE_MODE = 0o600;
const TEMP_PREFIX = '.tmp-';
/** A temp file this old belongs to a writer that died or stalled; it is removed, and its writer's link fails. */
export const STALE_TEMP_MS = 60_000;
const REVISION_FILE = /^([1-9][0-9]{0,15})\.json$/;
/** How often a read starts over when the revision it picked was collected under it. */
const READ_ATTEMPTS = 8;

interface Current {
  /** The highest revision file's number, tombstones included; 0 when the key has no revision file. */
  revision: number;
  /** True when the key has no visible value: no revision file, or the highest one is a tombstone. */
  absent: boolean;
  value?: unknown;
}

type Doc = { deleted: false; value: unknown } | { deleted: true };

function code(err: unknown): string | undefined {
  return (err as NodeJS.ErrnoException | undefined)?.code;
}

function reason(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

function ioError(what: string, err: unknown): StoreError {
  return new StoreError(`file store: cannot ${what}: ${reason(err)}`, { cause: err });
}

export class FileStore implements Store {
  readonly kind = 'file' as const;
  readonly root: string;
  private readonly fs: FileStoreFs;

  constructor(stateDir: string, options: FileStoreOptions = {}) {
    this.root = resolve(stateDir);
    this.fs = options.fs ?? inline;
  }

  async get(key: string): Promise<Versioned | undefined> {
    const { dir } = this.locate(key);
    const cur = await this.current(dir);
    return cur.absent ? undefined : { value: cur.value, revision: cur.revision };
  }

  async put(key: string, value: unknown, expectedRevision: number): Promise<number> {
    const where = this.locate(key);
    checkRevision('file', expectedRevision);
    encodeValue('file', key, value);
    return this.commit(where, expectedRevision, { deleted: false, value });
  }

  async delete(key: string, expectedRevision: number): Promise<void> {
    const where = this.locate(key);
    checkRevision('file', expectedRevision);
    if (expectedRevision === 0) {
      // "Must not exist": nothing to write either way.
      const cur = await this.current(where.dir);
      if (!cur.absent) throw new ConflictError(`file store: cannot delete ${key}: it exists (revision ${cur.revision})`);
      return;
    }
    await this.commit(where, expectedRevision, { deleted: true });
  }

  async list(kind: string): Promise<string[]> {
    checkKind('file', kind);
    const kindDir = join(this.root, kind);
    let entries: Dirent[];
    try {
      entries = await this.fs.readdir(kindDir, { withFileTypes: true });
    } catch (err) {
      if (code(err) === 'ENOENT') return [];
      throw ioError(`list directory ${kindDir}`, err);
    }
    const names: string[] = [];
    for (const entry of entries) {
      if (!entry.isDirectory()) continue;
      const name = entry.name;
      try {
        parseKey(`${kind}/${name}`);
      } catch {
        continue; // not one of ours (an editor's backup, lost+found...)
      }
      let cur;
      try {
        cur = await this.current(join(kindDir, name));
      } catch (err) {
        // Listed all the same: reading the key says what is wrong with it, and the other keys are still listed.
        if (!(err instanceof DamagedDocumentError)) throw err;
        names.push(name);
        continue;
      }
      if (!cur.absent) names.push(name);
    }
    return names.sort();
  }

  /**
   * inotify (fs.watch) on the kind's directory, for keys that appear, and on each key's directory, where a write
   * links its new revision file: every `<n>.json` that appears or goes yields. Temp files are ignored.
   */
  async *watch(kind: string, signal: AbortSignal): AsyncIterable<void> {
    checkKind('file', kind);
    const changes = new ChangeSignal(signal);
    const kindDir = join(this.root, kind);
    const watchers = new Map<string, FSWatcher>();
    const follow = (dir: string, onEvent: (name: string | null) => void) => {
      if (signal.aborted || watchers.has(dir)) return;
      try {
        const w = watchPath(dir, { persistent: false }, (_event, name) => onEvent(name === null ? null : String(name)));
        // The directory went away (or inotify failed): stop following it; the reader reads again.
        w.on('error', () => {
          w.close();
          watchers.delete(dir);
          changes.notify();
        });
        watchers.set(dir, w);
      } catch {
        // It vanished before we could follow it: nothing to watch there.
      }
    };
    // Set up synchronously, so that a change made once the first next() has returned its promise is seen.
    const followKeys = () => {
      let entries: Dirent[] = [];
      try {
        entries = readdirSync(kindDir, { withFileTypes: true });
      } catch {
        // The kind's directory went away: its own watcher's error handler notifies.
      }
      for (const entry of entries) {
        if (!entry.isDirectory() || entry.name.startsWith('.')) continue;
        follow(join(kindDir, entry.name), (name) => {
          if (name === null || REVISION_FILE.test(name)) changes.notify();
        });
      }
    };
    try {
      // Made now (0700, as a writer makes it) so that a store nobody wrote to yet can be watched.
      try {
        mkdirSync(kindDir, { recursive: true, mode: DIR_MODE });
      } catch (err) {
        throw ioError(`create state directory ${kindDir}`, err);
      }
      follow(kindDir, () => {
        // A key's first write makes its directory: follow it, and read again.
        changes.notify();
        followKeys();
      });
      followKeys();
      yield* changes;
    } finally {
      for (const w of watchers.values()) w.close();
      watchers.clear();
    }
  }

  async close(): Promise<void> {}

  private locate(key: string): { key: string; kindDir: string; dir: string } {
    let parsed: { kind: string; name: string };
    try {
      parsed = parseKey(key);
    } catch (err) {
      throw new LatchError(`file store: ${reason(err)}`, { cause: err });
    }
    const kindDir = join(this.root, parsed.kind);
    return { key, kindDir, dir: join(kindDir, parsed.name) };
  }

  /** Reads the key's highest revision; starts over if a concurrent collector removed it under us. */
  private async current(dir: string): Promise<Current> {
    let lastErr: unknown;
    for (let attempt = 0; attempt < READ_ATTEMPTS; attempt++) {
      let entries: string[];
      try {
        entries = await this.fs.readdir(dir);
      } catch (err) {
        if (code(err) === 'ENOENT') return { revision: 0, absent: true };
        throw ioError(`list directory ${dir}`, err);
      }
      let revision = 0;
      for (const entry of entries) {
        const m = REVISION_FILE.exec(entry);
        if (m) revision = Math.max(revision, Number(m[1]));
      }
      if (revision === 0) return { revision: 0, absent: true };
      const file = join(dir, `${revision}.json`);
      let text: string;
      try {
        text = await this.fs.readFile(file, 'utf8');
      } catch (err) {
        if (code(err) === 'ENOENT') {
          lastErr = err;
          continue;
        }
        throw ioError(`read state file ${file}`, err);
      }
      const doc = parseDocument(text, file, revision);
      return doc.deleted ? { revision, absent: true } : { revision, absent: false, value: doc.value };
    }
    throw new StoreError(
      `file store: the newest revision in ${dir} kept disappearing while being read (${READ_ATTEMPTS} attempts); ` +
        `something else is writing or cleaning this directory`,
      { cause: lastErr },
    );
  }

  /** The compare-and-swap shared by put and delete; returns the new revision. */
  private async commit(where: { key: string; kindDir: string; dir: string }, expected: number, doc: Doc): Promise<number> {
    const { key, dir } = where;
    // The temp file must exist before the current revision is read: see the comment at the top.
    const tempPath = join(dir, `${TEMP_PREFIX}${process.pid}-${tempTag()}`);
    let handle: StoreFileHandle | undefined = await this.createTemp(where, tempPath);
    let next: number;
    try {
      const cur = await this.current(dir);
      const visible = cur.absent ? 0 : cur.revision;
      if (visible !== expected) {
        const now = cur.absent ? 'it does not exist' : `it is at revision ${cur.revision}`;
        throw new ConflictError(`file store: ${key} changed: expected revision ${expected} but ${now}`);
      }
      // After a tombstone the next revision still counts up from it, so revisions are never reused.
      next = cur.revision + 1;
      const body = doc.deleted ? { revision: next, deleted: true } : { revision: next, deleted: false, value: doc.value };
      try {
        await handle.writeFile(`${JSON.stringify(body)}\n`, 'utf8');
        await handle.sync();
      } catch (err) {
        throw ioError(`write temp file ${tempPath}`, err);
      }
      const closing = handle;
      handle = undefined;
      try {
        await closing.close();
      } catch (err) {
        throw ioError(`close temp file ${tempPath}`, err);
      }
      const target = join(dir, `${next}.json`);
      try {
        await this.fs.link(tempPath, target);
      } catch (err) {
        if (code(err) === 'EEXIST') {
          throw new ConflictError(`file store: ${key} changed: revision ${next} was written by another writer first`, {
            cause: err,
          });
        }
        if (code(err) === 'ENOENT') {
          throw new ConflictError(
            `file store: ${key}: this write stalled for over ${STALE_TEMP_MS / 1000}s and its temp file was cleaned up; ` +
              `read again and retry`,
            { cause: err },
          );
        }
        throw ioError(`create state file ${target}`, err);
      }
    } finally {
      if (handle) await handle.close().catch(() => {});
      await this.fs.unlink(tempPath).catch(() => {});
    }
    await this.syncDir(dir);
    await this.collect(dir, next);
    return next;
  }

  /** Opens a new temp file in the key's directory, creating the directories on the key's first write. */
  private async createTemp(where: { kindDir: string; dir: string }, tempPath: string): Promise<StoreFileHandle> {
    for (let attempt = 0; ; attempt++) {
      let handle: StoreFileHandle;
      try {
        handle = await this.fs.open(tempPath, 'wx', FILE_MODE);
      } catch (err) {
        if (code(err) === 'ENOENT' && attempt === 0) {
          await this.makeDirs(where);
          continue;
        }
        throw ioError(`create temp file ${tempPath}`, err);
      }
      try {
        await handle.chmod(FILE_MODE); // open's mode went through the umask
        return handle;
      } catch (err) {
        await handle.close().catch(() => {});
        await this.fs.unlink(tempPath).catch(() => {});
        throw ioError(`set mode 0600 on ${tempPath}`, err);
      }
    }
  }

  private async makeDirs(where: { kindDir: string; dir: string }): Promise<void> {
    try {
      const first = await this.fs.mkdir(this.root, { recursive: true, mode: DIR_MODE });
      if (first !== undefined) {
        // Set every directory we created to 0700 explicitly, whatever the umask did.
        const created = [this.root];
        for (let p = resolve(this.root, '..'); p.startsWith(first) && p !== resolve(p, '..'); p = resolve(p, '..')) {
          created.push(p);
        }
        for (const p of created) await this.fs.chmod(p, DIR_MODE);
        await this.syncDir(resolve(first, '..'));
      }
    } catch (err) {
      throw ioError(`create state directory ${this.root}`, err);
    }
    for (const [dir, parent] of [
      [where.kindDir, this.root],
      [where.dir, where.kindDir],
    ] as const) {
      try {
        await this.fs.mkdir(dir, { mode: DIR_MODE });
      } catch (err) {
        if (code(err) === 'EEXIST') continue;
        throw ioError(`create state directory ${dir}`, err);
      }
      try {
        await this.fs.chmod(dir, DIR_MODE);
      } catch (err) {
        throw ioError(`set mode 0700 on ${dir}`, err);
      }
      await this.syncDir(parent);
    }
  }

  private async syncDir(dir: string): Promise<void> {
    let handle: StoreFileHandle | undefined;
    try {
      handle = await this.fs.open(dir, 'r');
      await handle.sync();
    } catch (err) {
      throw ioError(`fsync directory ${dir}`, err);
    } finally {
      await handle?.close().catch(() => {});
    }
  }

  /**
   * Best effort, after a successful commit of `revision`: removes revision files older than the previous one and
   * stale temp files. Leaves the revision files alone while another writer's fresh temp file is present.
   */
  private async collect(dir: string, revision: number): Promise<void> {
    let entries: string[];
    try {
      entries = await this.fs.readdir(dir);
    } catch {
      return;
    }
    let busy = false;
    const old: number[] = [];
    for (const entry of entries) {
      if (entry.startsWith(TEMP_PREFIX)) {
        const path = join(dir, entry);
        try {
          const st = await this.fs.lstat(path);
          if (Date.now() - st.mtimeMs > STALE_TEMP_MS) await this.fs.unlink(path);
          else busy = true;
        } catch (err) {
          if (code(err) !== 'ENOENT') busy = true;
        }
        continue;
      }
      const m = REVISION_FILE.exec(entry);
      if (m && Number(m[1]) < revision - 1) old.push(Number(m[1]));
    }
    if (busy) return;
    old.sort((a, b) => a - b);
    for (const r of old) await this.fs.unlink(join(dir, `${r}.json`)).catch(() => {});
  }
}

function parseDocument(text: string, file: string, revision: number): Doc {
  const corrupt = (why: string, cause?: unknown) =>
    new DamagedDocumentError(
      `file store: state file ${file} is corrupt (${why}); inspect it: moving it away makes the previous revision ` + `current again`,
      { cause },
    );
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (err) {
    throw corrupt(text.length === 0 ? 'it is empty' : `not valid JSON: ${reason(err)}`, err);
  }
  if (typeof doc !== 'object' || doc === null || Array.isArray(doc)) throw corrupt('not a JSON object');
  const d = doc as Record<string, unknown>;
  if (d.revision !== revision) {
    throw corrupt(`it says revision ${JSON.stringify(d.revision)} but its name says ${revision}`);
  }
  if (d.deleted === true) return { deleted: true };
  if (d.deleted !== false) throw corrupt('"deleted" is not a boolean');
  if (!('value' in d)) throw corrupt('it has no "value"');
  return { deleted: false, value: d.value };
}

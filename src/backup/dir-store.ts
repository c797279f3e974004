// A directory target's store: keys are paths below the directory (layout.ts), each object a file written atomically
// (temp file, fsync, rename: files.ts). Chunk files are renamed into place without a directory fsync each; `flush`
// fsyncs the directories they went into at once, before a manifest that needs them is published.
import { constants } from 'node:fs';
import { mkdir, open, stat, unlink } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { leftoverOf, syncDir, writeFileAtomic } from '../atomic-file.js';
import { readdirOrEmpty, removeTempFiles, tightenTarget } from './files.js';
import { BACKUPS, CHUNKS, checkDirTarget, type DirTarget } from './layout.js';
import type { GetResult, StoredObject, TargetStore } from './target-store.js';

export class DirStore implements TargetStore {
  private readonly touched = new Set<string>();

  constructor(private readonly target: DirTarget) {}

  private path(key: string): string {
    return join(this.target.path, key);
  }

  check(): Promise<void> {
    return checkDirTarget(this.target);
  }

  async put(key: string, data: Buffer | string): Promise<void> {
    const path = this.path(key);
    const dir = dirname(path);
    // Private: a chunk is a piece of a volume (layout.ts).
    await mkdir(dir, { recursive: true, mode: 0o700 });
    if (key.startsWith(CHUNKS)) {
      // Without a directory fsync per chunk: flush() does them at once (verify finds a chunk a power loss took).
      await writeFileAtomic(path, data, { sync: 'file' });
      this.touched.add(dir);
    } else {
      await writeFileAtomic(path, data);
    }
  }

  async get(key: string, maxBytes: number): Promise<GetResult> {
    let handle;
    try {
      handle = await open(this.path(key), constants.O_RDONLY | constants.O_NOFOLLOW);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return { found: false };
      throw err;
    }
    try {
      const { size } = await handle.stat();
      if (size > maxBytes) return { found: true, tooLarge: size };
      // Read into a buffer of the size found (one byte more, to see a file that grew since): never more than that.
      const buffer = Buffer.allocUnsafe(size + 1);
      let done = 0;
      while (done < buffer.length) {
        const { bytesRead } = await handle.read(buffer, done, buffer.length - done, done);
        if (bytesRead === 0) break;
        done += bytesRead;
      }
      if (done > size) return { found: true, tooLarge: done };
      return { found: true, data: buffer.subarray(0, done) };
    } finally {
      await handle.close();
    }
  }

  async exists(key: string): Promise<boolean> {
    try {
      await stat(this.path(key));
      return true;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return false;
      throw err;
    }
  }

  /** Files below chunks/<shard>/ or in backups/, without the temp files of writers (names starting with "."). */
  async list(prefix: string): Promise<StoredObject[]> {
    const dirs = prefix === CHUNKS ? (await readdirOrEmpty(this.path(CHUNKS))).map((shard) => `${CHUNKS}${shard}/`) : [prefix];
    const found: StoredObject[] = [];
    for (const dir of dirs) {
      for (const name of await readdirOrEmpty(this.path(dir))) {
        if (name.startsWith('.') || leftoverOf(name) !== undefined) continue;
        found.push({ key: `${dir}${name}` });
      }
    }
    return found;
  }

  async delete(key: string): Promise<number | undefined> {
    const path = this.path(key);
    const size = (await stat(path).catch(() => undefined))?.size;
    try {
      await unlink(path);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
      return undefined;
    }
    this.touched.add(dirname(path));
    return size;
  }

  async flush(): Promise<void> {
    const dirs = [...this.touched];
    this.touched.clear();
    // Each fsync waits for a journal commit, and concurrent ones share it.
    await Promise.all(dirs.map((dir) => syncDir(dir)));
    if (dirs.some((dir) => dir.startsWith(this.path(CHUNKS)))) await syncDir(this.path(CHUNKS));
  }

  async tidy(): Promise<number> {
    await tightenTarget(this.target);
    let removed = await removeTempFiles(this.path(BACKUPS));
    for (const shard of await readdirOrEmpty(this.path(CHUNKS))) removed += await removeTempFiles(this.path(`${CHUNKS}${shard}`));
    return removed;
  }
}

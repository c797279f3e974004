// What the backup engine needs of the place a target's objects live, so that one engine (chunks, manifests, dedup,
// incremental, verify, gc, delete) serves a directory (dir-store.ts: the layout of layout.ts, files) and an S3 bucket
// (s3-store.ts: the same keys below a prefix, objects). The lock has its own primitives (lock.ts): each store's
// conditional create and replace.
import type { BackupTarget } from './layout.js';

export interface StoredObject {
  /** Relative to the target, e.g. "chunks/ab/ab12...". */
  key: string;
  /** Its size, where listing tells it (S3 does; a directory would need a stat per file). */
  size?: number;
}

export type GetResult = { found: true; data: Buffer } | { found: false } | { found: true; tooLarge: number };

export interface TargetStore {
  /** Checks that the target can be used at all (exists, reachable, credentials accepted), before anything is written. */
  check(): Promise<void>;
  /**
   * Creates or replaces `key` whole: a reader sees the old object or the whole new one, never a part. Durability may
   * wait for `flush` (a directory's fsyncs).
   */
  put(key: string, data: Buffer | string): Promise<void>;
  /** Its bytes, or not found; one of more than `maxBytes` is not read (tooLarge: its size). */
  get(key: string, maxBytes: number): Promise<GetResult>;
  exists(key: string): Promise<boolean>;
  /** Every object whose key starts with `prefix` ("chunks/", "backups/"). */
  list(prefix: string): Promise<StoredObject[]>;
  /** Removes `key`; one that is already gone is fine. Returns the bytes freed where known. */
  delete(key: string): Promise<number | undefined>;
  /** Makes everything put so far durable (before a manifest that needs it is published). */
  flush(): Promise<void>;
  /**
   * What a writer (holding the lock) does first: a directory's permissions tightened and dead writers' temp files
   * removed. Returns how many leftovers it removed.
   */
  tidy(): Promise<number>;
}

const stores = new WeakMap<BackupTarget, Promise<TargetStore>>();

/** The target's store (one per target object: an S3 client and its connections are made once). */
export function storeOf(target: BackupTarget): Promise<TargetStore> {
  let store = stores.get(target);
  if (store === undefined) {
    // The S3 client library is loaded only by backups to S3 (never by a driver call, nor by a directory target).
    store =
      target.type === 'dir'
        ? import('./dir-store.js').then(({ DirStore }) => new DirStore(target))
        : import('./s3-store.js').then(({ openS3Store }) => openS3Store(target));
    store.catch(() => stores.delete(target));
    stores.set(target, store);
  }
  return store;
}

/** Refuses a target that cannot be used, before anything is read or written (the directory is missing, S3 refuses). */
export async function checkTarget(target: BackupTarget): Promise<void> {
  await (await storeOf(target)).check();
}

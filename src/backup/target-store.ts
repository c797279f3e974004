// What the backup engine needs of the place a target's objects live, so that one engine (chunks, manifests, dedup,
// incremental, verify, gc, delete) serves a directory (dir-store.ts: the layout of layout.ts, files) and an S3 bucket
// (s3-store.ts: the same keys below a prefix, objects). The lock has its own primitives (lock.ts, s3-lock.ts): each
// store's conditional create and replace. store.ts opens the one a target needs.

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

// The ledger's storage: a small key-value interface with compare-and-swap on a revision.
// Implementations: `file` (embedded default, one host) and `etcd` (a cluster). The ledger above it knows nothing of either.

/** A stored value and the revision it was read at. Revisions of one key only ever grow, and are never reused. */
export interface Versioned<T = unknown> {
  value: T;
  revision: number;
}

/**
 * Keys are `<kind>/<name>` where kind is lower-case letters and name is a checked volume or PV name
 * (see names.ts), e.g. `volumes/pvc-1234`, `pvs/pvc-1234`.
 */
export interface Store {
  readonly kind: 'file' | 'etcd';
  /** The current value, or undefined when the key does not exist (or was deleted). */
  get(key: string): Promise<Versioned | undefined>;
  /**
   * Writes `value` iff the key's current revision is `expectedRevision` (0: the key must not exist).
   * Returns the new revision. Throws ConflictError when another writer got there first; StoreError on I/O failure.
   * Either the whole new value is visible afterwards, or the old one: never a torn write, even after SIGKILL or power loss.
   */
  put(key: string, value: unknown, expectedRevision: number): Promise<number>;
  /** Deletes iff the current revision is `expectedRevision`; ConflictError otherwise. Deleting a missing key with 0 is a no-op. */
  delete(key: string, expectedRevision: number): Promise<void>;
  /** Names (the part after `<kind>/`) of the existing keys of one kind, sorted. Admin use only: may be O(n). */
  list(kind: string): Promise<string[]>;
  /**
   * A cheap change signal for one kind of keys (the node agent wakes on it): yields after keys of `kind` may have
   * changed, once per burst (coalesced), and ends when `signal` aborts. It says "read again", never what changed; it
   * may yield with nothing changed, and may yield late or miss a change while it reconnects (it yields once after
   * reconnecting), so a reader still polls now and then. Optional: a store without it is polled only.
   */
  watch?(kind: string, signal: AbortSignal): AsyncIterable<void>;
  close(): Promise<void>;
}

const KEY = /^([a-z]+)\/([a-z0-9]([a-z0-9._-]*[a-z0-9])?)$/;

/** Splits and checks a key; every store calls this first so no key can escape its directory or prefix. */
export function parseKey(key: string): { kind: string; name: string } {
  const [, kind, name] = KEY.exec(key) ?? [];
  if (kind === undefined || name === undefined || name.includes('..') || name.length > 253) {
    throw new Error(`invalid store key ${JSON.stringify(key)}`);
  }
  return { kind, name };
}

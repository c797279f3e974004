// The `etcd` store: the ledger in an etcd v3 cluster over its JSON gateway, so the controller and every node share
// one truth. Revisions, compare-and-swap, deadlines and retries: docs/ledger.md, "The etcd store". The requests
// themselves, their failover and retries, are the client's (etcd-client.ts).
import { ConflictError, DamagedDocumentError, LatchError, StoreError, errorMessage } from '../errors.js';
import { checkKind, checkRevision, encodeValue } from './checks.js';
import { EtcdClient, type EtcdClientOptions, type KeyValue, type RangeResponse, type TxnResponse } from './etcd-client.js';
import { parseKey, type Store, type Versioned } from './types.js';
import { ChangeSignal } from './watch.js';

export { EtcdUnavailableError } from './etcd-client.js';

export interface EtcdStoreOptions extends EtcdClientOptions {
  /** Prepended to every key; a missing trailing "/" is added. Default "/latch/". */
  prefix?: string;
  /** Keys per page when listing (tests use a small one). Default 1000. */
  listPageSize?: number;
}

function b64(text: string | Buffer): string {
  return (typeof text === 'string' ? Buffer.from(text, 'utf8') : text).toString('base64');
}

/** The smallest key greater than every key starting with `prefix` (etcd's range_end for a prefix). */
function prefixEnd(prefix: Buffer): Buffer {
  const end = Buffer.from(prefix);
  for (let i = end.length - 1; i >= 0; i--) {
    const byte = end.readUInt8(i);
    if (byte < 0xff) {
      end[i] = byte + 1;
      return end.subarray(0, i + 1);
    }
  }
  return Buffer.from([0]); // the whole key space
}

export class EtcdStore implements Store {
  readonly kind = 'etcd' as const;
  readonly prefix: string;
  readonly timeoutMs: number;
  private readonly listPageSize: number;
  private readonly client: EtcdClient;

  constructor(options: EtcdStoreOptions) {
    this.client = new EtcdClient(options);
    this.timeoutMs = this.client.timeoutMs;
    const prefix = options.prefix ?? '/latch/';
    this.prefix = prefix.endsWith('/') ? prefix : `${prefix}/`;
    this.listPageSize = options.listPageSize ?? 1000;
  }

  async get(key: string): Promise<Versioned | undefined> {
    const full = this.keyOf(key);
    const { body } = await this.client.call<RangeResponse>('/v3/kv/range', { key: b64(full) }, `read ${key}`, false);
    const kv = body.kvs?.[0];
    return kv === undefined ? undefined : { value: this.decode(kv, key), revision: revisionOf(kv.mod_revision, key) };
  }

  async put(key: string, value: unknown, expectedRevision: number): Promise<number> {
    const full = this.keyOf(key);
    checkRevision('etcd', expectedRevision);
    const text = encodeValue('etcd', key, value);
    const k = b64(full);
    const v = b64(text);
    const { body, ambiguous } = await this.client.call<TxnResponse>(
      '/v3/kv/txn',
      {
        compare: [compareRevision(k, expectedRevision)],
        success: [{ request_put: { key: k, value: v } }],
        failure: [{ request_range: { key: k } }],
      },
      `write ${key}`,
      true,
    );
    if (body.succeeded) return revisionOf(body.header?.revision, key);
    const current = body.responses?.[0]?.response_range?.kvs?.[0];
    // Our first attempt's answer was lost but it was applied: the key holds exactly what we wrote.
    if (ambiguous && current !== undefined && (current.value ?? '') === v) return revisionOf(current.mod_revision, key);
    throw this.conflict(key, expectedRevision, current);
  }

  async delete(key: string, expectedRevision: number): Promise<void> {
    const full = this.keyOf(key);
    checkRevision('etcd', expectedRevision);
    const k = b64(full);
    if (expectedRevision === 0) {
      // "Must not exist": nothing to write either way.
      const { body } = await this.client.call<RangeResponse>('/v3/kv/range', { key: k, keys_only: true }, `read ${key}`, false);
      const kv = body.kvs?.[0];
      if (kv !== undefined) throw this.conflict(key, 0, kv);
      return;
    }
    const { body, ambiguous } = await this.client.call<TxnResponse>(
      '/v3/kv/txn',
      {
        compare: [compareRevision(k, expectedRevision)],
        success: [{ request_delete_range: { key: k } }],
        failure: [{ request_range: { key: k, keys_only: true } }],
      },
      `delete ${key}`,
      true,
    );
    if (body.succeeded) return;
    const current = body.responses?.[0]?.response_range?.kvs?.[0];
    // Our first attempt's answer was lost but it was applied: the key is gone.
    if (ambiguous && current === undefined) return;
    throw this.conflict(key, expectedRevision, current);
  }

  async list(kind: string): Promise<string[]> {
    checkKind('etcd', kind);
    const start = Buffer.from(`${this.prefix}${kind}/`, 'utf8');
    const names: string[] = [];
    let from = start;
    const end = prefixEnd(start);
    // Page through the keys, so a huge ledger never makes one huge answer.
    for (;;) {
      const { body } = await this.client.call<RangeResponse>(
        '/v3/kv/range',
        { key: b64(from), range_end: b64(end), keys_only: true, limit: this.listPageSize },
        `list ${kind}`,
        false,
      );
      const kvs = body.kvs ?? [];
      for (const kv of kvs) {
        const name = Buffer.from(kv.key ?? '', 'base64')
          .subarray(start.length)
          .toString('utf8');
        try {
          parseKey(`${kind}/${name}`);
        } catch {
          continue; // not one of ours (written by hand under our prefix)
        }
        names.push(name);
      }
      const last = kvs.at(-1);
      if (last === undefined || !body.more) break;
      // The next page starts just after the last key of this one.
      from = Buffer.concat([Buffer.from(last.key ?? '', 'base64'), Buffer.from([0])]);
    }
    return names.sort();
  }

  /**
   * etcd's watch (the gateway's streaming /v3/watch) on the kind's key range: every event yields, and so does every
   * stream that breaks (EtcdClient.watch opens the next), since changes may have been missed meanwhile. Never fails:
   * while etcd is away it keeps trying.
   */
  async *watch(kind: string, signal: AbortSignal): AsyncIterable<void> {
    checkKind('etcd', kind);
    const start = Buffer.from(`${this.prefix}${kind}/`, 'utf8');
    const request = JSON.stringify({ create_request: { key: b64(start), range_end: b64(prefixEnd(start)) } });
    // Ends the streams when the reader stops early (breaks out of its loop) as well as on abort.
    const local = new AbortController();
    const stop = AbortSignal.any([signal, local.signal]);
    const changes = new ChangeSignal(stop);
    const streams = this.client.watch(request, stop, () => changes.notify());
    try {
      yield* changes;
    } finally {
      local.abort();
      await streams;
    }
  }

  async close(): Promise<void> {
    this.client.close();
  }

  private keyOf(key: string): string {
    try {
      parseKey(key);
    } catch (err) {
      throw new LatchError(`etcd store: ${errorMessage(err)}`, { cause: err });
    }
    return this.prefix + key;
  }

  private decode(kv: KeyValue, key: string): unknown {
    const text = Buffer.from(kv.value ?? '', 'base64').toString('utf8');
    try {
      return JSON.parse(text);
    } catch (err) {
      throw new DamagedDocumentError(
        `etcd store: the value of ${this.prefix}${key} is not JSON (${errorMessage(err)}); something other than latch wrote it`,
        { cause: err },
      );
    }
  }

  private conflict(key: string, expected: number, current: KeyValue | undefined): ConflictError {
    const now = current === undefined ? 'it does not exist' : `it is at revision ${current.mod_revision}`;
    const want = expected === 0 ? 'expected it not to exist' : `expected revision ${expected}`;
    return new ConflictError(`etcd store: ${key} changed: ${want} but ${now}`);
  }
}

function revisionOf(text: string | undefined, key: string): number {
  const revision = Number(text);
  if (!Number.isSafeInteger(revision) || revision <= 0) {
    throw new StoreError(`etcd store: etcd answered an invalid revision ${JSON.stringify(text)} for ${key}`);
  }
  return revision;
}

function compareRevision(key: string, expectedRevision: number): Record<string, unknown> {
  return expectedRevision === 0
    ? { key, target: 'CREATE', result: 'EQUAL', create_revision: '0' }
    : { key, target: 'MOD', result: 'EQUAL', mod_revision: String(expectedRevision) };
}

// The etcd v3 JSON gateway's client: POSTs with failover across the endpoints and retries until a deadline, and watch
// streams that reopen themselves. What the answers mean for the ledger is the store's (etcd.ts).
import { readFileSync } from 'node:fs';
import * as http from 'node:http';
import * as https from 'node:https';
import { setTimeout as sleep } from 'node:timers/promises';
import { LatchError, StoreError } from '../errors.js';

export interface EtcdClientOptions {
  endpoints: string[];
  /** Deadline of one store operation, across every endpoint and retry. Default 5000. */
  timeoutMs?: number;
  /** PEM files: `ca` to verify the members, `cert` and `key` for client-certificate authentication. */
  tls?: { ca?: string; cert?: string; key?: string };
}

/** etcd could not be reached, or answered that it cannot serve (no leader, lost quorum, timed out). */
export class EtcdUnavailableError extends StoreError {
  override name = 'EtcdUnavailableError';
}

/** The largest answer we accept (a list of many keys is far smaller). */
const MAX_RESPONSE_BYTES = 64 * 1024 * 1024;
/** An attempt gets at least this long (or what is left of the deadline) even when other endpoints wait untried. */
const MIN_ATTEMPT_MS = 1000;
/** Pauses between rounds over the endpoints: doubling, then the longest repeated. */
const BACKOFF_MS = [50, 100, 200];
const MAX_BACKOFF_MS = 400;
/** A watch stream that broke is opened again after a pause: doubling from the first, up to the last. */
const WATCH_BACKOFF_MS = { first: 200, max: 5000 };
/**
 * A watch stream is closed and opened again after this long, even when it looks healthy: a connection that died
 * silently (a partition) would otherwise leave it waiting forever. TCP keep-alive finds most of those sooner.
 */
const WATCH_STREAM_MS = 5 * 60 * 1000;

export interface KeyValue {
  key?: string;
  value?: string;
  create_revision?: string;
  mod_revision?: string;
  version?: string;
}
export interface RangeResponse {
  header?: { revision?: string };
  kvs?: KeyValue[];
  count?: string;
  /** More keys in the range than the limit let through. */
  more?: boolean;
}
export interface TxnResponse {
  header?: { revision?: string };
  succeeded?: boolean;
  responses?: Array<{ response_range?: RangeResponse; response_put?: unknown; response_delete_range?: unknown }>;
}

/** The result of one request, after failover. `ambiguous`: an earlier attempt may have been applied. */
interface Answer<T> {
  body: T;
  ambiguous: boolean;
}

/** Why one attempt failed, and what that means for the operation. */
class AttemptError extends Error {
  constructor(
    message: string,
    /** true: try another endpoint / again; false: etcd refused the request itself, retrying cannot help. */
    readonly retry: boolean,
    /** true: the request may have reached etcd and been applied. */
    readonly maybeApplied: boolean,
    /** true: the attempt ran out of time (says less about the endpoint than an error it answered). */
    readonly timedOut = false,
  ) {
    super(message);
  }
}

const NOT_CONNECTED_CODES = new Set(['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'EHOSTUNREACH', 'ENETUNREACH', 'EADDRNOTAVAIL']);

function reason(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

export class EtcdClient {
  readonly endpoints: readonly string[];
  readonly timeoutMs: number;
  private readonly httpAgent = new http.Agent({ keepAlive: true });
  private readonly httpsAgent: https.Agent | undefined;
  /** The endpoint that answered last: tried first next time. */
  private preferred = 0;

  constructor(options: EtcdClientOptions) {
    if (options.endpoints.length === 0) throw new LatchError('etcd store: no endpoints configured (store.endpoints)');
    this.endpoints = options.endpoints.map((e) => {
      let url: URL;
      try {
        url = new URL(e);
      } catch {
        throw new LatchError(`etcd store: endpoint ${JSON.stringify(e)} is not a URL such as https://10.0.0.1:2379`);
      }
      if (url.protocol !== 'http:' && url.protocol !== 'https:') {
        throw new LatchError(`etcd store: endpoint ${e} must start with http:// or https://`);
      }
      return url.href.replace(/\/+$/, '');
    });
    this.timeoutMs = options.timeoutMs ?? 5000;
    if (!(this.timeoutMs > 0)) throw new LatchError(`etcd store: timeoutMs must be positive, got ${this.timeoutMs}`);
    const tls = options.tls;
    if (tls && (tls.cert === undefined) !== (tls.key === undefined)) {
      throw new LatchError('etcd store: tls.cert and tls.key go together: give both or neither');
    }
    if (this.endpoints.some((e) => e.startsWith('https:'))) {
      this.httpsAgent = new https.Agent({
        keepAlive: true,
        ca: tls?.ca !== undefined ? readPem(tls.ca, 'tls.ca') : undefined,
        cert: tls?.cert !== undefined ? readPem(tls.cert, 'tls.cert') : undefined,
        key: tls?.key !== undefined ? readPem(tls.key, 'tls.key') : undefined,
      });
    } else if (tls && (tls.ca ?? tls.cert) !== undefined) {
      throw new LatchError('etcd store: tls is configured but no endpoint uses https://; the files would not be used');
    }
  }

  /**
   * Watch streams on the key range of `request`, one after another until `signal` aborts: a stream that breaks (a
   * member down, the deadline of WATCH_STREAM_MS) is opened again on the next endpoint after a pause. Calls onChange
   * for each answer that carries events, and once each time a stream ends (changes may have been missed meanwhile).
   * Never fails: while etcd is away it keeps trying.
   */
  async watch(request: string, signal: AbortSignal, onChange: () => void): Promise<void> {
    let pause = WATCH_BACKOFF_MS.first;
    for (let round = 0; !signal.aborted; round++) {
      const endpoint = this.endpoints[(this.preferred + round) % this.endpoints.length] ?? '';
      const created = await this.watchStream(endpoint, request, signal, onChange);
      if (signal.aborted) break;
      onChange(); // the stream ended: what happened until the next one is up is unknown
      pause = created ? WATCH_BACKOFF_MS.first : Math.min(pause * 2, WATCH_BACKOFF_MS.max);
      await sleep(pause, undefined, { signal }).catch(() => undefined);
    }
  }

  /**
   * One watch stream on one endpoint until it breaks, WATCH_STREAM_MS pass, or `signal` aborts. Calls onChange for
   * each answer that carries events; resolves whether etcd confirmed the watch (so the caller knows it worked).
   */
  private watchStream(endpoint: string, request: string, signal: AbortSignal, onChange: () => void): Promise<boolean> {
    const isHttps = endpoint.startsWith('https:');
    return new Promise((resolve) => {
      let created = false;
      let req: http.ClientRequest | undefined;
      const finish = () => {
        clearTimeout(timer);
        signal.removeEventListener('abort', finish);
        req?.destroy();
        resolve(created);
      };
      const timer = setTimeout(finish, WATCH_STREAM_MS);
      signal.addEventListener('abort', finish, { once: true });
      if (signal.aborted) return finish();
      try {
        req = (isHttps ? https : http).request(new URL(`${endpoint}/v3/watch`), {
          method: 'POST',
          // Its own connection: a stream must not hold one of the pooled keep-alive sockets the other calls use.
          agent: false,
          ...(isHttps && this.httpsAgent
            ? { ca: this.httpsAgent.options.ca, cert: this.httpsAgent.options.cert, key: this.httpsAgent.options.key }
            : {}),
          headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(request), 'grpc-metadata-hasleader': 'true' },
        });
      } catch {
        return finish();
      }
      req.on('socket', (socket) => socket.setKeepAlive(true, 10_000));
      req.on('error', finish);
      req.on('response', (res) => {
        if (res.statusCode !== 200) {
          res.resume();
          return finish();
        }
        let buffered = '';
        res.setEncoding('utf8');
        res.on('data', (text: string) => {
          buffered += text;
          // The gateway writes one JSON object per message, each on its own line.
          for (let nl = buffered.indexOf('\n'); nl >= 0; nl = buffered.indexOf('\n')) {
            const line = buffered.slice(0, nl).trim();
            buffered = buffered.slice(nl + 1);
            if (line === '') continue;
            let message: { result?: { created?: boolean; canceled?: boolean; events?: unknown[] }; error?: unknown };
            try {
              message = JSON.parse(line) as typeof message;
            } catch {
              return finish();
            }
            const result = message.result;
            if (message.error !== undefined || result === undefined || result.canceled) return finish();
            if (result.created) created = true;
            if ((result.events?.length ?? 0) > 0) onChange();
          }
          if (buffered.length > MAX_RESPONSE_BYTES) finish();
        });
        res.on('end', finish);
        res.on('error', finish);
      });
      req.end(request);
    });
  }

  close(): void {
    this.httpAgent.destroy();
    this.httpsAgent?.destroy();
  }

  /**
   * POSTs one request with failover across the endpoints, retrying until the operation's deadline.
   * `mutation`: a lost answer means the request may have been applied (reported as `ambiguous`).
   */
  async call<T>(path: string, request: unknown, what: string, mutation: boolean): Promise<Answer<T>> {
    const payload = JSON.stringify(request);
    const deadline = Date.now() + this.timeoutMs;
    const n = this.endpoints.length;
    const lastError = new Map<string, string>();
    let ambiguous = false;
    for (let round = 0; ; round++) {
      const first = this.preferred;
      // The endpoints in the order tried this round: the one that last answered first.
      const rotation = [...this.endpoints.slice(first), ...this.endpoints.slice(0, first)];
      for (const [i, endpoint] of rotation.entries()) {
        const index = (first + i) % n;
        const remaining = deadline - Date.now();
        if (remaining <= 0) break;
        const untried = n - i;
        const budget = untried <= 1 ? remaining : Math.min(remaining, Math.max(MIN_ATTEMPT_MS, Math.floor(remaining / untried)));
        try {
          const body = (await this.attempt(endpoint, path, payload, budget)) as T;
          this.preferred = index;
          return { body, ambiguous };
        } catch (err) {
          if (!(err instanceof AttemptError)) throw err;
          if (mutation && err.maybeApplied) ambiguous = true;
          if (!err.retry) {
            throw new StoreError(
              `etcd store: cannot ${what}: ${endpoint}: ${err.message}` +
                (ambiguous ? '; an earlier attempt may have been applied (completely, never in part): read again' : ''),
            );
          }
          // Keep what an endpoint last said; an attempt cut short by the deadline says less than that.
          if (!err.timedOut || !lastError.has(endpoint)) lastError.set(endpoint, err.message);
        }
      }
      const remaining = deadline - Date.now();
      if (remaining <= 0) break;
      await sleep(Math.min(remaining, BACKOFF_MS[round] ?? MAX_BACKOFF_MS));
      if (deadline - Date.now() <= 0) break;
    }
    const details = [...lastError].map(([e, m]) => `${e}: ${m}`).join('; ');
    const outcome = !mutation
      ? 'nothing was changed'
      : ambiguous
        ? 'the change may or may not have been applied (completely, never in part); it is safe to retry'
        : 'nothing was changed';
    throw new EtcdUnavailableError(
      `etcd store: cannot ${what}: etcd is unreachable or has lost quorum: no endpoint of ${n} answered within ` +
        `${this.timeoutMs} ms (${details || 'no attempt could be made'}); ${outcome}. The call can be retried once etcd is back`,
    );
  }

  /** One HTTP(S) request to one endpoint, with its own timeout. Resolves the parsed answer or rejects AttemptError. */
  private attempt(endpoint: string, path: string, payload: string, timeoutMs: number): Promise<unknown> {
    const isHttps = endpoint.startsWith('https:');
    const url = new URL(endpoint + path);
    return new Promise((resolve, reject) => {
      let connected = false;
      let settled = false;
      const fail = (err: AttemptError) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        req.destroy();
        reject(err);
      };
      const requestOptions: http.RequestOptions = {
        method: 'POST',
        agent: isHttps ? this.httpsAgent : this.httpAgent,
        headers: {
          'content-type': 'application/json',
          'content-length': Buffer.byteLength(payload),
          // Ask the member to refuse at once, rather than hang, when it has no leader (etcd's "hasleader").
          'grpc-metadata-hasleader': 'true',
        },
      };
      const req = (isHttps ? https : http).request(url, requestOptions, (res) => {
        const chunks: Buffer[] = [];
        let size = 0;
        res.on('data', (chunk: Buffer) => {
          size += chunk.length;
          if (size > MAX_RESPONSE_BYTES) fail(new AttemptError(`its answer is larger than ${MAX_RESPONSE_BYTES} bytes`, false, true));
          else chunks.push(chunk);
        });
        res.on('error', (err) => fail(new AttemptError(`the answer broke off: ${reason(err)}`, true, true)));
        res.on('end', () => {
          if (settled) return;
          const text = Buffer.concat(chunks).toString('utf8');
          const status = res.statusCode ?? 0;
          if (status === 200) {
            try {
              const body = JSON.parse(text) as unknown;
              settled = true;
              clearTimeout(timer);
              resolve(body);
            } catch {
              fail(new AttemptError(`it answered something that is not JSON: ${text.slice(0, 200)}`, true, true));
            }
            return;
          }
          fail(classifyHttpError(status, text));
        });
      });
      req.on('socket', (socket) => {
        // A reused keep-alive socket is connected already; a new one is once it (and TLS) is up.
        if (!socket.connecting) connected = true;
        else socket.once(isHttps ? 'secureConnect' : 'connect', () => (connected = true));
      });
      req.on('error', (err) => {
        const code = (err as NodeJS.ErrnoException).code;
        const tls = tlsProblem(err);
        if (code !== undefined && NOT_CONNECTED_CODES.has(code)) {
          fail(new AttemptError(code === 'ECONNREFUSED' ? 'connection refused' : `cannot connect (${code})`, true, false));
        } else if (tls !== undefined) {
          // A configuration problem, not an outage: report it at once. The handshake failed: nothing was sent.
          fail(new AttemptError(tls, false, false));
        } else if (!connected) {
          fail(new AttemptError(`cannot connect: ${reason(err)}`, true, false));
        } else {
          fail(new AttemptError(`the connection broke: ${reason(err)}`, true, true));
        }
      });
      const timer = setTimeout(() => {
        fail(
          new AttemptError(
            connected ? `no answer within ${timeoutMs} ms` : `could not connect within ${timeoutMs} ms`,
            true,
            connected,
            true,
          ),
        );
      }, timeoutMs);
      req.end(payload);
    });
  }
}

/** The gateway answers gRPC errors as {"error","message","code"} with an HTTP status. */
function classifyHttpError(status: number, text: string): AttemptError {
  let message = text.trim().slice(0, 300);
  let code: number | undefined;
  try {
    const body = JSON.parse(text) as { message?: unknown; error?: unknown; code?: unknown };
    if (typeof body.message === 'string' || typeof body.error === 'string') message = String(body.message ?? body.error);
    if (typeof body.code === 'number') code = body.code;
  } catch {
    // not JSON: keep the text
  }
  if (/no leader/i.test(message)) {
    return new AttemptError(`${message} (this member has no leader: the cluster has lost quorum or is electing one)`, true, false);
  }
  // gRPC Unavailable (14), DeadlineExceeded (4), ResourceExhausted (8), Aborted (10); HTTP 5xx, 408, 429.
  if ((code !== undefined && [4, 8, 10, 14].includes(code)) || status >= 500 || status === 408 || status === 429) {
    return new AttemptError(`${message || `HTTP ${status}`}`, true, true);
  }
  if (status === 401 || code === 16) {
    return new AttemptError(
      `${message} (etcd wants authentication; latch authenticates with client certificates only: set store.tls.cert and store.tls.key)`,
      false,
      false,
    );
  }
  if (status === 404) {
    return new AttemptError(`HTTP 404 for the etcd v3 JSON API: is this an etcd (v3.4 or later) client URL?`, true, false);
  }
  return new AttemptError(`${message || `HTTP ${status}`}`, false, false);
}

/** A TLS failure explained with the setting to fix, or undefined when the error is not about TLS. */
function tlsProblem(err: unknown): string | undefined {
  const code = (err as NodeJS.ErrnoException).code ?? '';
  if (/ALERT_BAD_CERTIFICATE|CERTIFICATE_REQUIRED|ALERT_UNKNOWN_CA|ALERT_CERTIFICATE/i.test(code)) {
    return (
      `TLS handshake refused by etcd (${code}): it did not accept our client certificate (or got none); ` +
      'set store.tls.cert and store.tls.key to a certificate signed by the CA etcd trusts (--trusted-ca-file)'
    );
  }
  if (/CERT|SELF_SIGNED|UNABLE_TO_VERIFY|UNABLE_TO_GET_ISSUER|ALTNAME|HOSTNAME/i.test(code)) {
    return (
      `cannot verify etcd's certificate (${code}: ${reason(err)}); set store.tls.ca to the CA that signed it, ` +
      'and use an endpoint address its certificate names'
    );
  }
  if (/^ERR_SSL|^ERR_TLS/i.test(code)) return `TLS failed (${code}); check store.tls and that the endpoint speaks https`;
  return undefined;
}

function readPem(path: string, field: string): Buffer {
  try {
    return readFileSync(path);
  } catch (err) {
    throw new StoreError(`etcd store: cannot read store.${field} ${path}: ${reason(err)}`, { cause: err });
  }
}

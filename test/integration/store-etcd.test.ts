// The Store contract against a real etcd (one member, started here): compare-and-swap, conflicts, delete, list,
// a restart of etcd under a live store, failover between endpoints, TLS; and, with small fake servers, what an
// etcd that answers slowly or with errors (lost quorum) makes every operation do: fail with a StoreError saying
// etcd is unreachable or has lost quorum, within the deadline, and never leave a write half done.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import * as http from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { parseConfig } from '../../src/config.js';
import { ConflictError, LatchError, StoreError } from '../../src/errors.js';
import { addTicket, isSatisfied, newVolume } from '../../src/ledger/arbitrate.js';
import { Ledger } from '../../src/ledger/ledger.js';
import { EtcdStore, EtcdUnavailableError, type EtcdStoreOptions } from '../../src/store/etcd.js';
import { openStore } from '../../src/store/index.js';
import type { Store } from '../../src/store/types.js';
import { EtcdCluster, etcdSkipReason, freePort, makeTestCertificates } from '../etcd/etcd.js';

const REPO = resolve(__dirname, '../..');
const skip = etcdSkipReason();
const TIMEOUT = 2000;
/** What a failing call may take beyond its deadline (the last attempt's teardown, a busy test machine). */
const SLACK = 1500;

let etcd: EtcdCluster;
let work: string;
const opened: Store[] = [];
let n = 0;

function store(options: Partial<EtcdStoreOptions> = {}): EtcdStore {
  const s = new EtcdStore({ endpoints: etcd.endpoints, prefix: `/test-${process.pid}-${++n}/`, timeoutMs: TIMEOUT, ...options });
  opened.push(s);
  return s;
}

/** The member the raw requests go to. */
function gateway(): string {
  const [endpoint] = etcd.endpoints;
  assert.ok(endpoint, 'the cluster has a member');
  return endpoint;
}

/** Raw range of one key through the gateway: what etcd really holds. */
async function raw(key: string): Promise<{ value?: string; mod_revision?: string } | undefined> {
  const body = (await etcd.request(gateway(), 'POST', '/v3/kv/range', { key: Buffer.from(key).toString('base64') }, 2000)) as {
    kvs?: Array<{ value?: string; mod_revision?: string }>;
  };
  const kv = body.kvs?.[0];
  return kv && { mod_revision: kv.mod_revision, value: kv.value === undefined ? '' : Buffer.from(kv.value, 'base64').toString('utf8') };
}

async function rawPut(key: string, value: string): Promise<void> {
  await etcd.request(
    gateway(),
    'POST',
    '/v3/kv/put',
    { key: Buffer.from(key).toString('base64'), value: Buffer.from(value).toString('base64') },
    2000,
  );
}

async function timed<T>(p: Promise<T>): Promise<{ ms: number; result?: T; error?: unknown }> {
  const t = Date.now();
  try {
    const result = await p;
    return { ms: Date.now() - t, result };
  } catch (error) {
    return { ms: Date.now() - t, error };
  }
}

function assertUnavailable(outcome: { ms: number; error?: unknown }, timeoutMs: number, detail?: RegExp): void {
  const err = outcome.error;
  assert.ok(err instanceof StoreError && err instanceof EtcdUnavailableError, `expected EtcdUnavailableError, got ${String(err)}`);
  assert.match(err.message, /etcd is unreachable or has lost quorum/);
  if (detail) assert.match(err.message, detail);
  assert.ok(outcome.ms >= timeoutMs - 50, `failed after ${outcome.ms} ms, before its ${timeoutMs} ms deadline`);
  assert.ok(outcome.ms < timeoutMs + SLACK, `failed after ${outcome.ms} ms, well past its ${timeoutMs} ms deadline`);
}

describe('etcd store', { skip }, () => {
  before(async () => {
    work = mkdtempSync(join(tmpdir(), 'latch-store-etcd-'));
    etcd = await EtcdCluster.start({ size: 1 });
  });
  after(async () => {
    for (const s of opened) await s.close();
    await etcd?.stop();
    if (work) rmSync(work, { recursive: true, force: true });
  });

  describe('semantics', () => {
    it('put, get, delete and list', async () => {
      const s = store();
      assert.equal(s.kind, 'etcd');
      assert.equal(await s.get('volumes/a'), undefined);
      assert.deepEqual(await s.list('volumes'), []);

      const r1 = await s.put('volumes/a', { size: 1, tags: ['x'], name: 'ünïcode ✓' }, 0);
      assert.deepEqual(await s.get('volumes/a'), { value: { size: 1, tags: ['x'], name: 'ünïcode ✓' }, revision: r1 });
      const r2 = await s.put('volumes/a', { size: 2 }, r1);
      assert.ok(r2 > r1);
      assert.deepEqual(await s.get('volumes/a'), { value: { size: 2 }, revision: r2 });
      const rb = await s.put('volumes/b', null, 0);
      assert.deepEqual(await s.get('volumes/b'), { value: null, revision: rb });
      await s.put('pvs/a', 'x', 0);
      assert.deepEqual(await s.list('volumes'), ['a', 'b']);
      assert.deepEqual(await s.list('pvs'), ['a']);
      assert.deepEqual(await s.list('tickets'), []);

      await s.delete('volumes/a', r2);
      assert.equal(await s.get('volumes/a'), undefined);
      assert.deepEqual(await s.list('volumes'), ['b']);
      // Re-created after a delete: a new, higher revision, never an old one again.
      const r3 = await s.put('volumes/a', { size: 3 }, 0);
      assert.ok(r3 > r2);
    });

    it('stores one JSON value per key under the prefix, and lists only its own keys', async () => {
      const s = store({ prefix: `/raw-${process.pid}` }); // no trailing slash: one is added
      assert.equal(s.prefix, `/raw-${process.pid}/`);
      const rev = await s.put('volumes/v1', { a: [1, 2] }, 0);
      assert.deepEqual(await raw(`/raw-${process.pid}/volumes/v1`), { value: '{"a":[1,2]}', mod_revision: String(rev) });
      // Keys under the prefix that are not latch keys (written by hand) are not listed.
      await rawPut(`/raw-${process.pid}/volumes/Not-A-Key`, '{}');
      await rawPut(`/raw-${process.pid}/volumes/a/b`, '{}');
      await rawPut(`/raw-${process.pid}/volumesx/c`, '{}');
      assert.deepEqual(await s.list('volumes'), ['v1']);
      // A value that is not JSON is reported, not returned.
      await rawPut(`/raw-${process.pid}/volumes/bad`, 'not json');
      await assert.rejects(s.get('volumes/bad'), (e) => e instanceof StoreError && /is not JSON/.test(e.message));
      // Another prefix sees nothing of it.
      const other = store();
      assert.equal(await other.get('volumes/v1'), undefined);
      assert.deepEqual(await other.list('volumes'), []);
    });

    it('lists page by page', async () => {
      const s = store({ listPageSize: 3 });
      const names = Array.from({ length: 10 }, (_, i) => `vol-${String(i).padStart(2, '0')}`);
      await Promise.all(names.map((name) => s.put(`volumes/${name}`, { name }, 0)));
      await s.put('volumeses/zzz', 1, 0); // a kind whose name starts with another's
      assert.deepEqual(await s.list('volumes'), names);
    });

    it('rejects bad keys, kinds, revisions and values before touching etcd', async () => {
      const s = store();
      for (const key of ['volumes', 'volumes/', 'Volumes/a', 'volumes/../x', 'volumes/a/b', '../volumes/a', 'volumes/A']) {
        await assert.rejects(s.get(key), LatchError, key);
        await assert.rejects(s.put(key, 1, 0), LatchError, key);
        await assert.rejects(s.delete(key, 1), LatchError, key);
      }
      await assert.rejects(s.list('../x'), LatchError);
      await assert.rejects(s.put('volumes/a', 1, -1), /non-negative integer/);
      await assert.rejects(s.put('volumes/a', 1, 1.5), /non-negative integer/);
      await assert.rejects(s.put('volumes/a', undefined, 0), /cannot be stored as JSON/);
      const cyclic: Record<string, unknown> = {};
      cyclic.self = cyclic;
      await assert.rejects(s.put('volumes/a', cyclic, 0), /cannot be stored as JSON/);
    });
  });

  describe('compare-and-swap', () => {
    it('refuses a stale revision, an existing key for 0, and says what it found', async () => {
      const s = store();
      const r1 = await s.put('volumes/a', 1, 0);
      await assert.rejects(
        s.put('volumes/a', 2, 0),
        (e) => e instanceof ConflictError && /expected it not to exist but it is at revision/.test(e.message),
      );
      const r2 = await s.put('volumes/a', 2, r1);
      await assert.rejects(
        s.put('volumes/a', 3, r1),
        (e) => e instanceof ConflictError && new RegExp(`expected revision ${r1} but it is at revision ${r2}`).test(e.message),
      );
      await assert.rejects(s.put('volumes/missing', 3, r1), (e) => e instanceof ConflictError && /but it does not exist/.test(e.message));
      assert.deepEqual(await s.get('volumes/a'), { value: 2, revision: r2 });
    });

    it('deletes only at the expected revision; deleting a missing key with 0 is a no-op', async () => {
      const s = store();
      await s.delete('volumes/none', 0);
      await assert.rejects(s.delete('volumes/none', 5), ConflictError);
      const r1 = await s.put('volumes/a', 1, 0);
      await assert.rejects(s.delete('volumes/a', 0), (e) => e instanceof ConflictError && /expected it not to exist/.test(e.message));
      await assert.rejects(s.delete('volumes/a', r1 + 100), ConflictError);
      assert.equal((await s.get('volumes/a'))?.revision, r1);
      await s.delete('volumes/a', r1);
      await assert.rejects(s.delete('volumes/a', r1), ConflictError);
      await s.delete('volumes/a', 0);
    });

    it('lets exactly one of many racing writers win', async () => {
      const s = store();
      const r = await s.put('volumes/race', { winner: null }, 0);
      const racers = Array.from({ length: 20 }, (_, i) =>
        store({ prefix: s.prefix })
          .put('volumes/race', { winner: i }, r)
          .then(
            (rev) => ({ i, rev }),
            (err: unknown) => ({ i, err }),
          ),
      );
      const results = await Promise.all(racers);
      const winners = results.filter((x) => 'rev' in x) as Array<{ i: number; rev: number }>;
      assert.equal(winners.length, 1);
      for (const x of results) if ('err' in x) assert.ok(x.err instanceof ConflictError, String(x.err));
      assert.deepEqual(await s.get('volumes/race'), { value: { winner: winners[0]!.i }, revision: winners[0]!.rev });
    });

    it('loses no increment under concurrent read-modify-write loops', async () => {
      const s = store();
      const writers = 8;
      const each = 15;
      const loop = async () => {
        for (let k = 0; k < each; k++) {
          for (;;) {
            const cur = await s.get('counters/c');
            try {
              await s.put('counters/c', ((cur?.value as number) ?? 0) + 1, cur?.revision ?? 0);
              break;
            } catch (err) {
              if (!(err instanceof ConflictError)) throw err;
            }
          }
        }
      };
      await Promise.all(Array.from({ length: writers }, loop));
      assert.equal((await s.get('counters/c'))?.value, writers * each);
    });

    it('carries the ledger: openStore from the config, then attach arbitration through it', async () => {
      const prefix = `/cfg-${process.pid}/`;
      const config = parseConfig({ store: { type: 'etcd', endpoints: etcd.endpoints, prefix, timeoutMs: 1500 } }, 'test');
      const s = await openStore(config);
      opened.push(s);
      assert.ok(s instanceof EtcdStore);
      assert.equal(s.prefix, prefix);
      assert.equal(s.timeoutMs, 1500);
      const ledger = new Ledger(s);
      const now = ledger.now();
      const add = (node: string) =>
        ledger.update('vol1', (d) =>
          addTicket(
            d ?? newVolume('vol1', 1 << 20, 'ext4', now),
            { id: `workload-${node}`, type: 'workload', nodeID: node, parameters: { readOnly: false }, requestedBy: {} },
            now,
          ),
        );
      const [a, b] = await Promise.all([add('node-a'), add('node-b')]);
      const doc = await ledger.get('vol1');
      assert.ok(doc);
      assert.equal(Object.keys(doc.spec.tickets).length, 2);
      // Read-write-once: exactly one of the two is granted.
      assert.equal([isSatisfied(doc, 'workload-node-a'), isSatisfied(doc, 'workload-node-b')].filter(Boolean).length, 1);
      assert.ok(a && b);
      assert.deepEqual((await ledger.list()).docs, [doc]);
    });
  });

  describe('watch', () => {
    it('yields after a key of its kind changes, and again after etcd restarts', async () => {
      const s = store();
      const other = store();
      const stop = new AbortController();
      const changes = s.watch('volumes', stop.signal)[Symbol.asyncIterator]();
      let next = changes.next();
      // Until etcd confirmed the watch a write could be missed: write until it yields (a lost watch only delays).
      const writeUntil = async (p: Promise<IteratorResult<void>>, key: string) => {
        let settled = false;
        void p.then(() => (settled = true));
        for (let i = 0, rev = (await s.get(key))?.revision ?? 0; !settled && i < 200; i++) {
          await other.put('volumes/elsewhere', i, (await other.get('volumes/elsewhere'))?.revision ?? 0); // another prefix: not watched
          rev = await s.put(key, { i }, rev);
          await new Promise((r) => setTimeout(r, 50));
        }
        return p;
      };
      assert.deepEqual(await writeUntil(next, 'volumes/a'), { done: false, value: undefined });

      // A write through another store under the same prefix.
      next = changes.next();
      const same = store({ prefix: s.prefix });
      await same.put('volumes/b', 1, 0);
      assert.deepEqual(await next, { done: false, value: undefined });

      // etcd goes away and comes back: the stream is opened again (and yields, since changes may have been missed).
      await etcd.members[0]!.kill();
      await etcd.members[0]!.start();
      next = changes.next();
      assert.deepEqual(await writeUntil(next, 'volumes/c'), { done: false, value: undefined });
      stop.abort();
      assert.equal((await changes.next()).done, true);
    });
  });

  describe('outages', () => {
    it('fails over to the next endpoint when one is down, and sticks to the one that answers', async () => {
      const dead = `http://127.0.0.1:${await freePort()}`;
      const s = store({ endpoints: [dead, ...etcd.endpoints] });
      const r = await s.put('volumes/a', 1, 0);
      assert.deepEqual(await s.get('volumes/a'), { value: 1, revision: r });
      const t = await timed(s.get('volumes/a'));
      assert.ok(t.ms < 500, `${t.ms} ms`);
    });

    it('fails every op with a clear message while etcd is down, and recovers by itself when it is back', async () => {
      const s = store();
      const r = await s.put('volumes/a', { v: 1 }, 0);
      await etcd.members[0]!.kill();
      try {
        assertUnavailable(await timed(s.get('volumes/a')), TIMEOUT, /connection refused/);
        const quick = store({ prefix: s.prefix, timeoutMs: 700 });
        assertUnavailable(await timed(quick.put('volumes/a', { v: 2 }, r)), 700, /nothing was changed/);
        assertUnavailable(await timed(quick.delete('volumes/a', r)), 700);
        assertUnavailable(await timed(quick.list('volumes')), 700);
      } finally {
        await etcd.members[0]!.start();
      }
      // The same store, no repair: the data survived, and writes work again.
      assert.deepEqual(await s.get('volumes/a'), { value: { v: 1 }, revision: r });
      const r2 = await s.put('volumes/a', { v: 2 }, r);
      assert.deepEqual(await s.get('volumes/a'), { value: { v: 2 }, revision: r2 });
    });
  });

  describe('the driver with etcd unreachable', () => {
    it('answers every ledger op with one Failure reply saying etcd is unreachable', async () => {
      const dead = `http://127.0.0.1:${await freePort()}`;
      const config = join(work, 'driver-config.json');
      writeFileSync(
        config,
        JSON.stringify({
          stateDir: join(work, 'driver-state'),
          logFile: join(work, 'driver.log'),
          store: { type: 'etcd', endpoints: [dead], timeoutMs: 500 },
        }),
      );
      const json = JSON.stringify({ 'kubernetes.io/pvOrVolumeName': 'pv-1' });
      for (const args of [
        ['attach', json, 'node-a'],
        ['isattached', json, 'node-a'],
        ['detach', 'pv-1', 'node-a'],
      ]) {
        const started = Date.now();
        const r = spawnSync(process.execPath, ['--import', 'tsx', join(REPO, 'src/bin.ts'), ...args], {
          cwd: REPO,
          encoding: 'utf8',
          env: { ...process.env, LATCH_CONFIG: config },
          timeout: 30_000,
        });
        assert.equal(r.status, 1, `${args[0]}: ${r.stdout} ${r.stderr}`);
        const reply = JSON.parse(r.stdout) as { status: string; message: string };
        assert.equal(reply.status, 'Failure');
        assert.match(reply.message, /etcd is unreachable or has lost quorum/, args[0]);
        assert.ok(Date.now() - started < 10_000);
      }
    });
  });

  describe('an etcd that answers slowly or with errors (lost quorum), simulated', () => {
    /** A fake endpoint; `handler` decides per request. */
    async function fake(handler: (path: string, body: string, req: http.IncomingMessage, res: http.ServerResponse) => void) {
      const server = http.createServer((req, res) => {
        let body = '';
        req.setEncoding('utf8').on('data', (d: string) => (body += d));
        req.on('end', () => handler(req.url ?? '', body, req, res));
      });
      await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
      const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
      return {
        url,
        close: () => {
          server.closeAllConnections();
          return new Promise<void>((r) => server.close(() => r()));
        },
      };
    }

    /** Forwards to the real etcd; `tamper` may swallow the answer (after etcd applied the request). */
    async function proxy(tamper: (path: string, body: string) => 'forward' | 'drop-answer') {
      return fake((path, body, req, res) => {
        const up = http.request(etcd.endpoints[0] + path, { method: 'POST', headers: { 'content-type': 'application/json' } }, (upRes) => {
          let text = '';
          upRes.setEncoding('utf8').on('data', (d: string) => (text += d));
          upRes.on('end', () => {
            if (tamper(path, body) === 'drop-answer') {
              req.socket.destroy();
              return;
            }
            res.writeHead(upRes.statusCode ?? 500, { 'content-type': 'application/json' }).end(text);
          });
        });
        up.end(body);
      });
    }

    it('an endpoint that never answers: every op fails at its deadline, saying so', async () => {
      const silent = await fake(() => {});
      try {
        const s = store({ endpoints: [silent.url], timeoutMs: 800 });
        assertUnavailable(await timed(s.get('volumes/a')), 800, /no answer within/);
        assertUnavailable(await timed(s.put('volumes/a', 1, 0)), 800, /may or may not have been applied/);
        assertUnavailable(await timed(s.list('volumes')), 800);
      } finally {
        await silent.close();
      }
    });

    it('members without a leader: fails at the deadline with "no leader", nothing changed', async () => {
      let calls = 0;
      const noLeader = await fake((_p, _b, _req, res) => {
        calls++;
        res
          .writeHead(503, { 'content-type': 'application/json' })
          .end(JSON.stringify({ error: 'etcdserver: no leader', message: 'etcdserver: no leader', code: 14 }));
      });
      try {
        const s = store({ endpoints: [noLeader.url, `http://127.0.0.1:${await freePort()}`], timeoutMs: 1000 });
        const put = await timed(s.put('volumes/a', 1, 0));
        assertUnavailable(put, 1000, /no leader.*lost quorum/);
        assert.match((put.error as Error).message, /connection refused/);
        assert.match((put.error as Error).message, /nothing was changed/);
        assert.ok(calls > 2, 'it kept retrying until the deadline');
      } finally {
        await noLeader.close();
      }
    });

    it('etcd timing out a write: fails saying it may or may not have been applied', async () => {
      const timingOut = await fake((_p, _b, _req, res) => {
        setTimeout(() => res.writeHead(503).end(JSON.stringify({ error: 'etcdserver: request timed out', code: 14 })), 100);
      });
      try {
        const s = store({ endpoints: [timingOut.url], timeoutMs: 700 });
        assertUnavailable(
          await timed(s.put('volumes/a', 1, 0)),
          700,
          /request timed out.*may or may not have been applied \(completely, never in part\)/,
        );
        assertUnavailable(await timed(s.get('volumes/a')), 700, /nothing was changed/);
      } finally {
        await timingOut.close();
      }
    });

    it('a request etcd refuses as such (bad request) fails at once, without retries', async () => {
      let calls = 0;
      const refusing = await fake((_p, _b, _req, res) => {
        calls++;
        res.writeHead(400).end(JSON.stringify({ error: 'etcdserver: request is too large', code: 3 }));
      });
      try {
        const s = store({ endpoints: [refusing.url], timeoutMs: 3000 });
        const t = await timed(s.put('volumes/a', 1, 0));
        assert.ok(t.error instanceof StoreError && !(t.error instanceof EtcdUnavailableError), String(t.error));
        assert.match(t.error.message, /request is too large/);
        assert.ok(t.ms < 500);
        assert.equal(calls, 1);
      } finally {
        await refusing.close();
      }
    });

    it('a write whose answer was lost but which was applied counts as done; a retry never applies it twice', async () => {
      let drop = 0;
      let txns = 0;
      const flaky = await proxy((path) => {
        if (path !== '/v3/kv/txn') return 'forward';
        txns++;
        return drop-- > 0 ? 'drop-answer' : 'forward';
      });
      try {
        const s = store({ endpoints: [flaky.url] });
        const direct = new EtcdStore({ endpoints: etcd.endpoints, prefix: s.prefix });
        opened.push(direct);
        drop = 1;
        const r1 = await s.put('volumes/a', { v: 1 }, 0);
        assert.equal(txns, 2);
        assert.deepEqual(await direct.get('volumes/a'), { value: { v: 1 }, revision: r1 });
        drop = 1;
        const r2 = await s.put('volumes/a', { v: 2 }, r1);
        assert.deepEqual(await direct.get('volumes/a'), { value: { v: 2 }, revision: r2 });
        // A lost answer for a write that lost its compare-and-swap stays a conflict.
        await direct.put('volumes/a', { v: 'theirs' }, r2);
        drop = 1;
        await assert.rejects(s.put('volumes/a', { v: 3 }, r2), ConflictError);
        const theirs = await direct.get('volumes/a');
        assert.ok(theirs);
        assert.deepEqual(theirs.value, { v: 'theirs' });
        drop = 1;
        await s.delete('volumes/a', theirs.revision);
        assert.equal(await direct.get('volumes/a'), undefined);
      } finally {
        await flaky.close();
      }
    });
  });

  describe('TLS', () => {
    let certs: ReturnType<typeof makeTestCertificates>;
    let secure: EtcdCluster | undefined;
    before(async () => {
      certs = makeTestCertificates(join(work, 'pki'));
      if (certs) secure = await EtcdCluster.start({ size: 1, clientTls: { server: certs.server, ca: certs.ca } });
    });
    after(async () => {
      await secure?.stop();
    });

    it('talks https with a CA and a client certificate, and refuses a wrong CA or no certificate clearly', async (t) => {
      if (!certs || !secure) return t.skip('openssl is not installed');
      const endpoints = secure.endpoints;
      assert.match(endpoints[0] ?? '', /^https:/);
      const s = store({ endpoints, tls: certs.client });
      const r = await s.put('volumes/a', { tls: true }, 0);
      assert.deepEqual(await s.get('volumes/a'), { value: { tls: true }, revision: r });

      // A CA that did not sign the server's certificate: a configuration error, reported at once.
      const wrongCa = store({ endpoints, tls: { ...certs.client, ca: certs.otherCa } });
      const w = await timed(wrongCa.get('volumes/a'));
      assert.ok(w.error instanceof StoreError, String(w.error));
      assert.match(w.error.message, /cannot verify etcd's certificate.*store\.tls\.ca/);
      assert.ok(w.ms < 1000, `${w.ms} ms`);

      // No client certificate: etcd refuses the handshake; the call fails and says why.
      const anonymous = store({ endpoints, tls: { ca: certs.ca }, timeoutMs: 3000 });
      const a = await timed(anonymous.get('volumes/a'));
      assert.ok(a.error instanceof StoreError, String(a.error));
      assert.match(a.error.message, /did not accept our client certificate/);
      assert.ok(a.ms < 1000, `${a.ms} ms`);
    });

    it('checks the TLS settings when the store is opened', (t) => {
      if (!certs) return t.skip('openssl is not installed');
      assert.throws(
        () => new EtcdStore({ endpoints: ['https://127.0.0.1:1'], tls: { cert: certs!.client.cert } }),
        /tls.cert and tls.key go together/,
      );
      assert.throws(() => new EtcdStore({ endpoints: ['http://127.0.0.1:1'], tls: { ca: certs!.ca } }), /no endpoint uses https/);
      assert.throws(
        () => new EtcdStore({ endpoints: ['https://127.0.0.1:1'], tls: { ca: '/nonexistent/ca.pem' } }),
        /cannot read store.tls.ca \/nonexistent\/ca.pem/,
      );
      assert.throws(() => new EtcdStore({ endpoints: ['unix:///run/etcd.sock'] }), /must start with http:\/\/ or https:\/\//);
      assert.throws(() => new EtcdStore({ endpoints: [] }), /no endpoints/);
    });
  });
});

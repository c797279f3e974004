// The ledger on a real 3-member etcd cluster, through member failures:
//  1. a storm of concurrent ledger updates while the leader is SIGKILLed: every ticket lands exactly once
//     (no lost ticket, no ticket applied twice: generations stay 1..N without gaps or repeats);
//  2. the killed member comes back during a second storm (removals) and catches up by itself;
//  3. two members killed: the remaining one has no quorum; every call fails cleanly, within its deadline, with a
//     message saying etcd is unreachable or has lost quorum, and nothing is half written;
//  4. both restored: the same stores work again without any repair.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { ConflictError, StoreError } from '../../src/errors.js';
import { addTicket, newVolume, removeTicket } from '../../src/ledger/arbitrate.js';
import { Ledger } from '../../src/ledger/ledger.js';
import type { VolumeDoc } from '../../src/ledger/types.js';
import { EtcdStore, EtcdUnavailableError } from '../../src/store/etcd.js';
import { EtcdCluster, etcdSkipReason } from '../etcd/etcd.js';

const skip = etcdSkipReason();
const WORKERS = 6;
const TICKETS_PER_WORKER = 25;
const VOLUMES = ['v0', 'v1', 'v2', 'v3'];
const STORE_TIMEOUT = 3000;
const OUTAGE_TIMEOUT = 1500;
const SLACK = 1500;

let etcd: EtcdCluster;
const stores: EtcdStore[] = [];
const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** A store whose preferred endpoint is member `first`, as different nodes would be configured. */
function storeFor(first: number, timeoutMs = STORE_TIMEOUT): EtcdStore {
  const e = etcd.endpoints;
  const s = new EtcdStore({ endpoints: [...e.slice(first % e.length), ...e.slice(0, first % e.length)], prefix: '/storm/', timeoutMs });
  stores.push(s);
  return s;
}

interface Planned {
  volume: string;
  id: string;
  node: string;
}

function plan(worker: number): Planned[] {
  return Array.from({ length: TICKETS_PER_WORKER }, (_, j) => {
    const volume = VOLUMES[(worker + j) % VOLUMES.length];
    assert.ok(volume);
    return { volume, id: `workload-w${worker}-t${String(j).padStart(2, '0')}`, node: `node-${worker}` };
  });
}

/** Retries an operation as kubelet and the controller do: on a store failure, again a little later. */
async function retrying<T>(op: () => Promise<T>, failures: string[], giveUpAt: number): Promise<T> {
  for (;;) {
    try {
      return await op();
    } catch (err) {
      if (!(err instanceof StoreError) || err instanceof ConflictError || Date.now() > giveUpAt) throw err;
      failures.push(err.message);
      await sleep(100);
    }
  }
}

function add(ledger: Ledger, t: Planned) {
  const now = ledger.now();
  return ledger.update(t.volume, (d) =>
    addTicket(
      d ?? newVolume(t.volume, 1 << 20, 'ext4', now),
      { id: t.id, type: 'workload', nodeID: t.node, parameters: { readOnly: false }, requestedBy: { pvName: t.volume } },
      now,
    ),
  );
}

function remove(ledger: Ledger, t: Planned) {
  return ledger.update(t.volume, (d) => (d ? removeTicket(d, t.id, ledger.now()) : d));
}

/** Ticket IDs present, and the checks that prove each ticket was applied exactly once. */
function checkDoc(doc: VolumeDoc | undefined, expectedIds: string[], createdTotal: number): void {
  assert.ok(doc, 'a volume the test wrote is not in the ledger');
  const ids = Object.keys(doc.spec.tickets).sort();
  assert.deepEqual(ids, [...expectedIds].sort(), `tickets of ${doc.name}`);
  // Every add of a new ticket takes the next generation: N tickets ever created, generations exactly 1..N.
  assert.equal(doc.spec.generationCounter, createdTotal, `generation counter of ${doc.name}`);
  const generations = Object.values(doc.spec.tickets).map((t) => t.generation);
  assert.equal(new Set(generations).size, generations.length, `repeated generation in ${doc.name}`);
  for (const g of generations) assert.ok(g >= 1 && g <= createdTotal);
  // Read-write-once: at most one node holds or is granted the volume.
  assert.ok(Object.keys(doc.status.nodes).length <= 1, `${doc.name} held by ${Object.keys(doc.status.nodes).join(', ')}`);
}

describe('ledger on a 3-member etcd cluster', { skip, timeout: 120_000 }, () => {
  before(async () => {
    etcd = await EtcdCluster.start({ size: 3 });
  });
  after(async () => {
    for (const s of stores) await s.close();
    await etcd?.stop();
  });

  const all = Array.from({ length: WORKERS }, (_, w) => plan(w)).flat();
  const kept = all.filter((_, i) => i % 2 === 0);
  const removed = all.filter((_, i) => i % 2 === 1);
  let killed = -1;

  it('a storm of updates while the leader is killed: no lost or duplicated ticket', async () => {
    const failures: string[] = [];
    let done = 0;
    let doneAfterKill = 0;
    let killedAt = 0;
    const giveUpAt = Date.now() + 60_000;
    const killer = (async () => {
      while (done < 40) await sleep(5);
      killed = await etcd.leaderIndex();
      killedAt = Date.now();
      await etcd.members[killed]!.kill('SIGKILL');
    })();
    await Promise.all(
      Array.from({ length: WORKERS }, async (_, w) => {
        const ledger = new Ledger(storeFor(w));
        for (const t of plan(w)) {
          const doc = await retrying(() => add(ledger, t), failures, giveUpAt);
          assert.ok(doc?.spec.tickets[t.id], `ticket ${t.id} missing from the document its add returned`);
          done++;
          if (killedAt && Date.now() > killedAt) doneAfterKill++;
        }
      }),
    );
    await killer;
    assert.ok(doneAfterKill > 0, 'the storm ended before the kill: nothing was tested');
    const ledger = new Ledger(storeFor(killed + 1));
    for (const v of VOLUMES) {
      const ids = all.filter((t) => t.volume === v).map((t) => t.id);
      checkDoc(await ledger.get(v), ids, ids.length);
    }
    process.stderr.write(
      `# storm: ${all.length} adds, leader m${killed} killed after ${all.length - doneAfterKill}; ${failures.length} retried store failures\n`,
    );
  });

  it('the killed member comes back during a storm of removals and catches up', async () => {
    assert.ok(killed >= 0);
    const failures: string[] = [];
    const giveUpAt = Date.now() + 60_000;
    const restart = (async () => {
      await sleep(20);
      await etcd.members[killed]!.start();
    })();
    await Promise.all(
      Array.from({ length: WORKERS }, async (_, w) => {
        const ledger = new Ledger(storeFor(w));
        const mine = new Set(plan(w).map((t) => t.id));
        for (const t of removed.filter((r) => mine.has(r.id))) {
          const doc = await retrying(() => remove(ledger, t), failures, giveUpAt);
          assert.equal(doc?.spec.tickets[t.id], undefined);
        }
      }),
    );
    await restart;
    // Every member, the restarted one included, serves the same documents (reads are linearizable).
    for (const endpoint of etcd.endpoints) {
      const ledger = new Ledger(new EtcdStore({ endpoints: [endpoint], prefix: '/storm/', timeoutMs: STORE_TIMEOUT }));
      for (const v of VOLUMES) {
        const ids = kept.filter((t) => t.volume === v).map((t) => t.id);
        checkDoc(await ledger.get(v), ids, all.filter((t) => t.volume === v).length);
      }
      await ledger.store.close();
    }
  });

  it('two members down: every call fails cleanly within its deadline, saying etcd lost quorum; restored: calls work again', async () => {
    const before = new Map<string, VolumeDoc>();
    const reader = new Ledger(storeFor(0));
    for (const v of VOLUMES) {
      const doc = await reader.get(v);
      assert.ok(doc, `${v} is in the ledger`);
      before.set(v, doc);
    }

    const survivor = 2;
    await Promise.all([etcd.members[0]!.kill('SIGKILL'), etcd.members[1]!.kill('SIGKILL')]);
    // Calls through every endpoint order, as the controller and the nodes would make them.
    const ledgers = [0, 1, 2].map((first) => new Ledger(storeFor(first, OUTAGE_TIMEOUT)));
    const attempted: Planned[] = [];
    try {
      for (const [i, ledger] of ledgers.entries()) {
        const volume = VOLUMES[i];
        assert.ok(volume);
        const t: Planned = { volume, id: `workload-outage-${i}`, node: 'node-outage' };
        attempted.push(t);
        const calls: Array<[string, () => Promise<unknown>]> = [
          ['update', () => add(ledger, t)],
          ['get', () => ledger.get(t.volume)],
        ];
        if (i === 0) calls.push(['list', () => ledger.list()], ['remove', () => remove(ledger, t)]);
        for (const [what, call] of calls) {
          const started = Date.now();
          await assert.rejects(call(), (err: unknown) => {
            const ms = Date.now() - started;
            assert.ok(err instanceof EtcdUnavailableError, `${what}: ${String(err)}`);
            assert.match(err.message, /etcd is unreachable or has lost quorum/, what);
            // One store call (a get, then perhaps a put) may each take the whole deadline.
            assert.ok(ms < 2 * OUTAGE_TIMEOUT + SLACK, `${what} failed after ${ms} ms`);
            return true;
          });
        }
      }
      // Once the survivor has noticed it lost its leader, it says so.
      await sleep(700);
      await assert.rejects(ledgers[survivor]!.get('v0'), /no leader/);
    } finally {
      await Promise.all([etcd.members[0]!.start(), etcd.members[1]!.start()]);
    }

    // The same stores, no repair: reads and writes work again.
    for (const [i, ledger] of ledgers.entries()) {
      const t = attempted[i];
      assert.ok(t);
      const prior = before.get(t.volume);
      const now = await ledger.get(t.volume);
      assert.ok(prior && now, `${t.volume} is in the ledger`);
      // Nothing half written: either the attempted add is absent, or it is wholly there as one more ticket (a write
      // a member had accepted before it noticed the lost quorum may still be committed once quorum is back).
      const added = now.spec.tickets[t.id] !== undefined;
      checkDoc(now, [...Object.keys(prior.spec.tickets), ...(added ? [t.id] : [])], prior.spec.generationCounter + (added ? 1 : 0));
      const doc = await add(ledger, t);
      assert.ok(doc?.spec.tickets[t.id]);
      checkDoc(doc, [...Object.keys(prior.spec.tickets), t.id], prior.spec.generationCounter + 1);
    }
  });
});

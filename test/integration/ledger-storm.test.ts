// Process-level tests of the ledger (issue 3): real processes (test/fixtures/ledger-worker.ts, bundled with esbuild)
// race on one store through Ledger's compare-and-swap loop.
// - storm: 16 processes × 50 random attach/detach/release/node-up/node-is-down operations on 5 volumes and 3 nodes
//   (vol-4 gets only read-only tickets, so read-only-many holds on several nodes happen; the others mix in some);
//   every worker checks the invariants after every step; at the end the tickets in the ledger are exactly the ones
//   the workers believe they hold (less those an admin's releaseDeadNode removed, tracked by generation).
// - crash: workers SIGKILLed at random moments (100+ kills); then every stored document parses and passes the
//   invariants, and the next Ledger.update goes through at once.
// - restart: a new process reading the same store sees exactly what the last writer wrote.
// Each runs for every store kind of storeKinds() (test/fixtures/ledger-stores.ts; LATCH_TEST_STORES picks them).
// LATCH_STORM_SEED=<n> replays the workers' choices (the interleaving itself is up to the scheduler).
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { addTicket, removeTicket } from '../../src/ledger/arbitrate.js';
import { ticketId } from '../../src/ledger/ids.js';
import { Ledger } from '../../src/ledger/ledger.js';
import type { VolumeDoc } from '../../src/ledger/types.js';
import { DRIVER, VOLUMES, checkInvariants, ownPvName } from '../fixtures/ledger-invariants.js';
import { storeKinds, type StoreKind } from '../fixtures/ledger-stores.js';
import type { Report } from '../fixtures/ledger-worker.js';
import { bundleForNode } from '../fixtures/bundle.js';

const STORM_WORKERS = 16;
const STORM_OPERATIONS = 50;
const CRASH_LANES = 6;
const TARGET_KILLS = 120;
const RESTART_OPERATIONS = 20;

let work: string;
let workerJs: string;

before(async () => {
  work = mkdtempSync(join(tmpdir(), 'latch-ledger-storm-'));
  workerJs = join(work, 'ledger-worker.cjs');
  await bundleForNode('test/fixtures/ledger-worker.ts', workerJs);
});
after(() => {
  if (work) rmSync(work, { recursive: true, force: true });
});

const baseSeed = Number(process.env.LATCH_STORM_SEED) || Math.floor(Math.random() * 1e9);
let seeds = 0;
const nextSeed = () => baseSeed + seeds++;

// Unref'd, so a pending guard timer does not keep the test process alive once the workers are gone.
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms).unref());

interface Run {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

function startWorker(mode: string, kind: StoreKind, location: string, id: string, seed: number, operations = 0) {
  const child = spawn(process.execPath, [workerJs, mode, kind.name, location, id, String(seed), String(operations)], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const out = { stdout: '', stderr: '' };
  child.stdout.setEncoding('utf8').on('data', (d: string) => (out.stdout += d));
  child.stderr.setEncoding('utf8').on('data', (d: string) => (out.stderr += d));
  const done = new Promise<Run>((r) => child.on('close', (code, signal) => r({ code, signal, ...out })));
  return { child, out, done };
}

async function runWorker(mode: string, kind: StoreKind, location: string, id: string, operations = 0): Promise<Run> {
  const seed = nextSeed();
  const run = await startWorker(mode, kind, location, id, seed, operations).done;
  assert.equal(run.code, 0, `worker ${id} (${mode}, seed ${seed}) failed: ${run.signal ?? ''} ${run.stderr}`);
  return run;
}

function freshLocation(kind: StoreKind, scenario: string): string {
  const location = join(work, `${kind.name}-${scenario}`);
  mkdirSync(location);
  return location;
}

/** Every stored volume through a fresh Ledger (which throws on a document that does not parse), checked. */
async function soundDocs(kind: StoreKind, location: string, violations: string[]): Promise<VolumeDoc[]> {
  const store = await kind.open(location);
  try {
    const { docs, damaged } = await new Ledger(store).list();
    for (const d of damaged) violations.push(`${d.name}: damaged: ${d.reason}`);
    for (const doc of docs) {
      violations.push(...checkInvariants(doc, doc.name));
      for (const t of Object.values(doc.spec.tickets)) {
        // No torn or foreign ticket: each one's ID is the deterministic one for what it records.
        const pvName = t.requestedBy.pvName ?? '';
        if (t.id !== ticketId(t.type, pvName, DRIVER, t.nodeID))
          violations.push(`${doc.name}: ticket ${t.id} does not match ${pvName} on ${t.nodeID}`);
      }
    }
    for (const { where, value } of kind.history?.(location) ?? []) violations.push(...checkInvariants(value).map((v) => `${where}: ${v}`));
    return docs;
  } finally {
    await store.close();
  }
}

for (const kind of storeKinds()) {
  describe(`ledger over the ${kind.name} store`, () => {
    const locations: string[] = [];

    it(
      `storm: ${STORM_WORKERS} processes × ${STORM_OPERATIONS} operations keep every invariant and lose no ticket`,
      { timeout: 40_000 },
      async () => {
        const location = freshLocation(kind, 'storm');
        locations.push(location);
        const started = Date.now();
        const runs = await Promise.all(
          Array.from({ length: STORM_WORKERS }, (_, w) => runWorker('storm', kind, location, String(w), STORM_OPERATIONS)),
        );
        const reports = runs.map((r) => JSON.parse(r.stdout.trim().split('\n').pop() ?? '') as Report);
        const violations = reports.flatMap((r) => r.violations);

        // Expected: every ticket a worker believes it holds, unless a releaseDeadNode removed that very generation.
        const dead = new Set(reports.flatMap((r) => r.deadRemovals.map((d) => `${d.volume} ${d.id} ${d.generation}`)));
        const expected = new Map<string, string>(); // ticket ID -> "volume generation"
        for (const r of reports) {
          for (const h of r.held) {
            if (expected.has(h.id)) violations.push(`ticket ${h.id} believed held twice`);
            if (!dead.has(`${h.volume} ${h.id} ${h.generation}`)) expected.set(h.id, `${h.volume} ${h.generation}`);
          }
        }
        const docs = await soundDocs(kind, location, violations);
        const actual = new Map<string, string>();
        const owners = new Set(VOLUMES.flatMap((v) => reports.map((r) => ownPvName(v, r.worker))));
        for (const doc of docs) {
          for (const t of Object.values(doc.spec.tickets)) {
            if (actual.has(t.id)) violations.push(`ticket ${t.id} is in two volumes`);
            actual.set(t.id, `${doc.name} ${t.generation}`);
            if (t.type !== 'workload' || !owners.has(t.requestedBy.pvName ?? '') || !t.requestedBy.pvName?.startsWith(`${doc.name}-`)) {
              violations.push(`${doc.name}: ticket ${t.id} belongs to no worker: ${JSON.stringify(t)}`);
            }
          }
        }
        for (const [id, where] of expected) {
          if (actual.get(id) !== where)
            violations.push(`lost: ticket ${id} (${where}) is ${actual.has(id) ? `at ${actual.get(id)}` : 'missing'}`);
        }
        for (const [id, where] of actual)
          if (!expected.has(id)) violations.push(`unexpected: ticket ${id} (${where}) is held by no worker`);

        const sum = (f: (r: Report) => number) => reports.reduce((n, r) => n + f(r), 0);
        const counts: Record<string, number> = {};
        for (const r of reports) for (const [k, n] of Object.entries(r.counts)) counts[k] = (counts[k] ?? 0) + n;
        const phases = docs.flatMap((d) => Object.values(d.status.nodes).map((e) => e.phase)).join(',');
        console.log(
          `ledger storm (${kind.name} store, seed ${baseSeed}): processes=${reports.length} operations=${sum((r) => r.operations)} ` +
            `steps=${sum((r) => r.steps)} invariant checks=${sum((r) => r.checks)} writes=${sum((r) => r.writes)} ` +
            `conflicts retried=${sum((r) => r.conflicts)} tickets at end=${actual.size} (dead-node removals ${dead.size}) ` +
            `violations=${violations.length} in ${((Date.now() - started) / 1000).toFixed(1)}s`,
        );
        console.log(`ledger storm: ${JSON.stringify(counts)}; node phases at end: ${phases || 'none'}`);
        assert.deepEqual(violations, []);
        assert.equal(
          sum((r) => r.operations),
          STORM_WORKERS * STORM_OPERATIONS,
        );
        assert.ok(sum((r) => r.conflicts) > 0, 'no conflict at all: the workers did not race');
        for (const what of ['attached', 'release', 'node-is-down', 'read-only-many-seen'])
          assert.ok((counts[what] ?? 0) > 0, `never: ${what}`);
      },
    );

    it(
      `crash: workers SIGKILLed at random moments (${TARGET_KILLS}+ kills) leave sound documents and no wedge`,
      { timeout: 45_000 },
      async () => {
        const location = freshLocation(kind, 'crash');
        locations.push(location);
        const started = Date.now();
        let lives = 0;
        let kills = 0;
        let killedBusy = 0;
        let operations = 0;
        const failures: string[] = [];
        await Promise.all(
          Array.from({ length: CRASH_LANES }, async (_, lane) => {
            while (kills < TARGET_KILLS && failures.length === 0) {
              lives++;
              const seed = nextSeed();
              // The lane's worker ID is reused by every life, as a restarted kubelet finds its tickets again.
              const { child, out, done } = startWorker('chaos', kind, location, `c${lane}`, seed);
              const exited = done.then(() => undefined);
              if (Math.random() < 0.15) {
                await Promise.race([sleep(Math.random() * 80), exited]); // mostly while it starts
              } else {
                const ready = new Promise<void>((r) => {
                  const poll = setInterval(() => {
                    if (out.stdout.includes('ready')) {
                      clearInterval(poll);
                      r();
                    }
                  }, 2);
                  void done.then(() => clearInterval(poll));
                });
                await Promise.race([ready, exited, sleep(10_000)]);
                await Promise.race([sleep(Math.random() * 60), exited]);
              }
              child.kill('SIGKILL');
              const run = await done;
              operations += (run.stdout.match(/\./g) ?? []).length + (run.stdout.includes('ready') ? 1 : 0);
              if (run.signal === 'SIGKILL') {
                kills++;
                if (run.stdout.includes('ready')) killedBusy++;
              } else {
                failures.push(`worker c${lane} (seed ${seed}) exited by itself: code ${run.code} ${run.stderr}`);
              }
            }
          }),
        );
        assert.deepEqual(failures, []);

        const violations: string[] = [];
        const docs = await soundDocs(kind, location, violations);
        const lanes = new Set(VOLUMES.flatMap((v) => Array.from({ length: CRASH_LANES }, (_, l) => ownPvName(v, `c${l}`))));
        for (const doc of docs) {
          for (const t of Object.values(doc.spec.tickets)) {
            if (!lanes.has(t.requestedBy.pvName ?? '')) violations.push(`${doc.name}: ticket ${t.id} belongs to no worker`);
          }
        }
        const history = kind.history?.(location).length ?? 0;

        // No wedge: the next update of every volume goes through at once, and so does the one after it.
        const store = await kind.open(location);
        const ledger = new Ledger(store);
        let slowest = 0;
        const probe = {
          id: ticketId('admin', 'crash-probe', DRIVER, 'node-probe'),
          type: 'admin' as const,
          nodeID: 'node-probe',
          parameters: { readOnly: false },
          requestedBy: { pvName: 'crash-probe', admin: true },
        };
        for (const volume of VOLUMES) {
          for (const change of [
            (d: VolumeDoc | undefined) => (d ? addTicket(d, probe, ledger.now()) : d),
            (d: VolumeDoc | undefined) => (d ? removeTicket(d, probe.id, ledger.now()) : d),
          ]) {
            const t0 = Date.now();
            const doc = await ledger.update(volume, change);
            const ms = Date.now() - t0;
            slowest = Math.max(slowest, ms);
            assert.ok(ms < 1000, `${volume}: an update after the crashes took ${ms} ms`);
            if (doc) violations.push(...checkInvariants(doc, volume));
          }
          const doc = await ledger.get(volume);
          if (doc && !docs.some((d) => d.name === volume)) violations.push(`${volume} appeared from nowhere`);
          if (doc?.spec.tickets[probe.id]) violations.push(`${volume}: the probe ticket was not removed`);
        }
        await store.close();

        console.log(
          `ledger crash (${kind.name} store, seed ${baseSeed}): worker lives=${lives} kills=${kills} (after first operation: ${killedBusy}) ` +
            `operations completed=${operations} volumes=${docs.length} stored revisions checked=${history} ` +
            `slowest update after=${slowest}ms violations=${violations.length} in ${((Date.now() - started) / 1000).toFixed(1)}s`,
        );
        assert.deepEqual(violations, []);
        assert.ok(kills >= 100, `only ${kills} kills`);
        assert.ok(operations > kills, `only ${operations} operations completed`);
        assert.equal(docs.length, VOLUMES.length);
      },
    );

    it('restart: a new process sees exactly the state the last one wrote', { timeout: 20_000 }, async () => {
      assert.ok(locations.length > 0, 'the storm and crash tests left no store to restart on');
      let compared = 0;
      for (const location of locations) {
        const written = (await runWorker('touch', kind, location, 'r', RESTART_OPERATIONS)).stdout.trim();
        const reread = (await runWorker('dump', kind, location, 'd')).stdout.trim();
        assert.equal(reread, written, `${location}: a new process reads something else than the last writer wrote`);
        const store = await kind.open(location);
        const here = JSON.stringify((await new Ledger(store).list()).docs);
        await store.close();
        assert.equal(here, written, `${location}: this process reads something else than the last writer wrote`);
        const docs = JSON.parse(written) as VolumeDoc[];
        assert.deepEqual(
          docs.map((d) => d.name),
          VOLUMES,
        );
        assert.deepEqual(
          docs.flatMap((d) => checkInvariants(d, d.name)),
          [],
        );
        // The last writer's final write to each volume is what was read.
        for (const doc of docs) assert.ok(ticketId('maintenance', `${doc.name}-touch-r`, DRIVER, 'node-a') in doc.spec.tickets);
        compared += docs.length;
      }
      console.log(`ledger restart (${kind.name} store): stores=${locations.length} documents compared=${compared}, identical`);
    });
  });
}

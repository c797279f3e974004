// Crash test for the file store with real processes: writers doing compare-and-swap loops on shared keys are
// SIGKILLed at random moments, over and over; afterwards every document must parse, no committed write may be lost
// or reordered, no revision may have two writers, and the next write must go through at once.
import { after, before, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, utimesSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { FileStore, STALE_TEMP_MS } from '../../src/store/file.js';
import { bundleForNode } from '../fixtures/bundle.js';

// Must match test/fixtures/store-writer.ts.
const COUNTER_KEYS = ['counters/a', 'counters/b', 'counters/c'];
const CYCLE_KEY = 'cycles/x';
const LANES = 5;
const TARGET_KILLS = 150;

let work: string;
let writerJs: string;

before(async () => {
  work = mkdtempSync(join(tmpdir(), 'latch-store-crash-'));
  writerJs = join(work, 'store-writer.cjs');
  await bundleForNode('test/fixtures/store-writer.ts', writerJs);
});
after(() => {
  if (work) rmSync(work, { recursive: true, force: true });
});

// Unref'd, so a pending guard timer does not keep the test process alive once the writers are gone.
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms).unref());

interface Life {
  killed: boolean;
  sawReady: boolean;
  failure?: string;
}

/** Runs one writer and SIGKILLs it at a random moment: mostly while it is busy writing, sometimes while it starts. */
async function oneLife(stateDir: string, id: string): Promise<Life> {
  const child = spawn(process.execPath, [writerJs, stateDir, join(work, 'logs', `${id}.log`), id], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stderr = '';
  child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((r) =>
    child.on('exit', (code, signal) => r({ code, signal })),
  );
  let sawReady = false;
  const ready = new Promise<void>((r) =>
    child.stdout.setEncoding('utf8').on('data', (d: string) => {
      if (d.includes('ready')) {
        sawReady = true;
        r();
      }
    }),
  );
  if (Math.random() < 0.15) {
    await Promise.race([sleep(Math.random() * 80), exited]);
  } else {
    await Promise.race([ready, exited, sleep(10_000)]);
    await Promise.race([sleep(Math.random() * 40), exited]);
  }
  const killed = child.kill('SIGKILL');
  const { code, signal } = await exited;
  if (signal === 'SIGKILL') return { killed: true, sawReady };
  return { killed, sawReady, failure: `writer ${id} exited by itself (code ${code}, signal ${signal}): ${stderr}` };
}

function revisionsIn(dir: string): number[] {
  return readdirSync(dir)
    .filter((f) => /^\d+\.json$/.test(f))
    .map((f) => parseInt(f, 10))
    .sort((a, b) => a - b);
}

it('survives writers SIGKILLed at random moments', { timeout: 60_000 }, async () => {
  const stateDir = join(work, 'state');
  rmSync(join(work, 'logs'), { recursive: true, force: true });
  mkdirSync(join(work, 'logs'));
  const started = Date.now();

  let spawned = 0;
  let kills = 0;
  let killedBusy = 0;
  const failures: string[] = [];
  await Promise.all(
    Array.from({ length: LANES }, async (_, lane) => {
      while (kills < TARGET_KILLS && failures.length === 0) {
        const id = `w${lane}-${spawned++}`;
        const life = await oneLife(stateDir, id);
        if (life.killed) kills++;
        if (life.sawReady) killedBusy++;
        if (life.failure) failures.push(life.failure);
      }
    }),
  );
  assert.deepEqual(failures, []);

  // What the writers say they committed. A writer killed between its commit and its log line simply logs less.
  const violations: string[] = [];
  const owners = new Map<string, string>(); // "key revision" -> writer
  const highestLogged = new Map<string, number>();
  let logged = 0;
  for (const file of readdirSync(join(work, 'logs'))) {
    const writer = file.replace(/\.log$/, '');
    const lastRevision = new Map<string, number>();
    const text = readFileSync(join(work, 'logs', file), 'utf8');
    const lines = text.split('\n');
    lines.pop(); // the part after the last newline: empty, or a line cut short by the kill
    for (const line of lines) {
      const [op, key, revText, counterText] = line.split(' ');
      if (op === 'bad' || key === undefined) {
        violations.push(`${writer}: ${line}`);
        continue;
      }
      logged++;
      const revision = Number(revText);
      const slot = `${key} ${revision}`;
      if (owners.has(slot)) violations.push(`${slot} committed by both ${owners.get(slot)} and ${writer}`);
      owners.set(slot, writer);
      if (op === 'put' && key !== CYCLE_KEY && Number(counterText) !== revision) {
        violations.push(`${writer}: ${key} revision ${revision} committed counter ${counterText}`);
      }
      if ((lastRevision.get(key) ?? 0) >= revision) violations.push(`${writer}: ${key} went back to revision ${revision}`);
      lastRevision.set(key, revision);
      highestLogged.set(key, Math.max(highestLogged.get(key) ?? 0, revision));
    }
  }

  // What is on disk: every revision file parses and says its own revision; counters equal revisions (each write
  // incremented exactly the value it read), and nothing logged as committed is newer than what the store holds.
  const store = new FileStore(stateDir);
  let committed = 0;
  let leftoverTemps = 0;
  for (const key of [...COUNTER_KEYS, CYCLE_KEY]) {
    const dir = join(stateDir, key);
    for (const r of revisionsIn(dir)) {
      const doc = JSON.parse(readFileSync(join(dir, `${r}.json`), 'utf8')) as { revision: number; deleted: boolean };
      if (doc.revision !== r) violations.push(`${dir}/${r}.json says revision ${doc.revision}`);
    }
    leftoverTemps += readdirSync(dir).filter((f) => f.startsWith('.tmp-')).length;
    const top = Math.max(...revisionsIn(dir));
    committed += top;
    const cur = await store.get(key); // throws on a corrupt document
    if (key !== CYCLE_KEY) {
      const counter = (cur?.value as { counter: number }).counter;
      if (cur?.revision !== top || counter !== top) violations.push(`${key}: revision ${cur?.revision}, counter ${counter}, top ${top}`);
    }
    if ((highestLogged.get(key) ?? 0) > top) violations.push(`${key}: logged revision ${highestLogged.get(key)} but top is ${top}`);

    // No wedge: the next write goes through on the first try, at once.
    const t0 = Date.now();
    const next = key === CYCLE_KEY ? { writer: 'final' } : { counter: (cur!.value as { counter: number }).counter + 1 };
    assert.equal(await store.put(key, next, cur?.revision ?? 0), top + 1);
    assert.ok(Date.now() - t0 < 1000, `${key}: the first write after the crashes took ${Date.now() - t0} ms`);
  }

  // Once the killed writers' temp files are stale, the next write clears them and collects old revisions.
  const old = new Date(Date.now() - STALE_TEMP_MS - 5_000);
  for (const key of [...COUNTER_KEYS, CYCLE_KEY]) {
    const dir = join(stateDir, key);
    for (const f of readdirSync(dir).filter((f) => f.startsWith('.tmp-'))) utimesSync(join(dir, f), old, old);
    const cur = await store.get(key);
    const r = await store.put(key, cur?.value ?? { writer: 'final' }, cur?.revision ?? 0);
    // Numeric order: revisions 99 and 100 sort the other way round as text.
    assert.deepEqual(
      readdirSync(dir).sort((a, b) => parseInt(a, 10) - parseInt(b, 10)),
      [`${r - 1}.json`, `${r}.json`],
    );
  }

  console.log(
    `store crash test: writers spawned=${spawned} kills=${kills} (after first commit: ${killedBusy}) ` +
      `operations committed=${committed} (logged: ${logged}) leftover temp files=${leftoverTemps} ` +
      `violations=${violations.length} in ${((Date.now() - started) / 1000).toFixed(1)}s`,
  );
  assert.deepEqual(violations, []);
  assert.ok(kills >= 100, `only ${kills} kills`);
  assert.ok(logged > kills, `only ${logged} operations committed`);
});

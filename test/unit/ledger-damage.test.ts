// Damage stays local: one ledger document that does not read (not JSON, or not a latch/v1 volume) is named by whatever
// lists volumes (latch volume list, ticket list, node check, node fence, doctor, metrics, the agent's reaping and
// jobs), and everything else keeps working. Also: the metrics listener's address, the list's bounded reads, and that
// two scrapes at once count each call-log line once.
import assert from 'node:assert/strict';
import { appendFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { agent } from '../../src/cli/agent.js';
import { AGENT_TASKS, runAgentTasks } from '../../src/agent/tasks.js';
import { runLedgerChecks } from '../../src/doctor/run.js';
import type { CommandIO } from '../../src/cli/io.js';
import { LogFollower, type CallLogLine } from '../../src/agent/call-log.js';
import { LatchMetrics, readLedger } from '../../src/agent/metrics.js';
import { nodeCheck } from '../../src/cli/node/check.js';
import { nodeClearFences, nodeFence } from '../../src/cli/node/fence.js';
import { ticketList } from '../../src/cli/ticket/list.js';
import { volumeList } from '../../src/cli/volume/list.js';
import { loadConfig, parseConfig, type Config } from '../../src/config.js';
import { createContext } from '../../src/context.js';
import { StoreError } from '../../src/errors.js';
import { addTicket, newVolume } from '../../src/ledger/arbitrate.js';
import { volumeKey } from '../../src/ledger/keys.js';
import { Ledger } from '../../src/ledger/ledger.js';
import { FileStore } from '../../src/store/file.js';
import type { Store } from '../../src/store/types.js';

const work = mkdtempSync(join(tmpdir(), 'latch-damage-'));
after(() => rmSync(work, { recursive: true, force: true }));

const NOW = '2026-01-01T00:00:00.000Z';
const PAST = '2025-12-31T00:00:00.000Z';
const GiB = 1024 ** 3;
let dirs = 0;

/**
 * A file-store ledger with two good volumes (good-a with an expired admin ticket of node-x, good-b detached) and two
 * damaged ones: bad-json (its revision file is not JSON) and bad-shape (JSON, but not a latch/v1 volume).
 */
async function damagedLedger(
  extra: Record<string, unknown> = {},
): Promise<{ store: FileStore; config: Config; io: CommandIO; printed: () => string }> {
  const dir = join(work, `case-${++dirs}`);
  const stateDir = join(dir, 'state');
  const store = new FileStore(stateDir);
  const goodA = addTicket(
    newVolume('good-a', GiB, 'ext4', NOW),
    { id: 'admin-x', type: 'admin', nodeID: 'node-x', parameters: { readOnly: false }, requestedBy: {}, expiresAt: PAST },
    NOW,
  );
  await store.put(volumeKey('good-a'), goodA, 0);
  await store.put(volumeKey('good-b'), newVolume('good-b', GiB, 'ext4', NOW), 0);
  await store.put(volumeKey('bad-shape'), { apiVersion: 'something/else', name: 'bad-shape' }, 0);
  mkdirSync(join(stateDir, 'volumes', 'bad-json'), { recursive: true });
  writeFileSync(join(stateDir, 'volumes', 'bad-json', '1.json'), '{"revision":1,"deleted":false,"value":{"apiVers');
  const fields = { nodeName: 'node-x', stateDir, poolDir: join(dir, 'pool'), logFile: join(dir, 'latch.log'), ...extra };
  const configFile = join(dir, 'config.json');
  writeFileSync(configFile, JSON.stringify(fields));
  let printed = '';
  const io: CommandIO = {
    env: { LATCH_CONFIG: configFile },
    out: (text) => {
      printed += text;
    },
    context: (config) => createContext(config, { store }),
  };
  return { store, config: loadConfig(io.env), io, printed: () => printed };
}

describe('one damaged ledger document among good ones', () => {
  it('Ledger.list names it, with why, and returns the others', async () => {
    const { store } = await damagedLedger();
    const { docs, damaged } = await new Ledger(store).list();
    assert.deepEqual(
      docs.map((d) => d.name),
      ['good-a', 'good-b'],
    );
    assert.deepEqual(
      damaged.map((d) => d.name),
      ['bad-json', 'bad-shape'],
    );
    assert.match(damaged[0]?.reason ?? '', /corrupt \(not valid JSON/);
    assert.match(damaged[1]?.reason ?? '', /not a latch\/v1 volume/);
  });

  it('a store that cannot answer still fails the whole list (that is not damage of one document)', async () => {
    const store = fakeStore(['a', 'b'], async () => {
      throw new StoreError('etcd store: no endpoint answered');
    });
    await assert.rejects(new Ledger(store).list(), /no endpoint answered/);
  });

  it('latch volume list shows it as damaged, lists the rest, and exits 1', async () => {
    const { io, printed } = await damagedLedger();
    assert.equal(await volumeList({ output: 'table' }, io), 1);
    assert.match(printed(), /^good-b +- +1Gi .* detached/m);
    assert.match(printed(), /^bad-json +\? +- +- +damaged/m);
    assert.match(printed(), /^volume bad-shape: damaged: .*not a latch\/v1 volume/m);
  });

  it('latch volume list -o json names it as { name, damaged }', async () => {
    const { io, printed } = await damagedLedger();
    assert.equal(await volumeList({ output: 'json' }, io), 1);
    const listed = JSON.parse(printed()) as Array<{ name: string; damaged?: string }>;
    assert.deepEqual(
      listed.map((v) => [v.name, typeof v.damaged]),
      [
        ['good-a', 'undefined'],
        ['good-b', 'undefined'],
        ['bad-json', 'string'],
        ['bad-shape', 'string'],
      ],
    );
  });

  it('latch ticket list lists the good tickets and names the damaged volumes', async () => {
    const { io, printed } = await damagedLedger();
    assert.equal(await ticketList({ output: 'table' }, io), 1);
    assert.match(printed(), /^good-a +admin-x/m);
    assert.match(printed(), /^volume bad-json: its tickets cannot be read/m);
  });

  it('latch node check does not let the node go while a document cannot be read', async () => {
    const { io, printed } = await damagedLedger();
    // node-y is named by no good document: only the damaged ones keep it.
    assert.equal(await nodeCheck({ node: 'node-y', output: 'table' }, io), 1);
    assert.match(printed(), /may not be drained or deleted yet: 0 volume\(s\) still name it, and 2 volume document\(s\) cannot be read/);
    assert.match(printed(), /^volume bad-json: its document cannot be read/m);
  });

  it('latch node fence over all volumes neither fences nor releases a damaged one: it names it and fails', async () => {
    const { io, printed, store } = await damagedLedger({
      backend: { type: 'rbd', pool: 'latch', fencer: { clientId: 'latch-fencer', keyring: '/etc/ceph/f.keyring' } },
      // The rbd backend on the file store is for one node only (unsafeConfigReason).
      singleNode: 'node-x',
    });
    const before = JSON.stringify(await store.get(volumeKey('bad-shape')));
    // node-y holds no good volume, so the fencer is never called; the damaged ones cannot say.
    assert.equal(await nodeFence({ node: 'node-y' }, io), 1);
    assert.match(printed(), /^volume bad-json: not fenced, nothing released: .*what it records of node node-y is unknown/m);
    assert.match(printed(), /^volume bad-shape: not fenced, nothing released: .*repeat this with --volume bad-shape$/m);
    assert.doesNotMatch(printed(), /nothing to fence/);
    assert.equal(JSON.stringify(await store.get(volumeKey('bad-shape'))), before, 'the damaged document is left as it was');
  });

  it('latch node clear-fences names it and fails, rather than say there is no fence to clear', async () => {
    const { io, printed } = await damagedLedger();
    assert.equal(await nodeClearFences({}, io), 1);
    assert.match(printed(), /^volume bad-json: nothing cleared: .*then run this again$/m);
    assert.doesNotMatch(printed(), /has no fence to clear/);
  });

  it("doctor's ledger checks name it as an error and still count the others", async () => {
    const { io, config } = await damagedLedger();
    const findings = await runLedgerChecks(io.context(config), config);
    assert.ok(findings.some((f) => f.check === 'ledger' && f.severity === 'ok' && /^2 volume\(s\) in the ledger/.test(f.message)));
    const damaged = findings.filter((f) => f.severity === 'error' && /cannot be read/.test(f.message)).map((f) => f.message);
    assert.equal(damaged.length, 2, JSON.stringify(findings));
    assert.match(damaged[0] ?? '', /volume bad-json/);
    assert.match(damaged[1] ?? '', /volume bad-shape/);
  });

  it('metrics: the ledger is up, the good volumes are counted and the damaged ones named', async () => {
    const { io, config } = await damagedLedger();
    const m = await LatchMetrics.create();
    await readLedger(m, io.context(config));
    const text = await m.text();
    assert.match(text, /^latch_ledger_up 1$/m);
    assert.match(text, /^latch_volumes\{state="detached"\} 1$/m);
    assert.match(text, /^latch_volumes\{state="attaching"\} 1$/m, 'good-a, granted to node-x');
    assert.match(text, /^latch_ledger_damaged_documents\{volume="bad-json"\} 1$/m);
    assert.match(text, /^latch_ledger_damaged_documents\{volume="bad-shape"\} 1$/m);
  });

  it("the agent's reaping reaps the good volumes and logs the damaged ones by name", async () => {
    const { io, config, store } = await damagedLedger();
    const reap = AGENT_TASKS.filter((t) => t.name === 'reap-tickets');
    assert.equal(reap.length, 1);
    await runAgentTasks(config, () => io.context(config), await LatchMetrics.create(), reap);
    const goodA = await new Ledger(store).get('good-a');
    assert.deepEqual(Object.keys(goodA?.spec.tickets ?? { missing: true }), [], 'the expired ticket was reaped');
    const lines = readFileSync(config.logFile, 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    assert.ok(lines.some((l) => l.agent === 'reap-tickets' && l.volume === 'good-a' && Array.isArray(l.automatic)));
    for (const name of ['bad-json', 'bad-shape']) {
      assert.ok(
        lines.some((l) => l.agent === 'reap-tickets' && l.volume === name && /^skipped: /.test(String(l.error))),
        `${name} is named in the log`,
      );
    }
    assert.ok(!lines.some((l) => l.agent === 'reap-tickets' && l.volume === undefined && l.error !== undefined), 'the task did not fail');
  });
});

describe('Ledger.list reads with bounded concurrency', () => {
  it('never more than 8 documents in flight, and every one read', async () => {
    const names = Array.from({ length: 40 }, (_, i) => `v-${String(i).padStart(2, '0')}`);
    let inFlight = 0;
    let most = 0;
    const store = fakeStore(names, async (key) => {
      inFlight++;
      most = Math.max(most, inFlight);
      await new Promise((resolve) => setTimeout(resolve, 2));
      inFlight--;
      const name = key.slice('volumes/'.length);
      return { value: newVolume(name, GiB, 'ext4', NOW), revision: 1 };
    });
    const { docs, damaged } = await new Ledger(store).list();
    assert.deepEqual(
      docs.map((d) => d.name),
      names,
      'all read, in name order',
    );
    assert.deepEqual(damaged, []);
    assert.ok(most <= 8, `at most 8 reads at once, saw ${most}`);
    assert.ok(most > 1, `reads do overlap, saw ${most}`);
  });
});

describe('the metrics endpoint', () => {
  it('two reads of the call log at once count each line once', async () => {
    const logFile = join(work, 'follower.log');
    writeCallLines(logFile, 100);
    const follower = new LogFollower(logFile);
    let counted = 0;
    const count = (line: CallLogLine) => {
      if (line.op) counted++;
    };
    await Promise.all([follower.readNew(count), follower.readNew(count)]);
    assert.equal(counted, 100);
    writeCallLines(logFile, 5);
    await Promise.all([follower.readNew(count), follower.readNew(count), follower.readNew(count)]);
    assert.equal(counted, 105, 'and the lines appended later, once');
  });

  it('two concurrent scrapes of the agent over 100 call-log lines count 100', async () => {
    const { io, config } = await damagedLedger({ agent: { listen: '127.0.0.1:0', intervalSeconds: 3600 } });
    writeCallLines(config.logFile, 100);
    const stop = new AbortController();
    let listening!: (address: string) => void;
    const address = new Promise<string>((resolve) => (listening = resolve));
    const running = agent({ signal: stop.signal, onListening: listening }, io);
    try {
      const url = `http://${await address}/metrics`;
      const [a, b] = await Promise.all([fetch(url).then((r) => r.text()), fetch(url).then((r) => r.text())]);
      const text = await (await fetch(url)).text();
      assert.match(
        text,
        /^latch_driver_calls_total\{op="mountdevice",status="Success"\} 100$/m,
        'counted once, whichever scrape read them',
      );
      for (const body of [a, b]) assert.match(body, /^latch_ledger_damaged_documents\{volume="bad-json"\} 1$/m);
    } finally {
      stop.abort();
      await running;
    }
  });

  it('listens on 127.0.0.1 unless the configuration says otherwise', async () => {
    const base = { nodeName: 'n', stateDir: '/tmp/x', poolDir: '/tmp/y', logFile: '/tmp/z.log' };
    assert.equal(parseConfig(base, 'test').agent.listen, '127.0.0.1:9742');
    assert.equal(parseConfig({ ...base, agent: { intervalSeconds: 5 } }, 'test').agent.listen, '127.0.0.1:9742');
    assert.equal(parseConfig({ ...base, agent: { listen: '0.0.0.0:9742' } }, 'test').agent.listen, '0.0.0.0:9742');
  });
});

/** A store that lists `names` as volumes and reads each through `get`. */
function fakeStore(names: string[], get: Store['get']): Store {
  return {
    kind: 'etcd',
    get,
    put: () => Promise.reject(new Error('read only')),
    delete: () => Promise.reject(new Error('read only')),
    list: async () => [...names],
    close: async () => undefined,
  };
}

function writeCallLines(logFile: string, n: number): void {
  const line = `${JSON.stringify({ time: NOW, op: 'mountdevice', status: 'Success', durationMs: 20 })}\n`;
  appendFileSync(logFile, line.repeat(n));
}

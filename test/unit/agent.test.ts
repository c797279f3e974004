// Issue 15: `latch agent` serves /metrics over HTTP while it runs its periodic tasks, and stops cleanly; `latch
// metrics` prints the same metrics once. Both run as functions with a CommandIO over a fake node and an in-memory
// ledger (no root needed).
import assert from 'node:assert/strict';
import { appendFileSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { after, describe, it } from 'node:test';
import { agent } from '../../src/cli/agent.js';
import type { CommandIO } from '../../src/cli/io.js';
import { metrics } from '../../src/cli/metrics.js';
import { createContext } from '../../src/context.js';
import { Cluster, attachAndWait, pvOptions, succeeded } from '../fixtures/op-harness.js';

const work = mkdtempSync(join(tmpdir(), 'latch-agent-'));
after(() => rmSync(work, { recursive: true, force: true }));

/** node-a of a cluster, as an admin command sees it: its config file, and contexts over the cluster's store. */
function nodeIO(cluster: Cluster, listen = '127.0.0.1:0') {
  const nodeA = cluster.node('node-a');
  const configFile = join(work, `config-${Math.random().toString(36).slice(2)}.json`);
  writeFileSync(configFile, JSON.stringify({ ...nodeA.config, source: undefined, agent: { listen, intervalSeconds: 1 } }));
  let printed = '';
  const io: CommandIO = {
    env: { LATCH_CONFIG: configFile },
    out: (text) => {
      printed += text;
    },
    context: (config) => createContext(config, { store: cluster.store, backend: nodeA.fake.backend, system: nodeA.fake.system }),
  };
  return { io, nodeA, printed: () => printed };
}

describe('latch agent and latch metrics', () => {
  it('serves /metrics while it runs its tasks (a stale hold of its node released), 404 elsewhere, and stops on abort', async () => {
    const cluster = new Cluster();
    const cp = cluster.node('cp');
    const { io, nodeA } = nodeIO(cluster);
    const device = await attachAndWait(cp, nodeA, pvOptions('pv-1'));
    nodeA.fake.devices.delete(device); // the device is gone (a reboot) ...
    succeeded(await cp.call('detach', ['pv-1', 'node-a'])); // ... and the controller detached the volume
    writeCallLine(nodeA.config.logFile, 'waitforattach', 'Success', 120);

    const stop = new AbortController();
    let listening!: (address: string) => void;
    const address = new Promise<string>((resolve) => (listening = resolve));
    const running = agent({ signal: stop.signal, onListening: listening }, io);
    const base = `http://${await address}`;
    let text = '';
    // The first round runs right after listening; wait for its release to show (no sleeping on a timer).
    for (let i = 0; i < 200 && !/^latch_automatic_releases_total 1$/m.test(text); i++) {
      const res = await fetch(`${base}/metrics`);
      assert.equal(res.status, 200);
      assert.match(res.headers.get('content-type') ?? '', /^text\/plain; version=0\.0\.4/);
      text = await res.text();
      await new Promise((r) => setImmediate(r));
    }
    assert.match(text, /^latch_automatic_releases_total 1$/m, 'the agent released the stale hold and counted it');
    assert.match(text, /^latch_volumes\{state="detached"\} 1$/m);
    assert.match(text, /^latch_driver_calls_total\{op="waitforattach",status="Success"\} 1$/m, 'calls come from the log file');
    assert.equal((await fetch(`${base}/other`)).status, 404);

    stop.abort();
    await running;
    await assert.rejects(fetch(`${base}/metrics`), 'the server is closed');
  });

  it('latch metrics prints the same metrics once', async () => {
    const cluster = new Cluster();
    const { io, nodeA, printed } = nodeIO(cluster);
    await attachAndWait(cluster.node('cp'), nodeA, pvOptions('pv-1'));
    writeCallLine(nodeA.config.logFile, 'mountdevice', 'Failure', 30);
    await metrics({}, io);
    assert.match(printed(), /^latch_volumes\{state="attached"\} 1$/m);
    assert.match(printed(), /^latch_driver_calls_total\{op="mountdevice",status="Failure"\} 1$/m);
    assert.match(printed(), /^latch_driver_call_duration_seconds_bucket\{le="0.05",op="mountdevice"\} 1$/m);
  });
});

/** The line the driver writes for a call (src/protocol/driver.ts); the harness runs ops without it. */
function writeCallLine(logFile: string, op: string, status: string, durationMs: number): void {
  mkdirSync(dirname(logFile), { recursive: true });
  appendFileSync(logFile, `${JSON.stringify({ time: new Date().toISOString(), op, status, durationMs })}\n`);
}

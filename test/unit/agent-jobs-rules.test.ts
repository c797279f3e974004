// The job runner's rules and the requester's side without root (docs/jobs.md): simulated nodes with fake kernels over
// one in-memory ledger (test/fixtures/op-harness.ts), the runner driven pass by pass. A failed job is finished with
// its message and lets go of the device it set up, but never of a pod's; a job preempted after its agent was killed
// is let go of so the pod's ticket wins; which node a job goes to; --no-wait; no agent taking the job up.
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { listBackups } from '../../src/backup/manifest.js';
import { JobRunner } from '../../src/jobs/runner.js';
import { JobInterruptedError } from '../../src/errors.js';
import { jobNode, jobRequest, requestAndWait } from '../../src/jobs/request.js';
import { finishedJob, nodeHoldsDevice } from '../../src/ledger/arbitrate.js';
import { volumeKey } from '../../src/ledger/keys.js';
import type { JobSpec } from '../../src/ledger/types.js';
import { setUpDevice } from '../../src/node/device.js';
import { backupJob } from '../../src/node/jobs/backup.js';
import { Cluster, GiB, type TestNode } from '../fixtures/op-harness.js';

const snapshot = (name: string): JobSpec => ({ kind: 'snapshot', snapshot: name });

/** A volume with storage in the shared pool and a ledger document. */
async function volume(cluster: Cluster, name: string): Promise<void> {
  await cluster.ledger.createVolume(name, { sizeBytes: GiB, fsType: 'ext4' });
  cluster.node('node-a').fake.addVolume(name, GiB, 'ext4');
}

/** A pod's ticket on `node`, with the device set up there (as waitforattach leaves it). */
async function podOn(node: TestNode, name: string): Promise<string> {
  const id = `workload-${name}-${node.name}`;
  const ctx = node.context();
  await ctx.ledger.addTicket(name, {
    id,
    type: 'workload',
    nodeID: node.name,
    parameters: { readOnly: false },
    requestedBy: { pvName: name },
  });
  await ctx.ledger.claimGrant(name, node.name);
  const doc = await ctx.ledger.get(name);
  assert.ok(doc);
  await setUpDevice(ctx, name, doc);
  return id;
}

/** A pod's ticket on `node`, before its device is set up (attach has run, waitforattach not yet). */
async function podTicketOn(node: TestNode, name: string): Promise<void> {
  await node.context().ledger.addTicket(name, {
    id: `workload-${name}-${node.name}`,
    type: 'workload',
    nodeID: node.name,
    parameters: { readOnly: false },
    requestedBy: { pvName: name },
  });
}

/** Runs passes of node's runner until the ticket is gone (or `passes` are done), waiting for its jobs each time. */
async function runUntilFinished(node: TestNode, name: string, ticket: string, passes = 5): Promise<void> {
  const runner = new JobRunner(
    () => node.context(),
    () => undefined,
  );
  for (let i = 0; i < passes; i++) {
    await runner.pass();
    await runner.settle();
    if (!(await node.cluster.mustDoc(name)).spec.tickets[ticket]) return;
  }
}

describe('the job runner', () => {
  it('a job that fails is finished with its message, and the device it set up is released', async () => {
    const cluster = new Cluster();
    const a = cluster.node('node-a');
    await volume(cluster, 'v1');
    const request = jobRequest(a.context(), 'v1', snapshot('s1'), 'node-a');
    await a.context().ledger.requestJob('v1', request);
    await runUntilFinished(a, 'v1', request.id);

    const doc = await cluster.mustDoc('v1');
    assert.deepEqual(Object.keys(doc.spec.tickets), []);
    assert.deepEqual(doc.status.nodes, {});
    const done = finishedJob(doc, request.id);
    assert.equal(done?.status.state, 'failed');
    assert.match(done?.status.message ?? '', /cannot take snapshots/, 'the fake backend has no snapshots');
    assert.equal(done?.status.attempts, 1);
    assert.ok(a.fake.callsOf('attach').length > 0, 'the device was set up for the job');
    assert.equal(a.fake.devices.size, 0, 'and released');
  });

  it("a job beside a pod on its node never releases the pod's device", async () => {
    const cluster = new Cluster({ config: { backupTarget: undefined } });
    const b = cluster.node('node-b');
    await volume(cluster, 'v2');
    const pod = await podOn(b, 'v2');
    const request = jobRequest(b.context(), 'v2', { kind: 'backup', backup: 'b1' }, 'node-b');
    await b.context().ledger.requestJob('v2', request);
    await runUntilFinished(b, 'v2', request.id);

    const doc = await cluster.mustDoc('v2');
    assert.deepEqual(Object.keys(doc.spec.tickets), [pod]);
    assert.equal(doc.status.nodes['node-b']?.phase, 'attached');
    assert.equal(b.fake.devices.size, 1, "the pod's device stays");
    assert.match(finishedJob(doc, request.id)?.status.message ?? '', /no backup target is configured on node node-b/);
  });

  it("a job preempted after its agent was killed: the next agent lets go, so the pod's ticket wins", async () => {
    const cluster = new Cluster();
    const a = cluster.node('node-a');
    const b = cluster.node('node-b');
    await volume(cluster, 'v3');
    const ctx = a.context();
    const request = jobRequest(ctx, 'v3', snapshot('s3'), 'node-a');
    await ctx.ledger.requestJob('v3', request);
    // What a killed agent left: the job running, the device set up.
    await ctx.ledger.startJob('v3', request.id, 'node-a');
    await ctx.ledger.claimGrant('v3', 'node-a');
    await setUpDevice(ctx, 'v3', await cluster.mustDoc('v3'));
    // A pod's ticket on node-b preempts the snapshot (workload 900 > snapshot 800).
    const pod = 'workload-v3-b';
    await b.context().ledger.addTicket('v3', {
      id: pod,
      type: 'workload',
      nodeID: 'node-b',
      parameters: { readOnly: false },
      requestedBy: { pvName: 'v3' },
    });
    assert.equal((await cluster.mustDoc('v3')).status.tickets[pod]?.satisfied, false, 'not before node-a lets go');

    const runner = new JobRunner(
      () => a.context(),
      () => undefined,
    );
    await runner.pass();
    await runner.settle();
    const doc = await cluster.mustDoc('v3');
    assert.equal(a.fake.devices.size, 0, "node-a's device is released");
    assert.equal(doc.status.tickets[pod]?.satisfied, true, "the pod's ticket is granted");
    assert.equal(doc.status.tickets[request.id]?.satisfied, false, 'the snapshot waits');
    assert.equal(doc.status.tickets[request.id]?.job?.state, 'running', 'to be started again later');
  });
});

describe('the job runner, when a ticket is removed while its job runs', () => {
  it('aborts the job and releases the device it set up', async () => {
    const target = mkdtempSync(join(tmpdir(), 'latch-jobs-target-'));
    try {
      const cluster = new Cluster({ config: { backupTarget: { type: 'dir', path: target } } });
      const a = cluster.node('node-a');
      await volume(cluster, 'v7');
      const request = jobRequest(a.context(), 'v7', { kind: 'backup', backup: 'b7' }, 'node-a');
      await a.context().ledger.requestJob('v7', request);
      // The backup handler asks whether the device is mounted before it reads it: hold it there.
      let reached!: () => void;
      const atCheck = new Promise<void>((resolve) => (reached = resolve));
      let goOn!: () => void;
      const held = new Promise<void>((resolve) => (goOn = resolve));
      a.fake.intercept('isDeviceMounted', async () => {
        reached();
        await held;
      });
      const signals: string[] = [];
      const runner = new JobRunner(
        () => a.context(),
        (entry) => signals.push(typeof entry.message === 'string' ? entry.message : ''),
      );
      await runner.pass();
      await atCheck;
      assert.equal(a.fake.devices.size, 1, 'the job set the device up');
      await cluster.ledger.removeTicket('v7', request.id);
      await runner.pass(); // sees the ticket gone: aborts the job
      goOn();
      await runner.settle();

      const doc = await cluster.mustDoc('v7');
      assert.equal(a.fake.devices.size, 0, 'the device is released');
      assert.deepEqual(doc.status.nodes, {}, 'and the release confirmed');
      assert.ok(
        signals.some((m) => /interrupted \(its ticket was removed\)/.test(m)),
        signals.join(' | '),
      );
      assert.deepEqual(await listBackups({ type: 'dir', path: target }), [], 'nothing was published');
    } finally {
      rmSync(target, { recursive: true, force: true });
    }
  });
});

describe('the job runner, when the document of a volume whose job runs cannot be read', () => {
  it('neither aborts the job nor starts it again, says so once, and the job goes on once the document reads again', async () => {
    const target = mkdtempSync(join(tmpdir(), 'latch-jobs-damaged-'));
    try {
      const cluster = new Cluster({ config: { backupTarget: { type: 'dir', path: target } } });
      const a = cluster.node('node-a');
      await volume(cluster, 'v8');
      const request = jobRequest(a.context(), 'v8', { kind: 'backup', backup: 'b8' }, 'node-a');
      await a.context().ledger.requestJob('v8', request);
      let reached!: () => void;
      const atCheck = new Promise<void>((resolve) => (reached = resolve));
      let goOn!: () => void;
      const held = new Promise<void>((resolve) => (goOn = resolve));
      a.fake.intercept('isDeviceMounted', async () => {
        reached();
        await held;
      });
      const logged: Array<Record<string, unknown>> = [];
      const runner = new JobRunner(
        () => a.context(),
        (entry) => logged.push(entry),
      );
      await runner.pass();
      await atCheck;
      // Damaged under the running job: JSON, but not a latch/v1 volume.
      const good = await cluster.store.get(volumeKey('v8'));
      assert.ok(good);
      const revision = await cluster.store.put(volumeKey('v8'), { apiVersion: 'latch/v0' }, good.revision);
      await runner.pass();
      await runner.pass();
      assert.equal(runner.active, 1, 'the job still runs');
      assert.equal(logged.filter((e) => e.volume === 'v8' && /^its jobs wait: /.test(String(e.error))).length, 1, JSON.stringify(logged));
      assert.ok(!logged.some((e) => /interrupted/.test(String(e.message))), JSON.stringify(logged));
      // Repaired: the job finishes as usual.
      await cluster.store.put(volumeKey('v8'), good.value, revision);
      goOn();
      await runner.settle();
      assert.deepEqual(Object.keys((await cluster.mustDoc('v8')).spec.tickets), [], 'the job finished');
      // It ran to its own end (here the fake device cannot be read), in its first attempt, never interrupted.
      const [outcome, ...others] = (await cluster.mustDoc('v8')).status.jobs ?? [];
      assert.deepEqual(others, []);
      assert.equal(outcome?.status.attempts, 1);
      assert.match(outcome?.status.message ?? '', /\/dev\/fake0 does not exist/);
    } finally {
      rmSync(target, { recursive: true, force: true });
    }
  });
});

describe('the backup job, when a pod asks for the volume on its node while it reads the device', () => {
  it('publishes nothing and is interrupted (redone by the runner), not failed', async () => {
    const work = mkdtempSync(join(tmpdir(), 'latch-jobs-pod-'));
    try {
      const target = join(work, 'target');
      mkdirSync(target);
      const cluster = new Cluster({ config: { backupTarget: { type: 'dir', path: target } } });
      const a = cluster.node('node-a');
      await volume(cluster, 'v9');
      const ctx = a.context();
      const request = jobRequest(ctx, 'v9', { kind: 'backup', backup: 'b9' }, 'node-a');
      const doc = await ctx.ledger.requestJob('v9', request);
      assert.ok(doc);
      // The device the runner set up for the job alone: a plain file with some data stands in for it.
      const device = join(work, 'device');
      writeFileSync(device, Buffer.alloc(8 << 20, 7));
      // The handler checks that nothing mounts the device just before it reads it: the pod's ticket arrives then.
      a.fake.intercept(
        'isDeviceMounted',
        async () => {
          await podTicketOn(a, 'v9');
        },
        1,
      );
      const ticket = doc.spec.tickets[request.id];
      assert.ok(ticket);
      await assert.rejects(
        backupJob.run({ kind: 'backup', backup: 'b9' }, { ctx, volume: 'v9', ticket, doc, device, signal: new AbortController().signal }),
        (err: unknown) => err instanceof JobInterruptedError && /asked for by a pod while its device was being read/.test(err.message),
      );
      assert.deepEqual(await listBackups({ type: 'dir', path: target }), [], 'nothing was published');
    } finally {
      rmSync(work, { recursive: true, force: true });
    }
  });
});

describe('requesting a job', () => {
  it('goes to the node that holds the volume; --node elsewhere is refused; an idle volume goes to --node or this node', async () => {
    const cluster = new Cluster();
    const a = cluster.node('node-a');
    await volume(cluster, 'v4');
    const ctx = a.context();
    assert.equal(jobNode(ctx, 'v4', await cluster.mustDoc('v4')), 'node-a');
    assert.equal(jobNode(ctx, 'v4', await cluster.mustDoc('v4'), 'node-c'), 'node-c');
    await podOn(cluster.node('node-b'), 'v4');
    const inUse = await cluster.mustDoc('v4');
    assert.equal(jobNode(ctx, 'v4', inUse), 'node-b');
    assert.throws(
      () => jobNode(ctx, 'v4', inUse, 'node-a'),
      /volume v4 is in use on node node-b: a job on it runs there, not on node node-a/,
    );
  });

  it('--no-wait returns the ticket; with no agent to take a granted job up, it is taken back and the error says so', async () => {
    const cluster = new Cluster();
    const a = cluster.node('node-a');
    await volume(cluster, 'v5');
    const ctx = a.context();
    const request = jobRequest(ctx, 'v5', snapshot('s5'), 'node-a');
    assert.deepEqual(await requestAndWait(ctx, 'v5', request, { wait: false, timeoutMs: 1000 }), {
      outcome: 'requested',
      ticket: request.id,
      node: 'node-a',
    });
    assert.ok((await cluster.mustDoc('v5')).spec.tickets[request.id]);
    // Asking again finds the same ticket; nobody takes it up.
    await assert.rejects(
      requestAndWait(ctx, 'v5', request, { wait: true, timeoutMs: 60_000, pickupMs: 300 }),
      /no latch agent on node node-a took the job up in 0 s: is `latch agent` running there\? \(its ticket was removed\)/,
    );
    assert.deepEqual(Object.keys((await cluster.mustDoc('v5')).spec.tickets), []);
    await assert.rejects(requestAndWait(ctx, 'nope', request, { wait: false, timeoutMs: 1000 }), /volume nope does not exist/);
  });

  it('after a restore failed, waits for its node to let go of the volume (so that deleting it is not refused), but not for ever', async () => {
    for (const letsGo of [true, false]) {
      const cluster = new Cluster();
      const ctx = cluster.node('node-a').context();
      const name = letsGo ? 'v7' : 'v8';
      const request = jobRequest(ctx, name, { kind: 'restore', backup: 'b7' }, 'node-a');
      let returned = 0;
      const waited = requestAndWait(ctx, name, request, {
        wait: true,
        timeoutMs: 60_000,
        create: { sizeBytes: GiB, fsType: 'ext4' },
        letGoMs: letsGo ? 60_000 : 500,
      }).finally(() => (returned = Date.now()));
      // The agent's side: grant claimed, device set up, the job started and failed; the device let go of 700 ms later.
      for (let i = 0; i < 100 && (await ctx.ledger.get(name))?.spec.tickets[request.id] === undefined; i++) await sleep(10);
      await ctx.ledger.claimGrant(name, 'node-a');
      await ctx.ledger.recordDevice(name, 'node-a', '/dev/loop7');
      await ctx.ledger.startJob(name, request.id, 'node-a');
      await ctx.ledger.recordJob(name, request.id, { state: 'failed', message: 'chunk 3 is corrupt' });
      const failedAt = Date.now();
      await sleep(700);
      if (letsGo) {
        assert.equal(returned, 0, 'still waiting while node-a holds the volume');
        await ctx.ledger.confirmRelease(name, 'node-a');
        assert.equal(nodeHoldsDevice(await cluster.mustDoc(name), 'node-a'), false);
      }
      const result = await waited;
      assert.ok(result.outcome === 'held' && result.status.state === 'failed', JSON.stringify(result));
      if (letsGo) assert.ok(returned - failedAt >= 700, 'returned once node-a let go');
      else {
        // letGoMs (500 ms) after it saw the failure, at its next look (a poll a second, this store having no watch).
        assert.ok(returned - failedAt < 4000, `returned after letGoMs though node-a still holds it (${returned - failedAt} ms)`);
        assert.equal(nodeHoldsDevice(await cluster.mustDoc(name), 'node-a'), true);
      }
    }
  });

  it('waits for the outcome the agent records; an outcome of the same job from before the request does not count', async () => {
    const cluster = new Cluster();
    const a = cluster.node('node-a');
    await volume(cluster, 'v6');
    const ctx = a.context();
    const request = jobRequest(ctx, 'v6', snapshot('s6'), 'node-a');
    // An earlier run of the same job, finished (failed).
    await ctx.ledger.requestJob('v6', request);
    await runUntilFinished(a, 'v6', request.id);
    const earlier = finishedJob(await cluster.mustDoc('v6'), request.id);
    assert.equal(earlier?.status.state, 'failed');

    const runner = new JobRunner(
      () => a.context(),
      () => undefined,
    );
    let stop = false;
    const agent = (async () => {
      while (!stop) {
        await runner.pass();
        await runner.settle();
        await new Promise((r) => setTimeout(r, 50));
      }
    })();
    try {
      const result = await requestAndWait(ctx, 'v6', request, { wait: true, timeoutMs: 60_000 });
      assert.equal(result.outcome, 'finished');
      assert.ok(result.outcome === 'finished' && result.job.status.startedAt >= (earlier?.status.startedAt ?? ''));
      assert.notDeepEqual(result.outcome === 'finished' && result.job, earlier, 'the new run, not the earlier one');
    } finally {
      stop = true;
      await agent;
    }
  });
});

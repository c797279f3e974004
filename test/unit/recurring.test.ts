// Recurring jobs (config.recurringJobs, src/jobs/recurring.ts): the configuration refuses bad jobs; the agent
// task asks for each job's latest due slot once per volume, by a fake clock, and never for a backlog; two agents
// racing for a slot end with one ticket; retention, applied only by the agent of the node that did the job, keeps
// exactly `retain` of the job's own snapshots and never touches other names. Over a memory store and loop backends
// on a shared temp pool (snapshots of image files: no loop device is set up). The bundle's croner and the agent as a
// process are in test/integration/recurring-agent.test.ts.
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import type { LoopBackend } from '../../src/backend/loop.js';
import { createBackup } from '../../src/backup/create.js';
import { listBackups } from '../../src/backup/manifest.js';
import {
  beyondRetention,
  latestSlot,
  parseSchedules,
  recurringName,
  runRecurringJobs,
  selects,
  slotStamp,
} from '../../src/jobs/recurring.js';
import { parseConfig, type RecurringJobConfig } from '../../src/config.js';
import { createContext, type Context } from '../../src/context.js';
import { ConfigError } from '../../src/errors.js';
import { jobTicketId } from '../../src/ledger/ids.js';
import { MemoryStore } from '../fixtures/memory-store.js';

const work = mkdtempSync(join(tmpdir(), 'latch-recurring-'));
after(() => rmSync(work, { recursive: true, force: true }));
const MiB = 1024 * 1024;

const hourly: RecurringJobConfig = { name: 'hourly', task: 'snapshot', cron: '0 * * * *', volumes: ['pvc-*'], retain: 2 };

function config(raw: Record<string, unknown>) {
  return parseConfig(raw, '/etc/latch/config.json');
}

describe('recurringJobs in the configuration', () => {
  it('takes a list of jobs, empty by default', async () => {
    assert.deepEqual(config({}).recurringJobs, []);
    const c = config({ recurringJobs: [hourly] });
    assert.deepEqual(c.recurringJobs, [hourly]);
    assert.equal((await parseSchedules(c)).length, 1);
  });

  it('refuses a duplicate name, a bad name, an unknown task, an empty selector or a retain below 1', () => {
    const refused = (jobs: unknown[], field: RegExp) =>
      assert.throws(
        () => config({ recurringJobs: jobs }),
        (err: Error) => err instanceof ConfigError && field.test(err.message),
      );
    refused(
      [hourly, { ...hourly, cron: '5 * * * *' }],
      /field "recurringJobs\.1\.name": a recurring job named "hourly" is already defined/,
    );
    refused([{ ...hourly, name: 'Hourly.x' }], /field "recurringJobs\.0\.name"/);
    refused([{ ...hourly, task: 'restore' }], /field "recurringJobs\.0\.task"/);
    refused([{ ...hourly, volumes: [] }], /field "recurringJobs\.0\.volumes"/);
    refused([{ ...hourly, volumes: ['../etc'] }], /field "recurringJobs\.0\.volumes\.0"/);
    refused([{ ...hourly, retain: 0 }], /field "recurringJobs\.0\.retain"/);
    refused([{ ...hourly, cron: 'every hour' }], /field "recurringJobs\.0\.cron": must be a cron expression of five fields/);
    refused([{ ...hourly, cron: '0 * * * * *' }], /field "recurringJobs\.0\.cron": must be a cron expression of five fields/); // no seconds
  });

  it('refuses, when the agent parses them, a cron expression the library rejects or one that never fires', async () => {
    const refused = async (job: Partial<RecurringJobConfig>, message: RegExp, extra: Record<string, unknown> = {}) =>
      assert.rejects(
        parseSchedules(config({ ...extra, recurringJobs: [{ ...hourly }, { ...hourly, name: 'second', ...job }] })),
        (err: Error) => err instanceof ConfigError && message.test(err.message),
      );
    await refused({ cron: '61 * * * *' }, /field "recurringJobs\.1\.cron": "61 \* \* \* \*" is not a cron expression: .*minute/);
    await refused({ cron: '0 0 30 2 *' }, /field "recurringJobs\.1\.cron": "0 0 30 2 \*" never fires/);
    await refused({ task: 'backup' }, /field "recurringJobs\.1\.task": .*no backupTarget is configured/);
    assert.equal(
      (await parseSchedules(config({ backupTarget: { type: 'dir', path: '/b' }, recurringJobs: [{ ...hourly, task: 'backup' }] }))).length,
      1,
    );
  });
});

describe('slots, names and selectors', () => {
  it('the latest slot is at or before now, in UTC, by whole minutes', async () => {
    const [every5] = await parseSchedules(config({ recurringJobs: [{ ...hourly, cron: '*/5 * * * *' }] }));
    const slot = (iso: string) => latestSlot(every5!.cron, Date.parse(iso))?.toISOString();
    assert.equal(slot('2026-11-23T15:20:00.000Z'), '2026-11-23T15:20:00.000Z', 'a slot is due at its first millisecond');
    assert.equal(slot('2026-11-23T15:19:59.999Z'), '2026-11-23T15:15:00.000Z');
    assert.equal(slot('2026-11-23T15:24:59.999Z'), '2026-11-23T15:20:00.000Z');
    assert.equal(slotStamp(new Date('2026-01-02T03:04:00Z')), '20260102-0304');
  });

  it('names: snapshots <job>-<stamp>; backups also name their volume (one namespace per target)', () => {
    assert.equal(recurringName(hourly, '20261123-1500', 'pvc-1'), 'hourly-20261123-1500');
    assert.equal(recurringName({ ...hourly, task: 'backup' }, '20261123-1500', 'pvc-1'), 'hourly-20261123-1500-pvc-1');
  });

  it('selects names and glob patterns', () => {
    assert.ok(selects(['pvc-*'], 'pvc-1'));
    assert.ok(selects(['db', 'pvc-?'], 'db'));
    assert.ok(selects(['pvc-?'], 'pvc-1'));
    assert.ok(!selects(['pvc-?'], 'pvc-10'));
    assert.ok(!selects(['pvc-*'], 'xpvc-1'));
    assert.ok(!selects(['a.b'], 'axb'), "'.' is a plain character");
  });

  it('retention picks the oldest of the job’s own names beyond retain, and no other name', () => {
    const names = [
      'hourly-20261123-0700',
      'hourly-20261123-0900',
      'hourly-20261123-0800',
      'hourly-x-20261123-0600', // another job's (named hourly-x)
      'hourly-20261123-0500-extra',
      'manual',
      'hourly-20261123-1000',
    ];
    assert.deepEqual(beyondRetention(hourly, 'pvc-1', names), ['hourly-20261123-0800', 'hourly-20261123-0700']);
    const backups = { ...hourly, task: 'backup' as const, retain: 1 };
    assert.deepEqual(
      beyondRetention(backups, 'pvc-1', ['hourly-20261123-0700-pvc-1', 'hourly-20261123-0800-pvc-1', 'hourly-20261123-0700-pvc-10']),
      ['hourly-20261123-0700-pvc-1'],
    );
  });
});

describe('the recurring-jobs agent task', () => {
  /** Two nodes' agents over one ledger and one pool, with a clock the test sets. */
  function cluster(jobs: RecurringJobConfig[], extra: Record<string, unknown> = {}) {
    const dir = mkdtempSync(join(work, 'c-'));
    const poolDir = join(dir, 'pool');
    mkdirSync(poolDir);
    const store = new MemoryStore();
    let now = Date.parse('2026-11-23T10:30:00Z');
    const logs: Record<string, unknown>[] = [];
    const node = (name: string): Context =>
      createContext(
        config({
          nodeName: name,
          oneHost: true,
          poolDir,
          stateDir: join(dir, name),
          logFile: join(dir, `${name}.log`),
          recurringJobs: jobs,
          ...extra,
        }),
        {
          store,
          clock: () => now,
        },
      );
    return {
      store,
      logs,
      a: node('node-a'),
      b: node('node-b'),
      setClock: (iso: string) => (now = Date.parse(iso)),
      run: (ctx: Context) => runRecurringJobs(ctx, (entry) => logs.push({ node: ctx.config.nodeName, ...entry })),
    };
  }

  async function makeVolume(ctx: Context, name: string) {
    await ctx.ledger.createVolume(name, { sizeBytes: 4 * MiB, fsType: 'ext4' });
    await ctx.backend.create(name, 4 * MiB);
  }

  /** What the job runner does for a snapshot ticket, on the ticket's node (the runner itself is tested elsewhere). */
  async function doSnapshotJob(c: ReturnType<typeof cluster>, volume: string, id: string) {
    const ticket = (await c.a.ledger.get(volume))?.spec.tickets[id];
    assert.ok(ticket, `ticket ${id} on ${volume}`);
    const ctx = ticket.nodeID === 'node-a' ? c.a : c.b;
    await ctx.ledger.startJob(volume, id, ticket.nodeID);
    assert.equal(ticket.job?.kind, 'snapshot');
    await (ctx.backend as LoopBackend).createSnapshot(volume, (ticket.job as { snapshot: string }).snapshot);
    await ctx.ledger.recordJob(volume, id, { state: 'succeeded', message: 'done' });
    await ctx.ledger.finishJob(volume, id);
    return ticket.nodeID;
  }

  const jobTickets = async (ctx: Context, volume: string) =>
    Object.values((await ctx.ledger.get(volume))!.spec.tickets).map((t) => ({ id: t.id, node: t.nodeID, job: t.job }));

  it('asks once for the due slot on each selected volume; two racing agents end with one ticket', async () => {
    const c = cluster([hourly]);
    await makeVolume(c.a, 'pvc-1');
    await makeVolume(c.a, 'other');
    await Promise.all([c.run(c.a), c.run(c.b)]);
    const id = jobTicketId('snapshot', 'pvc-1', 'hourly-20261123-1000');
    const tickets = await jobTickets(c.a, 'pvc-1');
    assert.equal(tickets.length, 1, JSON.stringify(tickets));
    assert.equal(tickets[0]!.id, id);
    assert.deepEqual(tickets[0]!.job, { kind: 'snapshot', snapshot: 'hourly-20261123-1000' });
    assert.deepEqual(await jobTickets(c.a, 'other'), [], 'a volume the selector does not match');
    assert.deepEqual(
      c.logs.filter((l) => l.error),
      [],
      'the agent that lost the race is not in error',
    );
    assert.equal(c.logs.filter((l) => l.ticket === id).length, 1, 'one agent asked');

    // Again, and from the other node: nothing changes while the ticket is there.
    const writes = c.store.writes.length;
    await c.run(c.a);
    await c.run(c.b);
    assert.equal(c.store.writes.length, writes, 'a repeat writes nothing');

    // The job runs; the slot is done: not asked for again.
    await doSnapshotJob(c, 'pvc-1', id);
    await c.run(c.a);
    await c.run(c.b);
    assert.deepEqual(await jobTickets(c.a, 'pvc-1'), []);
  });

  it('an agent whose write loses the race to another agent’s ticket for the same slot takes that ticket as the slot’s', async () => {
    const c = cluster([hourly]);
    await makeVolume(c.a, 'pvc-1');
    // node-a decided to ask (for itself: the volume is idle); just before its write, node-b's whole round runs.
    let raced = false;
    c.store.beforeWrite = async () => {
      if (raced) return;
      raced = true;
      await c.run(c.b);
    };
    await c.run(c.a);
    assert.ok(raced);
    const tickets = await jobTickets(c.a, 'pvc-1');
    assert.deepEqual(
      tickets.map((t) => t.node),
      ['node-b'],
      'node-b asked first: its ticket stands',
    );
    assert.deepEqual(
      c.logs.map((l) => [l.node, l.ticket === tickets[0]!.id, l.error]),
      [['node-b', true, undefined]],
      'node-a logs nothing: no ticket of its own, no error',
    );
  });

  it('after a gap, asks for the latest missed slot only (no backlog); a slot made already counts as done', async () => {
    const c = cluster([hourly]);
    await makeVolume(c.a, 'pvc-1');
    c.setClock('2026-11-23T13:45:00Z'); // slots 11:00, 12:00, 13:00 went by with no agent running
    await c.run(c.a);
    const tickets = await jobTickets(c.a, 'pvc-1');
    assert.deepEqual(
      tickets.map((t) => t.job),
      [{ kind: 'snapshot', snapshot: 'hourly-20261123-1300' }],
    );
    await doSnapshotJob(c, 'pvc-1', tickets[0]!.id);

    // A snapshot of the next slot's name exists already (made by hand, or its record rolled out of status.jobs).
    c.setClock('2026-11-23T14:00:00Z');
    await (c.a.backend as LoopBackend).createSnapshot('pvc-1', 'hourly-20261123-1400');
    await c.run(c.a);
    assert.deepEqual(await jobTickets(c.a, 'pvc-1'), []);
  });

  it('while an earlier slot’s ticket is not done, no ticket for a later slot (tickets never pile up)', async () => {
    const c = cluster([hourly]);
    await makeVolume(c.a, 'pvc-1');
    await c.run(c.a); // 10:00, and no agent does it
    c.setClock('2026-11-23T11:00:00Z');
    await c.run(c.a);
    c.setClock('2026-11-23T12:00:00Z');
    await c.run(c.b);
    const tickets = await jobTickets(c.a, 'pvc-1');
    assert.deepEqual(
      tickets.map((t) => t.job),
      [{ kind: 'snapshot', snapshot: 'hourly-20261123-1000' }],
    );
    assert.equal(c.logs.filter((l) => typeof l.waiting === 'string').length, 2);
    // Once it is done, the latest slot is asked for (not 11:00: no backlog).
    await doSnapshotJob(c, 'pvc-1', tickets[0]!.id);
    await c.run(c.a);
    assert.deepEqual(
      (await jobTickets(c.a, 'pvc-1')).map((t) => t.job),
      [{ kind: 'snapshot', snapshot: 'hourly-20261123-1200' }],
    );
  });

  it('a volume in use on another node: the ticket is for that node, whoever asks', async () => {
    const c = cluster([hourly]);
    await makeVolume(c.a, 'pvc-1');
    // node-b holds the volume (read-write, a workload).
    await c.b.ledger.addTicket('pvc-1', {
      id: 'workload-b',
      type: 'workload',
      nodeID: 'node-b',
      parameters: { readOnly: false },
      requestedBy: {},
    });
    await c.b.ledger.claimGrant('pvc-1', 'node-b');
    assert.equal((await c.b.ledger.get('pvc-1'))!.status.nodes['node-b']?.phase, 'attaching');
    await c.run(c.a);
    const jobs = (await jobTickets(c.a, 'pvc-1')).filter((t) => t.job);
    assert.deepEqual(
      jobs.map((t) => t.node),
      ['node-b'],
    );
  });

  it('retention: only the agent of the node that did the job deletes, and keeps exactly retain of the job’s own', async () => {
    const c = cluster([hourly]);
    await makeVolume(c.a, 'pvc-1');
    const backend = c.a.backend as LoopBackend;
    const others = ['hourly-x-20261123-0100', 'manual-1', 'hourly-20261123-0200-keep'];
    for (const name of ['hourly-20261123-0700', 'hourly-20261123-0800', 'hourly-20261123-0900', ...others]) {
      await backend.createSnapshot('pvc-1', name);
    }
    await c.run(c.b); // node-b asks first: the idle volume's job is node-b's
    const [ticket] = await jobTickets(c.a, 'pvc-1');
    assert.equal(ticket!.node, 'node-b');
    assert.equal(await doSnapshotJob(c, 'pvc-1', ticket!.id), 'node-b');
    const names = async () => (await backend.listSnapshots('pvc-1')).map((s) => s.name).sort();

    await c.run(c.a);
    assert.equal((await names()).length, 7, 'node-a did not do the job: it deletes nothing');
    await c.run(c.b);
    assert.deepEqual(await names(), ['hourly-20261123-0900', 'hourly-20261123-1000', ...others].sort());
    await c.run(c.b);
    assert.equal((await names()).length, 5, 'a repeat deletes nothing more');
    assert.deepEqual(
      c.logs.filter((l) => l.retention).map((l) => [l.node, l.retention]),
      [
        ['node-b', 'deleted snapshot hourly-20261123-0800'],
        ['node-b', 'deleted snapshot hourly-20261123-0700'],
      ],
    );
  });

  it('backup retention deletes the job’s oldest backups of that volume only', async () => {
    const target = mkdtempSync(join(work, 'target-'));
    const c = cluster([{ ...hourly, task: 'backup', retain: 1 }], { backupTarget: { type: 'dir', path: target } });
    for (const volume of ['pvc-1', 'pvc-10']) await makeVolume(c.a, volume);
    const backup = (volume: string, name: string) =>
      createBackup({ target: { type: 'dir', path: target }, source: join(c.a.config.poolDir, `${volume}.img`), volume, name });
    await backup('pvc-1', 'hourly-20261123-0800-pvc-1');
    await backup('pvc-1', 'manual-pvc-1');
    await backup('pvc-10', 'hourly-20261123-0800-pvc-10');
    await c.run(c.a); // both volumes' 10:00 slots
    for (const volume of ['pvc-1', 'pvc-10']) {
      const [ticket] = await jobTickets(c.a, volume);
      assert.ok(ticket?.job?.kind === 'backup');
      await c.a.ledger.startJob(volume, ticket.id, 'node-a');
      await backup(volume, ticket.job.backup);
      await c.a.ledger.recordJob(volume, ticket.id, { state: 'succeeded', message: 'done' });
      await c.a.ledger.finishJob(volume, ticket.id);
    }
    await c.run(c.a);
    assert.deepEqual((await listBackups({ type: 'dir', path: target })).map((b) => b.name).sort(), [
      'hourly-20261123-1000-pvc-1',
      'hourly-20261123-1000-pvc-10',
      'manual-pvc-1',
    ]);
  });

  it('backup jobs name the volume in the backup and ask on each selected volume', async () => {
    const target = mkdtempSync(join(work, 'target-'));
    const c = cluster([{ ...hourly, task: 'backup', volumes: ['pvc-1', 'pvc-2'] }], { backupTarget: { type: 'dir', path: target } });
    await makeVolume(c.a, 'pvc-1');
    await makeVolume(c.a, 'pvc-2');
    await c.run(c.a);
    for (const volume of ['pvc-1', 'pvc-2']) {
      assert.deepEqual(
        (await jobTickets(c.a, volume)).map((t) => [t.id, t.job]),
        [[jobTicketId('backup', volume, `hourly-20261123-1000-${volume}`), { kind: 'backup', backup: `hourly-20261123-1000-${volume}` }]],
      );
    }
  });
});

// The agent as a process (bin/latch, built): a recurring snapshot job and a recurring backup job of a fixed slot (Jan 1
// 00:00 UTC: the latest slot is the same all year, so the test does not depend on the minute it runs in), done by the
// job runner on a real loop device, then retention.

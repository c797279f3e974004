// Issue 37, item 4: every backup and restore leaves its outcome in the log (node/backup-outcome.ts), the agent's
// metrics count them (runs by outcome, duration, bytes read and written, and per recurring job and volume the last
// success and failure), lines out of shape are skipped (bounded labels), and `latch backup list` shows each volume's
// last outcome, a failed job included.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { backupIntervals } from '../../src/jobs/recurring.js';
import { lastOutcomes } from '../../src/cli/backup/list.js';
import { directBackupRecord } from '../../src/jobs/direct.js';
import { jobTicketId } from '../../src/ledger/ids.js';
import { parseConfig } from '../../src/config.js';
import { readWholeLog } from '../../src/agent/call-log.js';
import { LatchMetrics } from '../../src/agent/metrics.js';
import { writeLog } from '../../src/log.js';
import { newVolume, recordDirectJob } from '../../src/ledger/arbitrate.js';
import type { FinishedJob, VolumeDoc } from '../../src/ledger/types.js';
import { observed, triggerOf } from '../../src/node/backup-outcome.js';
import type { Manifest } from '../../src/backup/manifest.js';

const scratch = mkdtempSync(join(tmpdir(), 'latch-backup-observed-'));
after(() => rmSync(scratch, { recursive: true, force: true }));

function sample(text: string, series: string): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.slice(series.length + 1));
}

async function metricsOf(logFile: string): Promise<string> {
  const metrics = await LatchMetrics.create();
  await readWholeLog(logFile, (line) => metrics.ingest(line));
  metrics.setRecurringIntervals(new Map([['nightly', 86_400]]));
  return metrics.text();
}

describe('backup and restore outcomes as metrics', () => {
  it('counts a success and a failure, with bytes, duration and the recurring job’s last success and failure', async () => {
    const config = { logFile: join(scratch, 'a.log'), logMaxBytes: 10 * 1024 * 1024 };
    const recurring = triggerOf({ owner: 'recurring job nightly' });
    assert.deepEqual(recurring, { trigger: 'recurring', recurring: 'nightly' });
    assert.deepEqual(triggerOf({ owner: 'someone' }), { trigger: 'manual' });

    const made = await observed(
      config,
      { kind: 'backup', ...recurring, volume: 'db', name: 'nightly-20261127-0230-db' },
      async () => ({ read: 5_000_000, stored: 1_000_000 }),
      (v) => ({ read: v.read, written: v.stored }),
    );
    assert.equal(made.read, 5_000_000, 'the work’s value is handed back');
    let text = await metricsOf(config.logFile);
    assert.equal(sample(text, 'latch_backup_runs_total{kind="backup",trigger="recurring",outcome="succeeded"}'), 1);
    assert.equal(sample(text, 'latch_backup_runs_total{kind="backup",trigger="recurring",outcome="failed"}'), 0);
    assert.equal(sample(text, 'latch_backup_read_bytes_total{kind="backup",trigger="recurring"}'), 5_000_000);
    assert.equal(sample(text, 'latch_backup_written_bytes_total{kind="backup",trigger="recurring"}'), 1_000_000);
    assert.equal(sample(text, 'latch_backup_duration_seconds_count{kind="backup",trigger="recurring",outcome="succeeded"}'), 1);
    const success = sample(text, 'latch_recurring_backup_last_success_timestamp_seconds{recurring="nightly",volume="db"}') ?? 0;
    assert.ok(Math.abs(success - Date.now() / 1000) < 60, `a success just now: ${success}`);
    assert.equal(sample(text, 'latch_recurring_backup_last_failure_timestamp_seconds{recurring="nightly",volume="db"}'), undefined);
    assert.equal(sample(text, 'latch_recurring_backup_interval_seconds{recurring="nightly"}'), 86_400);

    await assert.rejects(
      observed(
        config,
        { kind: 'backup', ...recurring, volume: 'db', name: 'nightly-20261128-0230-db' },
        async () => {
          throw new Error('the target is full');
        },
        () => ({ read: 0, written: 0 }),
        { partial: () => ({ read: 123, written: 45 }) },
      ),
      /the target is full/,
    );
    await observed(
      config,
      { kind: 'restore', trigger: 'manual', volume: 'db2', name: 'b1' },
      async () => undefined,
      () => ({ read: 8, written: 8 }),
    );
    text = await metricsOf(config.logFile);
    assert.equal(sample(text, 'latch_backup_runs_total{kind="backup",trigger="recurring",outcome="failed"}'), 1);
    assert.equal(
      sample(text, 'latch_backup_read_bytes_total{kind="backup",trigger="recurring"}'),
      5_000_123,
      'a failure counts what it read',
    );
    assert.equal(sample(text, 'latch_backup_runs_total{kind="restore",trigger="manual",outcome="succeeded"}'), 1);
    assert.equal(sample(text, 'latch_backup_written_bytes_total{kind="restore",trigger="manual"}'), 8);
    const failure = sample(text, 'latch_recurring_backup_last_failure_timestamp_seconds{recurring="nightly",volume="db"}') ?? 0;
    assert.ok(failure >= success, 'the failure is the newer: the alert LatchRecurringBackupFailed fires on it');
  });

  it("each recurring backup job's interval, from its cron (snapshot jobs left out)", async () => {
    const config = parseConfig(
      {
        nodeName: 'n',
        stateDir: join(scratch, 's'),
        poolDir: join(scratch, 'p'),
        logFile: join(scratch, 'l.log'),
        backupTarget: { type: 'dir', path: scratch },
        recurringJobs: [
          { name: 'nightly', task: 'backup', cron: '30 2 * * *', volumes: ['*'], retain: 7 },
          { name: 'often', task: 'backup', cron: '*/15 * * * *', volumes: ['db'], retain: 4 },
          { name: 'hourly', task: 'snapshot', cron: '0 * * * *', volumes: ['*'], retain: 24 },
        ],
      },
      'test',
    );
    const intervals = await backupIntervals(config, Date.parse('2026-11-27T12:00:30Z'));
    assert.deepEqual(
      [...intervals],
      [
        ['nightly', 86_400],
        ['often', 900],
      ],
    );
  });

  it('an aborted run is interrupted, not failed', async () => {
    const config = { logFile: join(scratch, 'b.log'), logMaxBytes: 10 * 1024 * 1024 };
    const stop = new AbortController();
    stop.abort();
    await assert.rejects(
      observed(
        config,
        { kind: 'backup', trigger: 'manual', volume: 'v', name: 'b' },
        async () => stop.signal.throwIfAborted(),
        () => ({ read: 0, written: 0 }),
        { signal: stop.signal },
      ),
    );
    const text = await metricsOf(config.logFile);
    assert.equal(sample(text, 'latch_backup_runs_total{kind="backup",trigger="manual",outcome="interrupted"}'), 1);
    assert.equal(sample(text, 'latch_backup_runs_total{kind="backup",trigger="manual",outcome="failed"}'), 0);
  });

  it('skips outcome lines out of shape, so that no label takes a value from outside its set', async () => {
    const config = { logFile: join(scratch, 'c.log'), logMaxBytes: 10 * 1024 * 1024 };
    const good = {
      kind: 'backup',
      trigger: 'recurring',
      recurring: 'nightly',
      volume: 'db',
      outcome: 'failed',
      finishedAt: new Date().toISOString(),
    };
    writeLog(config, { backupOutcome: { ...good, kind: 'exfiltrate' } });
    writeLog(config, { backupOutcome: { ...good, outcome: 'weird' } });
    writeLog(config, { backupOutcome: { ...good, recurring: 'Bad Name {x="y"}' } });
    writeLog(config, { backupOutcome: { ...good, volume: '../../etc' } });
    writeLog(config, { backupOutcome: { ...good, bytesRead: -5, durationMs: 'soon' } });
    const text = await metricsOf(config.logFile);
    assert.doesNotMatch(text, /exfiltrate|weird|Bad Name|\.\.\/|etc/);
    // The last three have a valid kind, trigger and outcome: counted (a bad job name or volume keeps a line out of the
    // per-job gauges only), the bad byte count as 0, the bad duration not observed.
    assert.equal(sample(text, 'latch_backup_runs_total{kind="backup",trigger="recurring",outcome="failed"}'), 3);
    assert.equal(sample(text, 'latch_backup_read_bytes_total{kind="backup",trigger="recurring"}'), 0);
  });
});

describe('latch backup list: the last outcome per volume', () => {
  const manifest = (name: string, volume: string, completedAt: string) =>
    ({ name, volume, completedAt, node: 'node-a', chunks: [], stats: {} }) as unknown as Manifest;
  const finished = (backup: string, state: 'succeeded' | 'failed', at: string, message: string): FinishedJob => ({
    ticket: `t-${backup}`,
    type: 'backup',
    node: 'node-b',
    job: { kind: 'backup', backup },
    status: { state, node: 'node-b', startedAt: at, finishedAt: at, attempts: 1, message },
  });

  it('takes the newest of the complete backups and the jobs the ledger records, a failure with its message', () => {
    const db = newVolume('db', 1024, 'ext4', '2026-11-01T00:00:00.000Z');
    db.status.jobs = [
      finished('db-1', 'succeeded', '2026-11-26T02:30:10.000Z', 'backup db-1 created'),
      finished('db-2', 'failed', '2026-11-27T02:30:10.000Z', 'the target is full'),
    ];
    const web = newVolume('web', 1024, 'ext4', '2026-11-01T00:00:00.000Z');
    web.status.jobs = [finished('web-1', 'failed', '2026-11-25T00:00:00.000Z', 'old failure')];
    const backups = [
      { name: 'db-1', manifest: manifest('db-1', 'db', '2026-11-26T02:30:09.000Z') },
      { name: 'web-2', manifest: manifest('web-2', 'web', '2026-11-26T00:00:00.000Z') },
    ];
    const outcomes = lastOutcomes(backups, [db, web]);
    assert.deepEqual(
      outcomes.map((o) => [o.volume, o.outcome, o.backup, o.message]),
      [
        ['db', 'failed', 'db-2', 'the target is full'],
        ['web', 'succeeded', 'web-2', undefined],
      ],
    );
    assert.deepEqual(
      lastOutcomes(backups, [db, web], 'web').map((o) => o.volume),
      ['web'],
    );
  });

  it('a backup run beside a pod, recorded as its job ticket would have been, counts like one: a failure, then a success', () => {
    const at = (s: number) => `2026-11-27T10:00:${String(s).padStart(2, '0')}.000Z`;
    const failed = directBackupRecord('db', 'db-3', 'node-a', {
      state: 'failed',
      message: 'the backup target is full',
      startedAt: at(1),
      finishedAt: at(2),
    });
    assert.deepEqual(failed, {
      ticket: jobTicketId('backup', 'db', 'db-3'),
      type: 'backup',
      node: 'node-a',
      job: { kind: 'backup', backup: 'db-3' },
      status: { state: 'failed', node: 'node-a', startedAt: at(1), finishedAt: at(2), attempts: 1, message: 'the backup target is full' },
      direct: true,
    });
    let db = recordDirectJob(newVolume('db', 1024, 'ext4', at(0)), failed);
    const backups = [{ name: 'db-1', manifest: manifest('db-1', 'db', at(0)) }];
    assert.deepEqual(
      lastOutcomes(backups, [db]).map((o) => [o.outcome, o.backup, o.node, o.message]),
      [['failed', 'db-3', 'node-a', 'the backup target is full']],
      'newer than the last complete backup',
    );
    const succeeded = directBackupRecord('db', 'db-4', 'node-a', {
      state: 'succeeded',
      message: 'created',
      startedAt: at(3),
      finishedAt: at(5),
    });
    db = recordDirectJob(db, succeeded);
    // Its manifest completed a moment before the record was written: either way the newest is a success.
    backups.push({ name: 'db-4', manifest: manifest('db-4', 'db', at(4)) });
    assert.deepEqual(
      lastOutcomes(backups, [db]).map((o) => [o.outcome, o.backup, o.message]),
      [['succeeded', 'db-4', undefined]],
    );
  });

  it('passes over history entries and job statuses whose fields are not what latch writes (another node wrote them)', () => {
    const at = '2026-11-27T10:00:00.000Z';
    const good = finished('db-1', 'failed', at, 'the target is full');
    const forged = [
      null,
      'text',
      { ...good, job: null },
      { ...good, job: { kind: 'backup', backup: 7 } },
      { ...good, status: { ...good.status, finishedAt: 5, startedAt: undefined } },
      { ...good, status: { ...good.status, node: { x: 1 } } },
      { ...good, status: { ...good.status, message: ['a'] } },
      { ...good, status: 'failed' },
    ];
    const db = newVolume('db', 1024, 'ext4', at);
    (db.status as { jobs: unknown }).jobs = forged;
    const web = newVolume('web', 1024, 'ext4', at);
    (web.status as { jobs: unknown }).jobs = { not: 'an array' };
    const tickets = newVolume('tickets', 1024, 'ext4', at);
    tickets.spec.tickets = { t: { id: 't', job: { kind: 'backup', backup: 'x' } } } as unknown as VolumeDoc['spec']['tickets'];
    (tickets.status as { tickets: unknown }).tickets = { t: { job: 'running' } };
    assert.deepEqual(lastOutcomes([], [db, web, tickets]), []);
    (db.status as { jobs: unknown }).jobs = [...forged, good];
    assert.deepEqual(
      lastOutcomes([], [db, web, tickets]).map((o) => [o.volume, o.outcome, o.message]),
      [['db', 'failed', 'the target is full']],
    );
  });
});

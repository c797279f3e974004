// Issue 15: latch's metrics (src/agent/metrics.ts) and the dashboard and alert rules shipped in deploy/: the gauges
// from a ledger, the counters and the latency histogram from call-log lines (also across a rotation), and every
// expression of the dashboard and the rules naming only metrics latch exports.
import assert from 'node:assert/strict';
import { appendFileSync, mkdtempSync, readFileSync, renameSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { after, describe, it } from 'node:test';
import { parse as parseYaml } from 'yaml';
import { LogFollower, readWholeLog, type CallLogLine } from '../../src/agent/call-log.js';
import { LatchMetrics, METRIC_NAMES } from '../../src/agent/metrics.js';
import { addTicket, markAttached, markAttaching, newVolume, removeTicket } from '../../src/ledger/arbitrate.js';
import type { VolumeDoc } from '../../src/ledger/types.js';
import { defined } from '../fixtures/defined.js';

const ROOT = resolve(__dirname, '../..');
const T0 = Date.parse('2026-01-01T00:00:00Z');
const at = (seconds: number) => new Date(T0 + seconds * 1000).toISOString();
const scratch = mkdtempSync(join(tmpdir(), 'latch-monitoring-'));
after(() => rmSync(scratch, { recursive: true, force: true }));

/** v1 attached on node-a then detaching (its ticket removed at 100 s), a workload on node-b waiting since 50 s. */
function detachingVolume(): VolumeDoc {
  let doc = newVolume('v1', 1024, 'ext4', at(0));
  const ticket = (node: string) => ({
    id: `w-${node}`,
    type: 'workload' as const,
    nodeID: node,
    parameters: { readOnly: false },
    requestedBy: {},
  });
  doc = addTicket(doc, ticket('node-a'), at(0));
  doc = defined(markAttaching(doc, 'node-a', at(1)), 'attaching');
  doc = defined(markAttached(doc, 'node-a', '/dev/loop1', at(2)), 'attached');
  doc = addTicket(doc, ticket('node-b'), at(50));
  return removeTicket(doc, 'w-node-a', at(100));
}

/** The value of one sample in the text format ("name{labels} value"), by its exact series. */
function sample(text: string, series: string): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.slice(series.length + 1));
}

describe('the metrics', () => {
  it('gauges from the ledger: volumes by state, tickets by type and condition, waiting and detaching seconds', async () => {
    const m = await LatchMetrics.create();
    m.setLedger({ docs: [detachingVolume(), newVolume('v2', 1024, 'ext4', at(0))], damaged: [] }, T0 + 400_000);
    const text = await m.text();
    assert.equal(sample(text, 'latch_volumes{state="detaching"}'), 1);
    assert.equal(sample(text, 'latch_volumes{state="detached"}'), 1);
    assert.equal(sample(text, 'latch_volumes{state="attached"}'), 0);
    assert.equal(sample(text, 'latch_tickets{type="workload",condition="Detaching"}'), 1);
    assert.equal(
      sample(text, 'latch_ticket_waiting_seconds{volume="v1",ticket="w-node-b",type="workload",node="node-b",condition="Detaching"}'),
      350,
    );
    assert.equal(sample(text, 'latch_node_detaching_seconds{volume="v1",node="node-a"}'), 300);
    assert.equal(sample(text, 'latch_ledger_up'), 1);

    m.setLedger(undefined, T0);
    const down = await m.text();
    assert.equal(sample(down, 'latch_ledger_up'), 0);
    assert.equal(sample(down, 'latch_volumes{state="detaching"}'), undefined, 'no stale gauges when the ledger cannot be read');
  });

  it('counters and the latency histogram from call-log lines; doctor findings by check and severity', async () => {
    const m = await LatchMetrics.create();
    const lines: CallLogLine[] = [
      { op: 'init', status: 'Success', durationMs: 40 },
      { op: 'attach', status: 'Failure', durationMs: 300, automatic: [{ kind: 'expired' }] },
      { op: 'attach', status: 'Success', durationMs: 200 },
      { agent: 'reap-tickets', automatic: [{ kind: 'abandoned' }] },
      { op: 'unmountdevice', status: 'Success', durationMs: 2000, automatic: [{ kind: 'released' }] },
    ];
    lines.forEach((l) => m.ingest(l));
    m.setDoctorFindings([
      { check: 'ledger', severity: 'ok', message: 'fine' },
      { check: 'detaching', severity: 'warning', message: 'stuck' },
      { check: 'detaching', severity: 'warning', message: 'stuck too' },
    ]);
    const text = await m.text();
    assert.equal(sample(text, 'latch_driver_calls_total{op="attach",status="Failure"}'), 1);
    assert.equal(sample(text, 'latch_driver_calls_total{op="attach",status="Success"}'), 1);
    assert.equal(sample(text, 'latch_driver_call_duration_seconds_bucket{le="0.25",op="attach"}'), 1);
    assert.equal(sample(text, 'latch_driver_call_duration_seconds_count{op="attach"}'), 2);
    assert.equal(sample(text, 'latch_driver_call_duration_seconds_sum{op="attach"}'), 0.5);
    assert.equal(sample(text, 'latch_reaped_tickets_total{reason="expired"}'), 1);
    assert.equal(sample(text, 'latch_reaped_tickets_total{reason="abandoned"}'), 1);
    assert.equal(sample(text, 'latch_automatic_releases_total'), 1);
    assert.equal(sample(text, 'latch_doctor_findings{check="detaching",severity="warning"}'), 2);
    assert.equal(sample(text, 'latch_doctor_findings{check="ledger",severity="ok"}'), undefined);
    for (const name of Object.values(METRIC_NAMES)) assert.match(text, new RegExp(`^# TYPE ${name} `, 'm'), `${name} is exported`);
  });

  it('reads the retained log files, and follows the current one across a rotation without losing or repeating a line', async () => {
    const log = join(scratch, 'latch.log');
    const line = (op: string) => `${JSON.stringify({ op, status: 'Success', durationMs: 1 })}\n`;
    appendFileSync(log, line('a'));
    renameSync(log, `${log}.1`);
    appendFileSync(log, line('b') + line('c'));
    const whole: string[] = [];
    await readWholeLog(log, (l) => whole.push(defined(l.op, 'op')));
    assert.deepEqual(whole, ['a', 'b', 'c']);

    const seen: string[] = [];
    const follower = new LogFollower(log);
    const read = () => follower.readNew((l) => seen.push(defined(l.op, 'op')));
    await read();
    assert.deepEqual(seen, ['b', 'c']);
    appendFileSync(log, `${line('d')}{"op":"half`);
    await read();
    assert.deepEqual(seen, ['b', 'c', 'd'], 'a half-written line waits');
    appendFileSync(log, `-written","status":"Success"}\n${line('e')}`);
    renameSync(log, `${log}.1`); // rotated before the follower read the rest
    appendFileSync(log, line('f'));
    await read();
    assert.deepEqual(seen, ['b', 'c', 'd', 'half-written', 'e', 'f']);
  });
});

/** Every PromQL expression in the dashboard (panels' targets) or the rules (each rule's expr). */
function expressions(): Array<{ where: string; expr: string }> {
  const found: Array<{ where: string; expr: string }> = [];
  const dashboard = JSON.parse(readFileSync(join(ROOT, 'deploy/grafana/latch-dashboard.json'), 'utf8')) as {
    panels: Array<{ title: string; targets?: Array<{ expr?: string }> }>;
  };
  for (const panel of dashboard.panels) {
    for (const target of panel.targets ?? []) found.push({ where: `dashboard panel "${panel.title}"`, expr: defined(target.expr, 'expr') });
  }
  const rules = parseYaml(readFileSync(join(ROOT, 'deploy/prometheus/latch-rules.yaml'), 'utf8')) as {
    groups: Array<{ rules: Array<{ alert?: string; expr: string; labels?: { severity?: string }; annotations?: { summary?: string } }> }>;
  };
  for (const rule of rules.groups.flatMap((g) => g.rules)) {
    assert.ok(rule.alert && rule.labels?.severity && rule.annotations?.summary, `rule ${JSON.stringify(rule).slice(0, 80)} is complete`);
    found.push({ where: `alert ${rule.alert}`, expr: rule.expr });
  }
  return found;
}

describe('the shipped dashboard and alert rules', () => {
  const exported = new Set<string>(Object.values(METRIC_NAMES));
  const histogramSeries = ['_bucket', '_sum', '_count'].map((s) => `${METRIC_NAMES.callDuration}${s}`);
  const known = new Set([...exported, ...histogramSeries]);
  // Words of PromQL that are not metric names: functions, aggregations, keywords and the labels latch uses.
  const PROMQL = new Set([
    'max',
    'sum',
    'by',
    'rate',
    'increase',
    'histogram_quantile',
    'le',
    'without',
    'on',
    'and',
    'or',
    'unless',
    'time',
    'group_left',
  ]);

  it('name only metrics latch exports, and every expression names one', () => {
    const all = expressions();
    assert.ok(all.length >= 10, 'the dashboard and the rules have expressions');
    const alerts = all.filter((e) => e.where.startsWith('alert')).map((e) => e.where);
    for (const name of [
      'LatchVolumeStuckDetaching',
      'LatchTicketWaitingTooLong',
      'LatchDoctorFinding',
      'LatchRecurringBackupFailed',
      'LatchRecurringBackupLate',
      'LatchSharedVolumeNearlyFull',
    ]) {
      assert.ok(alerts.includes(`alert ${name}`), `the rules have ${name}`);
    }
    for (const { where, expr } of all) {
      // Label matchers and grouping lists name labels, not metrics: take them out first.
      const bare = expr
        .replace(/\{[^}]*\}/g, '')
        .replace(/\b(by|without|on)\s*\([^)]*\)/g, '')
        .replace(/\[[^\]]*\]/g, '')
        .replace(/"[^"]*"/g, '');
      const words = bare.match(/[a-zA-Z_:][a-zA-Z0-9_:]*/g) ?? [];
      const metrics = words.filter((w) => !PROMQL.has(w));
      assert.ok(metrics.length > 0, `${where}: ${expr} names no metric`);
      for (const metric of metrics) assert.ok(known.has(metric), `${where} names ${metric}, which latch does not export`);
    }
  });
});

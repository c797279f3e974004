// latch's metrics in Prometheus's text format, through prom-client (loaded only by `latch agent` and `latch metrics`):
// what the ledger knows right now (gauges, read at each scrape), what the driver did (counters and a latency
// histogram, from the call log's lines: call-log.ts), what the cheap doctor checks found and the quota and use of the
// shared volumes this node holds (each agent round: shared-usage.ts). The names are in METRIC_NAMES;
// test/unit/monitoring.test.ts checks that the shipped dashboard and alert rules use only these.
import type * as PromClient from 'prom-client';
import type { Context } from '../context.js';
import type { Finding } from '../doctor/findings.js';
import type { VolumeListing } from '../ledger/ledger.js';
import type { CallLogLine } from './call-log.js';
import type { UsageRound } from './shared-usage.js';

export const METRIC_NAMES = {
  volumes: 'latch_volumes',
  tickets: 'latch_tickets',
  ticketWaiting: 'latch_ticket_waiting_seconds',
  detaching: 'latch_node_detaching_seconds',
  ledgerUp: 'latch_ledger_up',
  damaged: 'latch_ledger_damaged_documents',
  calls: 'latch_driver_calls_total',
  callDuration: 'latch_driver_call_duration_seconds',
  reaped: 'latch_reaped_tickets_total',
  released: 'latch_automatic_releases_total',
  doctorFindings: 'latch_doctor_findings',
  backupRuns: 'latch_backup_runs_total',
  backupDuration: 'latch_backup_duration_seconds',
  backupReadBytes: 'latch_backup_read_bytes_total',
  backupWrittenBytes: 'latch_backup_written_bytes_total',
  recurringLastSuccess: 'latch_recurring_backup_last_success_timestamp_seconds',
  recurringLastFailure: 'latch_recurring_backup_last_failure_timestamp_seconds',
  recurringInterval: 'latch_recurring_backup_interval_seconds',
  sharedQuota: 'latch_shared_volume_quota_bytes',
  sharedUsed: 'latch_shared_volume_used_bytes',
  sharedInfoFailures: 'latch_shared_volume_info_failures_total',
} as const;

// The label values a backup outcome line may carry (node/backup-outcome.ts); a line with anything else is skipped,
// so that the label sets stay bounded whatever the log holds.
const BACKUP_KINDS = ['backup', 'restore'] as const;
const BACKUP_TRIGGERS = ['manual', 'recurring'] as const;
const BACKUP_OUTCOMES = ['succeeded', 'failed', 'interrupted'] as const;
const RECURRING_NAME = /^[a-z0-9-]{1,63}$/;
const VOLUME_LABEL = /^[a-z0-9][a-z0-9._-]{0,252}$/;
// Backups and restores take from seconds to hours.
const BACKUP_BUCKETS = [1, 5, 15, 60, 300, 900, 1800, 3600, 7200, 14400, 43200];

const VOLUME_STATES = ['detached', 'attaching', 'attached', 'detaching'] as const;
// Driver calls take from milliseconds (init) to minutes (waitforattach waiting for a grant, mkfs of a large volume).
const CALL_BUCKETS = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600];

export class LatchMetrics {
  readonly registry: PromClient.Registry;
  private readonly volumes: PromClient.Gauge;
  private readonly tickets: PromClient.Gauge;
  private readonly ticketWaiting: PromClient.Gauge;
  private readonly detaching: PromClient.Gauge;
  private readonly ledgerUp: PromClient.Gauge;
  private readonly damaged: PromClient.Gauge;
  private readonly calls: PromClient.Counter;
  private readonly callDuration: PromClient.Histogram;
  private readonly reaped: PromClient.Counter;
  private readonly released: PromClient.Counter;
  private readonly doctorFindings: PromClient.Gauge;
  private readonly backupRuns: PromClient.Counter;
  private readonly backupDuration: PromClient.Histogram;
  private readonly backupReadBytes: PromClient.Counter;
  private readonly backupWrittenBytes: PromClient.Counter;
  private readonly recurringLastSuccess: PromClient.Gauge;
  private readonly recurringLastFailure: PromClient.Gauge;
  private readonly recurringInterval: PromClient.Gauge;
  private readonly sharedQuota: PromClient.Gauge;
  private readonly sharedUsed: PromClient.Gauge;
  private readonly sharedInfoFailures: PromClient.Counter;
  /** The values of the two recurring gauges, by outcome, job and volume (bounded as they are). */
  private readonly recurringLatest = new Map<string, number>();

  /** prom-client is loaded here, on first use: no driver call ever loads it. */
  static async create(): Promise<LatchMetrics> {
    return new LatchMetrics(await import('prom-client'));
  }

  private constructor({ Registry, Gauge, Counter, Histogram }: typeof PromClient) {
    const registry = new Registry();
    const registers = [registry];
    this.registry = registry;
    this.volumes = new Gauge({ name: METRIC_NAMES.volumes, help: 'Volumes in the ledger, by state', labelNames: ['state'], registers });
    this.tickets = new Gauge({
      name: METRIC_NAMES.tickets,
      help: 'Tickets in the ledger, by type and condition (satisfied, or the reason it waits)',
      labelNames: ['type', 'condition'],
      registers,
    });
    this.ticketWaiting = new Gauge({
      name: METRIC_NAMES.ticketWaiting,
      help: 'Seconds each unsatisfied ticket has waited since it was created or last changed',
      labelNames: ['volume', 'ticket', 'type', 'node', 'condition'],
      registers,
    });
    this.detaching = new Gauge({
      name: METRIC_NAMES.detaching,
      help: 'Seconds each node has been detaching from a volume (it has not confirmed the release of its device)',
      labelNames: ['volume', 'node'],
      registers,
    });
    this.ledgerUp = new Gauge({ name: METRIC_NAMES.ledgerUp, help: '1 when the ledger could be read for this scrape', registers });
    this.damaged = new Gauge({
      name: METRIC_NAMES.damaged,
      help: 'Volumes whose ledger document cannot be read (not JSON, or not a latch/v1 volume): 1 each; the other volumes are counted',
      labelNames: ['volume'],
      registers,
    });
    this.calls = new Counter({
      name: METRIC_NAMES.calls,
      help: 'Driver calls on this host, by op and result (from the call log)',
      labelNames: ['op', 'status'],
      registers,
    });
    this.callDuration = new Histogram({
      name: METRIC_NAMES.callDuration,
      help: 'Driver call latency in seconds, by op (from the call log)',
      labelNames: ['op'],
      buckets: CALL_BUCKETS,
      registers,
    });
    this.reaped = new Counter({
      name: METRIC_NAMES.reaped,
      help: 'Tickets removed automatically, by reason (expired, abandoned), by calls and the agent on this host',
      labelNames: ['reason'],
      registers,
    });
    this.released = new Counter({
      name: METRIC_NAMES.released,
      help: "Holds released automatically on this host's proof that it had no device of the volume",
      registers,
    });
    this.doctorFindings = new Gauge({
      name: METRIC_NAMES.doctorFindings,
      help: "Findings of latch doctor's ledger checks on this node, by check and severity (warning, error)",
      labelNames: ['check', 'severity'],
      registers,
    });
    this.backupRuns = new Counter({
      name: METRIC_NAMES.backupRuns,
      help: 'Backups and restores done on this node (manual or by a recurring job), by outcome (succeeded, failed, interrupted)',
      labelNames: ['kind', 'trigger', 'outcome'],
      registers,
    });
    this.backupDuration = new Histogram({
      name: METRIC_NAMES.backupDuration,
      help: 'Duration of the backups and restores done on this node, in seconds, by outcome',
      labelNames: ['kind', 'trigger', 'outcome'],
      buckets: BACKUP_BUCKETS,
      registers,
    });
    this.backupReadBytes = new Counter({
      name: METRIC_NAMES.backupReadBytes,
      help: "Bytes read by backups (from the volume's storage) and restores (chunk data from the target) on this node",
      labelNames: ['kind', 'trigger'],
      registers,
    });
    this.backupWrittenBytes = new Counter({
      name: METRIC_NAMES.backupWrittenBytes,
      help: 'Bytes written by backups (compressed, to the target) and restores (to the volume) on this node',
      labelNames: ['kind', 'trigger'],
      registers,
    });
    this.recurringLastSuccess = new Gauge({
      name: METRIC_NAMES.recurringLastSuccess,
      help: 'When a recurring backup job last succeeded on this node for the volume (seconds since the epoch)',
      labelNames: ['recurring', 'volume'],
      registers,
    });
    this.recurringLastFailure = new Gauge({
      name: METRIC_NAMES.recurringLastFailure,
      help: 'When a recurring backup job last failed on this node for the volume (seconds since the epoch)',
      labelNames: ['recurring', 'volume'],
      registers,
    });
    this.recurringInterval = new Gauge({
      name: METRIC_NAMES.recurringInterval,
      help: "The interval of each recurring backup job of the configuration, in seconds (between its cron's last two slots)",
      labelNames: ['recurring'],
      registers,
    });
    this.sharedQuota = new Gauge({
      name: METRIC_NAMES.sharedQuota,
      help: "The quota of each shared (CephFS) volume this node holds, in bytes: its size (the cluster's figure, as of the agent's last round)",
      labelNames: ['volume'],
      registers,
    });
    this.sharedUsed = new Gauge({
      name: METRIC_NAMES.sharedUsed,
      help: "The bytes used in each shared (CephFS) volume this node holds (the cluster's figure, as of the agent's last round)",
      labelNames: ['volume'],
      registers,
    });
    this.sharedInfoFailures = new Counter({
      name: METRIC_NAMES.sharedInfoFailures,
      help: 'Reads of the quota and use of a shared volume this node holds that failed or were skipped (one per volume and round)',
      registers,
    });
    // Every series exists from the start, so alerts and dashboards see 0 rather than nothing.
    this.released.inc(0);
    this.sharedInfoFailures.inc(0);
    for (const reason of ['expired', 'abandoned']) this.reaped.inc({ reason }, 0);
    for (const kind of BACKUP_KINDS) {
      for (const trigger of BACKUP_TRIGGERS) {
        for (const outcome of BACKUP_OUTCOMES) this.backupRuns.inc({ kind, trigger, outcome }, 0);
        this.backupReadBytes.inc({ kind, trigger }, 0);
        this.backupWrittenBytes.inc({ kind, trigger }, 0);
      }
    }
  }

  /** Counts one line of the call log: a driver call, and any automatic actions it (or the agent) recorded. */
  ingest(line: CallLogLine): void {
    if (typeof line.op === 'string' && typeof line.status === 'string') {
      this.calls.inc({ op: line.op, status: line.status });
      if (typeof line.durationMs === 'number') this.callDuration.observe({ op: line.op }, line.durationMs / 1000);
    }
    for (const action of Array.isArray(line.automatic) ? line.automatic : []) {
      if (action.kind === 'released') this.released.inc();
      else if (action.kind === 'expired' || action.kind === 'abandoned') this.reaped.inc({ reason: action.kind });
    }
    if (typeof line.backupOutcome === 'object' && line.backupOutcome !== null) this.ingestBackup(line.backupOutcome);
  }

  /** One backup or restore (node/backup-outcome.ts); anything out of shape is skipped. */
  private ingestBackup(b: NonNullable<CallLogLine['backupOutcome']>): void {
    const kind = BACKUP_KINDS.find((k) => k === b.kind);
    const trigger = BACKUP_TRIGGERS.find((t) => t === b.trigger);
    const outcome = BACKUP_OUTCOMES.find((o) => o === b.outcome);
    if (kind === undefined || trigger === undefined || outcome === undefined) return;
    const count = (n: unknown) => (typeof n === 'number' && Number.isSafeInteger(n) && n >= 0 ? n : 0);
    this.backupRuns.inc({ kind, trigger, outcome });
    if (typeof b.durationMs === 'number' && b.durationMs >= 0) this.backupDuration.observe({ kind, trigger, outcome }, b.durationMs / 1000);
    this.backupReadBytes.inc({ kind, trigger }, count(b.bytesRead));
    this.backupWrittenBytes.inc({ kind, trigger }, count(b.bytesWritten));
    if (kind !== 'backup' || trigger !== 'recurring' || outcome === 'interrupted') return;
    if (typeof b.recurring !== 'string' || !RECURRING_NAME.test(b.recurring)) return;
    if (typeof b.volume !== 'string' || !VOLUME_LABEL.test(b.volume)) return;
    const at = typeof b.finishedAt === 'string' ? Date.parse(b.finishedAt) : Number.NaN;
    if (Number.isNaN(at)) return;
    const gauge = outcome === 'succeeded' ? this.recurringLastSuccess : this.recurringLastFailure;
    const key = `${outcome} ${b.recurring} ${b.volume}`;
    // The latest wins (lines of concurrent jobs may finish out of order).
    const seconds = Math.max(at / 1000, this.recurringLatest.get(key) ?? 0);
    this.recurringLatest.set(key, seconds);
    gauge.set({ recurring: b.recurring, volume: b.volume }, seconds);
  }

  /** The configuration's recurring backup jobs and their intervals in seconds (agent/recurring.ts). */
  setRecurringIntervals(intervals: ReadonlyMap<string, number>): void {
    this.recurringInterval.reset();
    for (const [recurring, seconds] of intervals) this.recurringInterval.set({ recurring }, seconds);
  }

  /** The figures of the shared volumes this node holds (shared-usage.ts): a volume without figures this round has no series. */
  setSharedVolumeUsage(round: UsageRound): void {
    this.sharedQuota.reset();
    this.sharedUsed.reset();
    for (const [volume, usage] of round.figures) {
      this.sharedUsed.set({ volume }, usage.usedBytes);
      if (usage.quotaBytes !== undefined) this.sharedQuota.set({ volume }, usage.quotaBytes);
    }
    this.sharedInfoFailures.inc(round.failed);
  }

  /** The ledger as it is now (undefined: it could not be read). */
  setLedger(listing: VolumeListing | undefined, nowMs: number): void {
    for (const gauge of [this.volumes, this.tickets, this.ticketWaiting, this.detaching, this.damaged]) gauge.reset();
    this.ledgerUp.set(listing ? 1 : 0);
    if (!listing) return;
    const { docs, damaged } = listing;
    for (const d of damaged) this.damaged.set({ volume: d.name }, 1);
    for (const state of VOLUME_STATES) this.volumes.set({ state }, 0);
    const secondsSince = (iso: string) => Math.max(0, (nowMs - Date.parse(iso)) / 1000);
    for (const doc of docs) {
      this.volumes.inc({ state: doc.status.state });
      for (const ticket of Object.values(doc.spec.tickets)) {
        const status = doc.status.tickets[ticket.id];
        const satisfied = status?.satisfied === true && status.generation === ticket.generation;
        const condition = satisfied ? 'satisfied' : (status?.reason ?? 'Unknown');
        this.tickets.inc({ type: ticket.type, condition });
        if (!satisfied) {
          this.ticketWaiting.set(
            { volume: doc.name, ticket: ticket.id, type: ticket.type, node: ticket.nodeID, condition },
            secondsSince(ticket.createdAt),
          );
        }
      }
      for (const [node, entry] of Object.entries(doc.status.nodes)) {
        if (entry.phase === 'detaching') this.detaching.set({ volume: doc.name, node }, secondsSince(entry.since));
      }
    }
  }

  /** What the cheap doctor checks found (warnings and errors only). */
  setDoctorFindings(findings: Finding[]): void {
    this.doctorFindings.reset();
    for (const f of findings) {
      if (f.severity !== 'ok') this.doctorFindings.inc({ check: f.check, severity: f.severity });
    }
  }

  get contentType(): string {
    return this.registry.contentType;
  }

  text(): Promise<string> {
    return this.registry.metrics();
  }
}

/**
 * The ledger's gauges as of now; an unreadable ledger sets latch_ledger_up to 0 rather than failing the scrape, and a
 * damaged document is named (latch_ledger_damaged_documents) while the others are counted.
 */
export async function readLedger(collected: LatchMetrics, ctx: Pick<Context, 'ledger' | 'clock'>): Promise<void> {
  const listing = await ctx.ledger.list().catch(() => undefined);
  collected.setLedger(listing, ctx.clock());
}

// Recurring jobs (config.recurringJobs, docs/jobs.md "Recurring jobs"): every agent, every round, asks for the job
// ticket of each job's latest due slot on each volume the job selects, unless that slot is done. The ticket's ID
// depends only on the volume and the name of what it makes (`<job>-<YYYYMMDD-HHMM>`, plus `-<volume>` for a
// backup), so agents of several nodes racing for one slot converge on one ticket; the node that holds the volume
// (or, for an idle one, the first agent to ask) does the job through the job runner like any other. Only the latest
// slot is ever asked for: an agent that was down for a day makes one snapshot, not a backlog. After a success, the
// agent of the node that did the job deletes the oldest of that job's snapshots or backups of the volume beyond
// `retain`, and nothing else.
//
// The cron library is loaded here only (lazily): driver calls never pay for it.
import { deleteBackup } from '../backup/delete.js';
import { manifestExists, listBackups } from '../backup/manifest.js';
import { hasSnapshots } from '../backend/types.js';
import type { Config, RecurringJobConfig } from '../config.js';
import type { Context } from '../context.js';
import { ConfigError, LatchError, errorMessage } from '../errors.js';
import { finishedJob } from '../ledger/arbitrate.js';
import type { JobSpec, VolumeDoc } from '../ledger/types.js';
import { backupTargetOf } from './backup-target.js';
import { jobNode, jobRequest } from './request.js';

/** What latch uses of a parsed cron expression (croner's Cron). */
interface Cron {
  previousRuns(n: number, reference?: Date): Date[];
}

/** A recurring job with its parsed cron expression. */
export interface Schedule {
  job: RecurringJobConfig;
  cron: Cron;
}

/** Longest backup name the target takes (backup/layout.ts: checkBackupName). */
const MAX_BACKUP_NAME = 200;

/**
 * The configuration's recurring jobs, their cron expressions parsed (five fields, in UTC so that every node reads a
 * slot the same way). A bad expression, one that never fires, or a backup job without a backup target is a
 * ConfigError naming the field, as the schema's own errors do; `latch agent` refuses to start on one.
 */
export async function parseSchedules(config: Config): Promise<Schedule[]> {
  if (config.recurringJobs.length === 0) return [];
  const { Cron } = await import('croner');
  return config.recurringJobs.map((job, i) => {
    const field = (name: string) => `invalid configuration in ${config.source}: field "recurringJobs.${i}.${name}"`;
    let cron;
    try {
      cron = new Cron(job.cron.trim(), { timezone: 'UTC', mode: '5-part', paused: true });
    } catch (err) {
      throw new ConfigError(
        `${field('cron')}: ${JSON.stringify(job.cron)} is not a cron expression: ${errorMessage(err).replace(/^CronPattern: /, '')}`,
      );
    }
    if (cron.nextRun(new Date(0)) === null) throw new ConfigError(`${field('cron')}: ${JSON.stringify(job.cron)} never fires`);
    if (job.task === 'backup' && !config.backupTarget) {
      throw new ConfigError(`${field('task')}: recurring job "${job.name}" makes backups, but no backupTarget is configured`);
    }
    return { job, cron };
  });
}

/**
 * Each recurring backup job's interval in seconds, for the metrics and the alert on a backup that has not succeeded
 * within twice it: the time between its cron's last two slots before `nowMs`.
 */
export async function backupIntervals(config: Config, nowMs: number): Promise<Map<string, number>> {
  const intervals = new Map<string, number>();
  for (const { job, cron } of await parseSchedules(config)) {
    if (job.task !== 'backup') continue;
    const [last, before] = cron.previousRuns(2, new Date(nowMs));
    if (last && before) intervals.set(job.name, (last.getTime() - before.getTime()) / 1000);
  }
  return intervals;
}

/** The latest slot at or before `nowMs` (whole minutes: a slot at 03:00 is due from 03:00:00.000), if any. */
export function latestSlot(cron: Cron, nowMs: number): Date | undefined {
  const nextMinute = Math.floor(nowMs / 60_000) * 60_000 + 60_000;
  return cron.previousRuns(1, new Date(nextMinute))[0];
}

/** A slot as it appears in names: YYYYMMDD-HHMM, UTC (sorts as time does). */
export function slotStamp(slot: Date): string {
  const iso = slot.toISOString(); // 2026-11-23T03:00:00.000Z
  return `${iso.slice(0, 4)}${iso.slice(5, 7)}${iso.slice(8, 10)}-${iso.slice(11, 13)}${iso.slice(14, 16)}`;
}

/** Whether a volume name matches one of the selector's names or patterns (`*`: any run of characters, `?`: one). */
export function selects(selector: readonly string[], volume: string): boolean {
  return selector.some((pattern) => globRegExp(pattern).test(volume));
}

function globRegExp(pattern: string): RegExp {
  const body = [...pattern].map((c) => (c === '*' ? '.*' : c === '?' ? '.' : escapeRegExp(c))).join('');
  return new RegExp(`^${body}$`);
}

function escapeRegExp(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}

/**
 * What a job makes for a volume in a slot. Snapshots belong to their volume: `<job>-<stamp>`. Backup names are one
 * namespace per target, so a backup also names its volume: `<job>-<stamp>-<volume>`.
 */
export function recurringName(job: RecurringJobConfig, stamp: string, volume: string): string {
  return job.task === 'snapshot' ? `${job.name}-${stamp}` : `${job.name}-${stamp}-${volume}`;
}

/** The slot stamp of a name this job made for this volume, or undefined for any other name. */
function stampOfRecurringName(job: RecurringJobConfig, volume: string, name: string): string | undefined {
  const tail = job.task === 'snapshot' ? '' : `-${escapeRegExp(volume)}`;
  return new RegExp(`^${escapeRegExp(job.name)}-([0-9]{8}-[0-9]{4})${tail}$`).exec(name)?.[1];
}

/**
 * Of the names given, the ones retention deletes: those this job made for this volume, but the newest `retain`.
 * Every other name is left alone, whatever it looks like.
 */
export function beyondRetention(job: RecurringJobConfig, volume: string, names: readonly string[]): string[] {
  const made = names
    .map((name) => ({ name, stamp: stampOfRecurringName(job, volume, name) }))
    .filter((m): m is { name: string; stamp: string } => m.stamp !== undefined)
    .sort((a, b) => b.stamp.localeCompare(a.stamp));
  return made.slice(job.retain).map((m) => m.name);
}

type Log = (entry: Record<string, unknown>) => void;

/**
 * Retention runs once per finished job in this process (it is idempotent; this only saves the listing): per node, job
 * and volume, the finished job it last ran for. Bounded by jobs times volumes, however long the agent runs.
 */
const retentionDone = new Map<string, string>();

/**
 * One round: for each job, its latest due slot on each selected volume. One volume's failure does not stop the rest.
 * The schedules are parsed each round (cheap): `latch agent` parsed them once at start, so a bad one stopped it there.
 */
export async function runRecurringJobs(ctx: Context, log: Log): Promise<void> {
  const schedules = await parseSchedules(ctx.config);
  if (schedules.length === 0) return;
  const now = ctx.clock();
  const { docs, damaged } = await ctx.ledger.list();
  for (const d of damaged) log({ volume: d.name, error: `recurring jobs skipped it: ${d.reason}` });
  for (const { job, cron } of schedules) {
    const slot = latestSlot(cron, now);
    if (!slot) continue;
    const stamp = slotStamp(slot);
    for (const doc of docs.filter((d) => selects(job.volumes, d.name))) {
      try {
        await runSlot(ctx, job, stamp, doc, log);
      } catch (err) {
        log({ volume: doc.name, recurring: job.name, slot: stamp, error: errorMessage(err) });
      }
    }
  }
}

async function runSlot(ctx: Context, job: RecurringJobConfig, stamp: string, doc: VolumeDoc, log: Log): Promise<void> {
  const me = ctx.config.nodeName;
  const volume = doc.name;
  const name = recurringName(job, stamp, volume);
  if (name.length > MAX_BACKUP_NAME) {
    throw new LatchError(
      `the backup name ${name.slice(0, 40)}... would be longer than ${MAX_BACKUP_NAME} characters: shorten the job's name`,
    );
  }
  const spec: JobSpec = job.task === 'snapshot' ? { kind: 'snapshot', snapshot: name } : { kind: 'backup', backup: name };
  // The holder of a volume in use; for an idle one, this node (the first agent to ask wins: the ID is the same).
  const node = jobNode(ctx, volume, doc);
  const request = jobRequest(ctx, volume, spec, node, { owner: `recurring job ${job.name}` });
  const id = request.id;
  const finished = finishedJob(doc, id);
  if (finished) {
    // Done (succeeded or failed: a failed slot is not retried; the next slot is a new try).
    if (finished.status.state === 'succeeded' && finished.node === me)
      await applyRetention(ctx, job, volume, `${id}@${finished.status.finishedAt ?? ''}`, log);
    return;
  }
  if (doc.spec.tickets[id]) return; // asked for already, by this agent or another: under way
  // An earlier slot's ticket of this job is still there (its node's agent is down, or the volume is held by a failed
  // restore): no second one, so that tickets never pile up behind it.
  const earlier = Object.values(doc.spec.tickets).find((t) => t.job && madeBy(job, volume, t.job));
  if (earlier) {
    log({ volume, recurring: job.name, slot: stamp, waiting: `the ticket of an earlier slot (${earlier.id}) is not done yet` });
    return;
  }
  if (await alreadyMade(ctx, job, volume, name)) return;
  try {
    await ctx.ledger.requestJob(volume, request);
  } catch (err) {
    // Another agent asked first, for another node: its ticket is the slot's ticket (the IDs are the same).
    const now = await ctx.ledger.get(volume);
    if (err instanceof LatchError && now && (now.spec.tickets[id] || finishedJob(now, id))) return;
    throw err;
  }
  log({ volume, recurring: job.name, slot: stamp, ticket: id, node, [job.task]: name });
}

/** Whether a job spec is one this recurring job asks for on this volume (any slot). */
function madeBy(job: RecurringJobConfig, volume: string, spec: JobSpec): boolean {
  const name = spec.kind === 'snapshot' ? spec.snapshot : spec.kind === 'backup' ? spec.backup : undefined;
  return spec.kind === job.task && name !== undefined && stampOfRecurringName(job, volume, name) !== undefined;
}

/** The slot's snapshot or backup exists (made by hand, or by a job whose record rolled out of status.jobs). */
async function alreadyMade(ctx: Context, job: RecurringJobConfig, volume: string, name: string): Promise<boolean> {
  if (job.task === 'backup') return manifestExists(backupTargetOf(ctx.config), name);
  if (!hasSnapshots(ctx.backend)) throw new LatchError(`${ctx.backend.storage} cannot take snapshots`);
  return (await ctx.backend.listSnapshots(volume)).some((s) => s.name === name);
}

/** Deletes this job's oldest snapshots or backups of the volume beyond `retain`. */
async function applyRetention(ctx: Context, job: RecurringJobConfig, volume: string, key: string, log: Log): Promise<void> {
  const where = `${ctx.config.nodeName}/${job.name}/${volume}`;
  if (retentionDone.get(where) === key) return;
  if (job.task === 'snapshot') {
    if (!hasSnapshots(ctx.backend)) return;
    const backend = ctx.backend;
    const names = (await backend.listSnapshots(volume)).map((s) => s.name);
    for (const old of beyondRetention(job, volume, names)) {
      await backend.deleteSnapshot(volume, old);
      log({ volume, recurring: job.name, retention: `deleted snapshot ${old}` });
    }
  } else {
    const target = backupTargetOf(ctx.config);
    // Only complete backups of this volume: a damaged manifest is a person's to look at, never retention's to delete.
    const names = (await listBackups(target, volume)).filter((b) => b.manifest?.volume === volume).map((b) => b.name);
    for (const old of beyondRetention(job, volume, names)) {
      await deleteBackup({ target, name: old, missingOk: true, node: ctx.config.nodeName });
      log({ volume, recurring: job.name, retention: `deleted backup ${old}` });
    }
  }
  retentionDone.set(where, key);
}

// What `latch agent` does periodically on its node: a list of small, independent tasks, each safe to run at any
// moment and to be cut short (the agent keeps no state that the ledger does not hold). To add a job (snapshots,
// backups, ...), write a task and add it to AGENT_TASKS.
import type { Config } from '../config.js';
import type { Context } from '../context.js';
import { errorMessage } from '../errors.js';
import type { AutomaticAction } from '../ledger/types.js';
import { writeLog, type CallLog } from '../log.js';
import { Ledger, type DamagedVolume } from '../ledger/ledger.js';
import { releaseHoldWithoutDevice } from '../node/self-release.js';
import { runLedgerChecks } from '../doctor/run.js';
import { backupIntervals, runRecurringJobs } from '../jobs/recurring.js';
import { thawFreezesLeftBehind } from './startup.js';
import type { LatchMetrics } from './metrics.js';
import { gatherSharedVolumeUsage } from './shared-usage.js';

/** What a task may use besides the context: the metrics it feeds and the log. */
export interface AgentRun {
  ctx: Context;
  metrics: LatchMetrics;
  /** Appends one line to the latch log (the agent's lines carry `agent: <task>`). */
  log: (entry: Record<string, unknown>) => void;
}

export interface AgentTask {
  name: string;
  run(run: AgentRun): Promise<void>;
}

/** Removes expired tickets, and waiting workload tickets nobody asked for in abandonedTicketSeconds. */
const reapTickets: AgentTask = {
  name: 'reap-tickets',
  async run({ ctx, log }) {
    const abandonedMs = ctx.config.abandonedTicketSeconds > 0 ? ctx.config.abandonedTicketSeconds * 1000 : undefined;
    const { docs, damaged } = await ctx.ledger.list();
    logDamaged(damaged, log);
    for (const doc of docs) {
      const reaped = await ctx.ledger.reapTickets(doc.name, abandonedMs);
      for (const action of reaped) log({ volume: doc.name, automatic: [action] satisfies AutomaticAction[] });
    }
  },
};

/** Releases this node's attaching and detaching holds that its kernel proves it no longer has (node/self-release.ts). */
const releaseStaleHolds: AgentTask = {
  name: 'release-stale-holds',
  async run({ ctx, log }) {
    const node = ctx.config.nodeName;
    const { docs, damaged } = await ctx.ledger.list();
    logDamaged(damaged, log);
    for (const doc of docs) {
      const phase = doc.status.nodes[node]?.phase;
      if (phase !== 'attaching' && phase !== 'detaching') continue;
      try {
        const result = await releaseHoldWithoutDevice(ctx, doc.name);
        if (result.released) log({ volume: doc.name, automatic: [result.action] });
      } catch (err) {
        // The backend or the ledger could not answer: nothing was released; the next round tries again.
        log({ volume: doc.name, error: errorMessage(err) });
      }
    }
  },
};

/** Each damaged document, named in the log: the task did the other volumes, and skipped this one. */
function logDamaged(damaged: DamagedVolume[], log: (entry: Record<string, unknown>) => void): void {
  for (const d of damaged) log({ volume: d.name, error: `skipped: ${d.reason}` });
}

/** The cheap doctor checks, for the latch_doctor_findings gauge. */
const doctorFindings: AgentTask = {
  name: 'doctor',
  async run({ ctx, metrics }) {
    metrics.setDoctorFindings(await runLedgerChecks(ctx, ctx.config));
  },
};

/** Asks for the tickets of the recurring jobs' due slots, and applies their retention (jobs/recurring.ts). */
const recurringJobs: AgentTask = {
  name: 'recurring-jobs',
  async run({ ctx, log, metrics }) {
    metrics.setRecurringIntervals(await backupIntervals(ctx.config, ctx.clock()));
    await runRecurringJobs(ctx, log);
  },
};

/** The quota and use of the shared volumes this node holds, read from the cluster (shared-usage.ts). */
const sharedVolumeUsage: AgentTask = {
  name: 'shared-volume-usage',
  async run({ ctx, log, metrics }) {
    metrics.setSharedVolumeUsage(await gatherSharedVolumeUsage(ctx, log));
  },
};

/** Thaws the freezes a latch process lost track of: killed while frozen, or a freeze that landed after its deadline. */
const thawLeftoverFreezes: AgentTask = {
  name: 'thaw-leftover-freezes',
  run: ({ ctx, log }) => thawFreezesLeftBehind(ctx.config, log),
};

export const AGENT_TASKS: readonly AgentTask[] = [
  thawLeftoverFreezes,
  reapTickets,
  releaseStaleHolds,
  recurringJobs,
  doctorFindings,
  sharedVolumeUsage,
];

/**
 * A context for one task round over the agent's long-lived one: the same store, backend and system, but its own call
 * log and a ledger that reports into it (the agent runs for weeks: nothing may pile up in one context).
 */
export function freshContext(base: Context): Context {
  const log: CallLog = {};
  const iso = () => new Date(base.clock()).toISOString();
  const ledger = new Ledger(base.ledger.store, iso, (action) => {
    log.automatic = [...((log.automatic as AutomaticAction[] | undefined) ?? []), action];
  });
  return { ...base, log, ledger };
}

/** Runs every task once, in order; one task's failure is logged and does not stop the others. */
export async function runAgentTasks(
  config: Config,
  context: () => Context,
  metrics: LatchMetrics,
  tasks: readonly AgentTask[] = AGENT_TASKS,
): Promise<void> {
  for (const task of tasks) {
    const ctx = context();
    const log = (entry: Record<string, unknown>) =>
      writeLog(config, { agent: task.name, pid: process.pid, node: config.nodeName, ...entry });
    try {
      await task.run({ ctx, metrics, log });
    } catch (err) {
      log({ error: errorMessage(err) });
    }
  }
}

// latch metrics: the agent's metrics, once, on stdout (for node-exporter's textfile collector:
// `latch metrics > /var/lib/node_exporter/textfile/latch.prom.tmp && mv ...`). Call counters cover the retained
// log files, so they drop when the oldest rotated file goes: Prometheus reads that as a counter reset.
import { runLedgerChecks } from '../doctor/run.js';
import { backupIntervals } from '../jobs/recurring.js';
import { configOf, type CommandIO } from './io.js';
import { readWholeLog } from '../agent/call-log.js';
import { LatchMetrics, readLedger } from '../agent/metrics.js';
import { gatherSharedVolumeUsage } from '../agent/shared-usage.js';
import { writeLog } from '../log.js';

export async function metrics(_options: Record<string, never>, io: CommandIO): Promise<void> {
  const config = configOf(io);
  const collected = await LatchMetrics.create();
  await readWholeLog(config.logFile, (line) => collected.ingest(line));
  const ctx = io.context(config);
  await readLedger(collected, ctx);
  collected.setDoctorFindings(await runLedgerChecks(ctx, config));
  // As the agent sets it each round: the alert on a late recurring backup needs each job's interval.
  collected.setRecurringIntervals(await backupIntervals(config, ctx.clock()));
  // As the agent's round reads them: the quota and use of the shared volumes this node holds (a failure is logged).
  const log = (entry: Record<string, unknown>) =>
    writeLog(config, { command: 'metrics', pid: process.pid, node: config.nodeName, ...entry });
  collected.setSharedVolumeUsage(await gatherSharedVolumeUsage(ctx, log));
  io.out(await collected.text());
}

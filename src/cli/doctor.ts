// latch doctor: check this node and say, for each finding, which command fixes it. The checks are doctor/'s; the
// command shows their findings and exits by them.
import { LatchError } from '../errors.js';
import type { CommandIO } from './io.js';
import { formatJson, formatTable, type OutputFormat } from './output.js';
import type { DoctorReport } from '../doctor/findings.js';
import { runDoctor } from '../doctor/run.js';

export interface DoctorCommandOptions {
  pluginDir?: string;
  /** Seconds a volume may be detaching before it is reported. */
  stuckAfter: number;
  output: OutputFormat;
}

/** Exit status: 0 healthy, 1 with errors (something is broken now), 2 with warnings only. */
export async function doctor(options: DoctorCommandOptions, io: CommandIO): Promise<number> {
  const report = await runDoctor({
    env: io.env,
    context: (config) => io.context(config),
    ...(options.pluginDir !== undefined && { pluginDir: options.pluginDir }),
    stuckAfterSeconds: options.stuckAfter,
  });
  io.out(options.output === 'json' ? formatJson(report) : formatDoctorReport(report));
  return doctorExitCode(report);
}

/** The --stuck-after value: whole seconds. */
export function parseSeconds(value: string): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 0) throw new LatchError(`--stuck-after must be a whole number of seconds, not "${value}"`);
  return n;
}

/** 0 healthy, 1 with any error, 2 with warnings only. */
export function doctorExitCode(report: DoctorReport): number {
  return report.errors > 0 ? 1 : report.warnings > 0 ? 2 : 0;
}

/** The report for people: a table of findings, each fix or note under its finding, then the verdict. */
function formatDoctorReport(report: DoctorReport): string {
  const heading =
    `latch doctor on node ${report.node ?? '(unknown: no valid configuration)'}` +
    `${report.config ? ` (configuration: ${report.config})` : ''}\n\n`;
  const rows: string[][] = [];
  for (const f of report.findings) {
    rows.push([f.severity, f.check, f.message]);
    if (f.fix) rows.push(['', '', `fix: ${f.fix}${f.note ? `   # ${f.note}` : ''}`]);
    else if (f.note) rows.push(['', '', `note: ${f.note}`]);
  }
  const verdict = report.healthy
    ? 'healthy'
    : `${report.errors} error(s), ${report.warnings} warning(s)${report.errors > 0 ? '' : ' (no errors)'}`;
  return `${heading}${formatTable(['status', 'check', 'finding'], rows)}\n${verdict}\n`;
}

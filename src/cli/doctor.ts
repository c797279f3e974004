// latch doctor: check this node and say, for each finding, which command fixes it (the checks are in doctor/).
import { LatchError } from '../errors.js';
import type { CommandIO } from './io.js';
import { formatJson, type OutputFormat } from './output.js';
import { doctorExitCode, formatDoctorReport } from '../doctor/findings.js';
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

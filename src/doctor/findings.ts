// What latch doctor finds (the command, cli/doctor.ts, shows it and exits by it).
//
// Severities: "error" when something is broken now or the ledger and the kernel disagree (a call will fail, or a
// volume could be written from where the ledger does not know); "warning" when latch works but something needs
// attention (a tool only some volumes need, an overcommitted pool, another driver version installed, a volume
// detaching for longer than --stuck-after).

export type Severity = 'ok' | 'warning' | 'error';

export interface Finding {
  check: string;
  severity: Severity;
  message: string;
  /** The shell command that fixes it, ready to run (absent for ok findings and where only a person can decide). */
  fix?: string;
  /** What to know before running the fix, or what else would do. */
  note?: string;
}

/** How a check reports: one call per finding, in the order people should read (and fix) them. */
export type AddFinding = (finding: Finding) => void;

export interface DoctorReport {
  node?: string;
  config?: string;
  healthy: boolean;
  errors: number;
  warnings: number;
  findings: Finding[];
}

export function doctorReport(findings: Finding[], configured?: { node: string; config: string }): DoctorReport {
  const errors = findings.filter((f) => f.severity === 'error').length;
  const warnings = findings.filter((f) => f.severity === 'warning').length;
  return { ...configured, healthy: errors === 0 && warnings === 0, errors, warnings, findings };
}

/** A word as a POSIX shell reads it back: plain when safe, else single-quoted (fixes are meant to be pasted). */
export function sh(word: string): string {
  // '~' expands only at the start of a word, so latch~loop needs no quotes.
  return /^[\w@%+=:,./-][\w@%+=:,./~-]*$/.test(word) ? word : `'${word.replace(/'/g, `'\\''`)}'`;
}

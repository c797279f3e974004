// Human tables and machine JSON for the admin commands.
import { LatchError } from '../errors.js';

export type OutputFormat = 'table' | 'json';

/** The -o/--output value; a LatchError (which the surface reports as a bad option value) for anything else. */
export function parseFormat(value: string): OutputFormat {
  if (value !== 'table' && value !== 'json') throw new LatchError(`output format must be "table" or "json", not "${value}"`);
  return value;
}

export function formatJson(data: unknown): string {
  return `${JSON.stringify(data, null, 2)}\n`;
}

/** Rows under upper-case column headings, columns padded to their widest cell. */
export function formatTable(columns: string[], rows: string[][]): string {
  const widths = columns.map((c, i) => Math.max(c.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: string[]) => cells.map((c, i) => (i === cells.length - 1 ? c : c.padEnd(widths[i] ?? 0))).join('  ');
  return `${[line(columns.map((c) => c.toUpperCase())), ...rows.map(line)].join('\n')}\n`;
}

// Human tables and machine JSON for the admin commands.
import { LatchError } from '../errors.js';

export type OutputFormat = 'table' | 'json';

/** The -o/--output value; a LatchError (which the surface reports as a bad option value) for anything else. */
export function parseFormat(value: string): OutputFormat {
  if (value !== 'table' && value !== 'json') throw new LatchError(`output format must be "table" or "json", not "${value}"`);
  return value;
}

/**
 * Text as a terminal may show it: what admin commands print comes partly from the ledger, backup targets and the
 * storage, which other nodes and tenants write, so a control character in it (an escape sequence that moves the
 * cursor, rewrites the title or hides the rest of a line; a carriage return; a bidirectional override) is shown as
 * its escape, `\u001b`, instead of acting. Newlines and tabs stay. The escape is JSON's own, so `-o json` output stays
 * valid JSON that decodes to the same strings (JSON.stringify escapes C0 characters itself, but not DEL, C1 or the
 * bidirectional controls).
 */
export function printable(text: string): string {
  return text.replace(
    // eslint-disable-next-line no-control-regex -- matching control characters is the point
    /[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g,
    (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`,
  );
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

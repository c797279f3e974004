// Human tables and machine JSON for the admin commands.

export type OutputFormat = 'table' | 'json';

export function parseFormat(value: string): OutputFormat {
  if (value !== 'table' && value !== 'json') throw new Error(`output format must be "table" or "json", not "${value}"`);
  return value;
}

export function printJson(data: unknown): void {
  process.stdout.write(`${JSON.stringify(data, null, 2)}\n`);
}

/** Prints rows under upper-case column headings, columns padded to their widest cell. */
export function printTable(columns: string[], rows: string[][]): void {
  const widths = columns.map((c, i) => Math.max(c.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: string[]) => cells.map((c, i) => (i === cells.length - 1 ? c : c.padEnd(widths[i]!))).join('  ');
  process.stdout.write(`${[line(columns.map((c) => c.toUpperCase())), ...rows.map(line)].join('\n')}\n`);
}

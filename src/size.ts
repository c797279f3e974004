// Kubernetes-style quantities for volume sizes: "1Gi", "500M", "1.5Gi", plain bytes "1073741824".
import { LatchError } from './errors.js';

const MULTIPLIERS: Record<string, number> = {
  '': 1,
  k: 1e3,
  K: 1e3,
  M: 1e6,
  G: 1e9,
  T: 1e12,
  P: 1e15,
  Ki: 2 ** 10,
  Mi: 2 ** 20,
  Gi: 2 ** 30,
  Ti: 2 ** 40,
  Pi: 2 ** 50,
};

const QUANTITY = /^([0-9]+(?:\.[0-9]+)?)(|k|K|M|G|T|P|Ki|Mi|Gi|Ti|Pi)$/;

/** Parses a size into bytes; throws a LatchError naming `what` for anything that is not a positive whole size. */
export function parseSize(input: string | number, what = 'size'): number {
  const text = String(input).trim();
  const match = QUANTITY.exec(text);
  if (!match) {
    throw new LatchError(`${what} "${truncate(text)}" is not a size: use bytes or a quantity such as 1Gi, 500Mi or 10G`);
  }
  const bytes = Number(match[1]) * (MULTIPLIERS[match[2] ?? ''] ?? Number.NaN);
  if (!Number.isSafeInteger(Math.floor(bytes)) || bytes < 1) {
    throw new LatchError(`${what} "${text}" is out of range: it must be at least 1 byte and below 8 PiB`);
  }
  return Math.floor(bytes);
}

/** Human form for messages and tables: 1073741824 -> "1Gi". */
export function formatSize(bytes: number): string {
  const units = ['', 'Ki', 'Mi', 'Gi', 'Ti', 'Pi'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1 && value % 1024 === 0) {
    value /= 1024;
    unit++;
  }
  if (unit === 0 && bytes >= 1024) {
    // Not an exact power-of-two multiple: show one decimal.
    let v = bytes;
    let u = 0;
    while (v >= 1024 && u < units.length - 1) {
      v /= 1024;
      u++;
    }
    return `${v.toFixed(1)}${units[u]}`;
  }
  return `${value}${units[unit]}`;
}

/** Bytes for people, to three significant digits: 79.4Gi rather than 83253956Ki (for measured sizes, not chosen ones). */
export function formatApproxSize(bytes: number): string {
  const units = ['', 'Ki', 'Mi', 'Gi', 'Ti', 'Pi', 'Ei'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return unit === 0 ? `${bytes} bytes` : `${value >= 100 ? value.toFixed(0) : value.toFixed(1)}${units[unit]}`;
}

function truncate(text: string): string {
  return text.length > 40 ? `${text.slice(0, 40)}...` : text;
}

// The process's effective capabilities, from /proc/self/status (a sandbox may drop some even for root).
import { readFile } from 'node:fs/promises';

/** The effective capability mask of this process, or undefined when unreadable. */
export async function effectiveCapabilities(): Promise<bigint | undefined> {
  try {
    return parseCapEff(await readFile('/proc/self/status', 'utf8'));
  } catch {
    return undefined;
  }
}

/** Parses the CapEff line of /proc/<pid>/status. */
export function parseCapEff(status: string): bigint | undefined {
  const match = /^CapEff:\s*([0-9a-fA-F]+)\s*$/m.exec(status);
  return match ? BigInt(`0x${match[1]}`) : undefined;
}

export function hasCapability(mask: bigint, bit: number): boolean {
  return ((mask >> BigInt(bit)) & 1n) === 1n;
}

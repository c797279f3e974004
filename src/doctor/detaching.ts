// doctor: volumes detaching from a node (this one or another) for longer than --stuck-after.
import { liveDevice, type Inventory } from '../host/inventory.js';
import type { AddFinding } from './findings.js';

export const DEFAULT_STUCK_AFTER_SECONDS = 300;

/** Reports each volume stuck detaching, with what is safe to do about it; returns how many it reported. */
export function checkDetaching(held: Inventory, stuckAfterSeconds: number, now: () => number, add: AddFinding): number {
  const { node } = held;
  let problems = 0;
  for (const doc of held.volumes) {
    for (const [holder, entry] of Object.entries(doc.status.nodes)) {
      if (entry.phase !== 'detaching') continue;
      const since = Date.parse(entry.since);
      const seconds = Number.isFinite(since) ? Math.floor((now() - since) / 1000) : Number.POSITIVE_INFINITY;
      if (seconds < stuckAfterSeconds) continue;
      problems++;
      let detail: string;
      let fix: string | undefined;
      let note: string;
      if (holder === node) {
        const device = liveDevice(held, doc.name);
        const mounted = device?.mountPoints ?? [];
        if (!device) {
          detail = 'no device of it is set up here any more';
          fix = `latch volume release ${doc.name} --node ${node} --node-is-down`;
          note = `safe: no device of ${doc.name} is set up on ${node}`;
        } else {
          detail = `${device.device} is still set up${mounted.length > 0 ? ` and mounted at ${mounted.join(', ')}` : ''}: kubelet has not called unmountdevice`;
          fix = undefined;
          note = `find the pod still using it (kubelet calls unmountdevice once none does); by hand, once nothing uses it: ${mounted.length > 0 ? `umount ${mounted.join(' ')} && ` : ''}losetup -d ${device.device} && latch volume release ${doc.name} --node ${node} --node-is-down`;
        }
      } else {
        detail = `node ${holder} has not confirmed it released the device`;
        fix = undefined;
        note = `run latch doctor on ${holder}; if ${holder} is down for good: latch volume release ${doc.name} --node ${holder} --node-is-down`;
      }
      add({
        check: 'detaching',
        severity: 'warning',
        message: `volume ${doc.name} has been detaching from node ${holder} for ${formatSeconds(seconds)} (since ${entry.since}): ${detail}`,
        ...(fix !== undefined && { fix }),
        note,
      });
    }
  }
  return problems;
}

function formatSeconds(seconds: number): string {
  if (!Number.isFinite(seconds)) return 'an unknown time';
  if (seconds < 120) return `${seconds}s`;
  if (seconds < 7200) return `${Math.floor(seconds / 60)}m`;
  return `${Math.floor(seconds / 3600)}h`;
}

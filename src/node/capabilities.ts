// Capabilities a node-side step needs of this process, checked before anything changes: growing an ext filesystem
// online needs CAP_SYS_RESOURCE (the kernel refuses resize2fs without it, and sandboxes drop it even for root).
import type { Context } from '../context.js';
import { LatchError } from '../errors.js';
import { growSpecOf } from '../filesystems.js';
import { hasCapability } from '../sys/capabilities.js';

/** Refuses, before anything changes, an online grow the kernel would refuse (a capability the process lacks). */
export async function checkCanGrowOnline(ctx: Context, name: string, fsType: string): Promise<void> {
  const needs = growSpecOf(fsType)?.growNeeds;
  if (!needs) return;
  const mask = await ctx.system.effectiveCapabilities();
  if (mask !== undefined && !hasCapability(mask, needs.bit)) {
    throw new LatchError(`${missingCapabilityMessage(name, fsType, mask)}; nothing was changed`);
  }
}

/** Whether a grow that failed with this output failed for want of the capability its filesystem needs. */
export function isMissingCapability(fsType: string, output: string): boolean {
  return growSpecOf(fsType)?.growNeeds !== undefined && /permission denied|operation not permitted/i.test(output);
}

export function missingCapabilityMessage(name: string, fsType: string, mask: bigint | undefined): string {
  const capability = growSpecOf(fsType)?.growNeeds?.capability ?? 'CAP_SYS_RESOURCE';
  const shown = mask === undefined ? '' : ` (CapEff ${mask.toString(16).padStart(16, '0')})`;
  return (
    `growing the ${fsType} filesystem of volume ${name} online needs the capability ${capability}, which this process ` +
    `lacks${shown}: the kernel refuses to grow it without it. Run latch with ${capability} (a privileged ` +
    "DaemonSet, or the host's root outside a restricted sandbox)"
  );
}

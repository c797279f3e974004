// Growing a volume: its storage, its device's capacity and (online, where it is mounted read-write) its filesystem.
// Volumes only grow; a request that would shrink, pass maxSize or the pool's free space changes nothing.
import type { Context } from '../context.js';
import { LatchError } from '../errors.js';
import { isInUse } from '../ledger/arbitrate.js';
import { formatSize } from '../size.js';
import type { MountInfo } from '../sys/mounts.js';
import { CommandError } from '../sys/run.js';
import { checkCanGrowOnline, isMissingCapability, missingCapabilityMessage } from './capabilities.js';
import { withVolumeLock } from './lock.js';

/** Refuses a size request that shrinks the volume or passes maxSize; returns the storage's current size. */
export async function checkGrowRequest(ctx: Context, name: string, newBytes: number): Promise<number | undefined> {
  if (!Number.isSafeInteger(newBytes) || newBytes < 1)
    throw new LatchError(`volume ${name}: new size ${newBytes} is not a positive byte count`);
  const { maxSize } = ctx.config;
  if (newBytes > maxSize) {
    throw new LatchError(
      `volume ${name}: the new size ${formatSize(newBytes)} is above the limit of ${formatSize(maxSize)} (maxSize); nothing was changed`,
    );
  }
  const current = await ctx.backend.size(name);
  if (current !== undefined && newBytes < current) throw shrinkRefused(name, current, newBytes);
  return current;
}

function shrinkRefused(name: string, current: number, newBytes: number): LatchError {
  return new LatchError(
    `volume ${name}: cannot shrink from ${formatSize(current)} to ${formatSize(newBytes)}; volumes only grow (nothing was changed)`,
  );
}

/** Where the volume's filesystem is mounted on this node: `hint` when it is a mount of `device`, else a whole-fs mount. */
export async function filesystemMountOf(ctx: Context, device: string, hint?: string): Promise<MountInfo | undefined> {
  const table = await ctx.system.readMountInfo();
  const mine = table.filter((m) => m.source === device);
  if (mine.length === 0) return undefined;
  if (hint) {
    const atHint = (await ctx.system.mountsAt(hint, table)).at(-1);
    if (atHint && atHint.source === device && !atHint.options.includes('ro')) return atHint;
  }
  return mine.find((m) => m.root === '/' && !m.options.includes('ro')) ?? mine.find((m) => !m.options.includes('ro')) ?? mine[0];
}

/** Grows the mounted filesystem to fill its device; turns a refusal for want of a capability into a message that says so. */
export async function growFilesystem(ctx: Context, name: string, device: string, where: MountInfo): Promise<void> {
  try {
    await ctx.system.growFs(device, where.mountPoint, where.fsType);
  } catch (err) {
    if (err instanceof CommandError && isMissingCapability(where.fsType, err.stderrTail)) {
      throw new LatchError(
        `${missingCapabilityMessage(name, where.fsType, await ctx.system.effectiveCapabilities())}. The image and the device ` +
          `already have the new size; repeating the call with the capability finishes the job (${err.message})`,
        { cause: err },
      );
    }
    throw err;
  }
}

/**
 * What `latch volume expand` does: grows the storage (and the device set up on this host); when this node holds
 * the volume mounted read-write, grows its filesystem online too. Returns what was done, for people.
 */
export async function expandVolume(ctx: Context, name: string, newBytes: number): Promise<string> {
  const { ledger, backend, config } = ctx;
  const node = config.nodeName;
  return withVolumeLock(config, name, async () => {
    const doc = await ledger.get(name);
    if (!doc) throw new LatchError(`volume ${name} does not exist (latch volume list shows the volumes)`);
    if (doc.spec.shared) return (await import('./shared.js')).expandShared(ctx, doc, newBytes);
    const current = await checkGrowRequest(ctx, name, newBytes);
    if (current === undefined) {
      // Never attached yet: the image is made at the ledger's size on first use.
      if (newBytes < doc.spec.sizeBytes) throw shrinkRefused(name, doc.spec.sizeBytes, newBytes);
      await ledger.recordSize(name, newBytes);
      return `volume ${name} has no image yet; it will be made with ${formatSize(newBytes)} on first use`;
    }

    const here = doc.status.nodes[node];
    const device = here && isInUse(here.phase) ? await backend.findDevice(name) : undefined;
    const where = device ? await filesystemMountOf(ctx, device) : undefined;
    const online = device !== undefined && where !== undefined && !here?.readOnly && !where.options.includes('ro');
    if (online) await checkCanGrowOnline(ctx, name, where.fsType);

    await backend.grow(name, newBytes);
    await ledger.recordSize(name, newBytes);
    const done = `volume ${name}: image grown to ${formatSize(newBytes)}`;
    if (online) {
      await growFilesystem(ctx, name, device, where);
      return `${done}; its ${where.fsType} filesystem was grown online on node ${node} (mounted at ${where.mountPoint})`;
    }
    if (where) {
      return `${done}; it is mounted read-only on node ${node}, so its filesystem grows the next time it is expanded while mounted read-write`;
    }
    const holders = Object.entries(doc.status.nodes)
      .filter(([n, e]) => n !== node && e.phase !== 'granted')
      .map(([n]) => n);
    if (holders.length > 0) {
      return (
        `${done}; it is in use on node ${holders.join(', ')}: run "latch volume expand ${name} --size ${newBytes}" ` +
        'there to refresh its device and grow the filesystem online'
      );
    }
    return `${done} (offline: only the image); the filesystem grows online the next time the volume is expanded while mounted (kubelet's expandfs, or this command on that node)`;
  });
}

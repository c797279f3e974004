// The filesystem on a volume: the one already there, or a new one when (and only when) the device is blank and
// nothing else could be relying on it. The decision is a pure function; making the filesystem is the only effect.
import type { Context } from '../context.js';
import { LatchError } from '../errors.js';
import type { FsType } from '../filesystems.js';
import type { VolumeDoc } from '../ledger/types.js';

export interface FilesystemFacts {
  doc: VolumeDoc;
  /** What blkid found on the device (undefined: no signature at all). */
  found: string | undefined;
  /** The filesystem asked for, if any: a different one on the device is refused. */
  wanted: FsType | undefined;
  /** Whether a blank device may be formatted (false for read-only requests: there would be nothing to read). */
  mayFormat: boolean;
  node: string;
}

/** Use the filesystem found, or format with the one given. Throws (a LatchError that says why) when neither is safe. */
export type FilesystemPlan = { use: string } | { format: FsType };

export function planFilesystem({ doc, found, wanted, mayFormat, node }: FilesystemFacts): FilesystemPlan {
  if (found) {
    if (wanted && wanted !== found) {
      throw new LatchError(`volume ${doc.name} holds a ${found} filesystem, but ${wanted} was asked for; latch never reformats a volume`);
    }
    return { use: found };
  }
  if (doc.status.filesystem) {
    throw new LatchError(
      `volume ${doc.name} held a ${doc.status.filesystem} filesystem but its device shows none now; ` +
        'refusing to format it (inspect the image before anything else)',
    );
  }
  if (!mayFormat) {
    throw new LatchError(
      `volume ${doc.name} is blank and was asked for read-only: there is nothing to mount; attach it read-write once to format it`,
    );
  }
  const others = Object.keys(doc.status.nodes).filter((n) => n !== node);
  if (others.length > 0) {
    throw new LatchError(`volume ${doc.name} is blank but also held by ${others.join(', ')}; refusing to format it`);
  }
  return { format: wanted ?? doc.spec.fsType };
}

/**
 * Returns the filesystem to mount on `device`, making one as planFilesystem decides, and records it in the ledger.
 * The caller holds the node's volume lock (node/lock.ts).
 *
 * One look decides (the backend's proof that the device is blank, else blkid), and no second blkid runs right before
 * mkfs (it cost 7-10 ms a format): nothing can write a signature to the device in between. Every latch call that
 * mounts, formats or sets up the volume on this node holds the node's volume lock; no other node holds the volume
 * (planFilesystem refuses to format while another node has a hold, read-only ones included, and the ledger grants a
 * read-write volume to one node at a time); nothing of the volume is mounted here (mountVolumeAt found the path
 * empty, and a device mounted elsewhere would have shown its filesystem). What is left is a process outside latch
 * writing to the raw device, which a second probe a few milliseconds before mkfs could not have excluded either.
 */
export async function ensureFilesystem(
  ctx: Context,
  doc: VolumeDoc,
  device: string,
  wanted: FsType | undefined,
  mayFormat: boolean,
): Promise<string> {
  // A device its backend proves blank needs no blkid (loop: a fresh image, with no block written).
  const blank = ctx.backend.isBlank ? await ctx.backend.isBlank(doc.name, device) : false;
  const found = blank ? undefined : await ctx.system.probeFsType(device);
  const plan = planFilesystem({ doc, found, wanted, mayFormat, node: ctx.config.nodeName });
  if ('format' in plan) await ctx.system.makeFs(device, plan.format);
  const fsType = 'format' in plan ? plan.format : plan.use;
  if (doc.status.filesystem !== fsType) await ctx.ledger.recordFilesystem(doc.name, fsType);
  return fsType;
}

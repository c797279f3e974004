// Which latch volume is at a path, for the calls that get nothing but a path (unmount, unmountdevice): from the
// kernel when something is mounted there, else from the directory's name, which kubelet makes the PV name.
import { basename } from 'node:path';
import type { Context } from '../context.js';
import type { MountInfo } from '../sys/mounts.js';
import { checkPvName, checkVolumeName } from '../names.js';

export type VolumeAtPath =
  /** A device of this volume is mounted there (the topmost mount). */
  | { kind: 'mounted'; volume: string; top: MountInfo }
  /** Something that is not a latch volume is mounted there: never touch it. */
  | { kind: 'foreign'; top: MountInfo }
  /** Nothing is mounted there; the path's name is a PV name, which stands for this volume. */
  | { kind: 'unmounted'; volume: string }
  /** Nothing is mounted, and the name is none latch could have used: nothing of ours is there. */
  | { kind: 'none' };

export async function volumeAtPath(ctx: Context, path: string): Promise<VolumeAtPath> {
  const top = (await ctx.system.mountsAt(path)).at(-1);
  if (top) {
    const volume = await ctx.backend.volumeOfDevice(top.source);
    return volume ? { kind: 'mounted', volume, top } : { kind: 'foreign', top };
  }
  let pvName: string;
  try {
    pvName = checkPvName(basename(path));
  } catch {
    return { kind: 'none' };
  }
  const volume = await ctx.ledger.volumeOfPv(pvName); // a store error fails the call: kubelet retries it
  try {
    return { kind: 'unmounted', volume: checkVolumeName(volume) };
  } catch {
    return { kind: 'none' }; // a PV name too long to be a volume's, with no alias: never one of ours
  }
}

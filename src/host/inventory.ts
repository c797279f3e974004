// What this node has of the pool, as the ledger and the kernel each see it: the loop devices set up over pool images,
// where they are mounted, and the volumes whose device the ledger says this node holds. Doctor compares the two
// views; uninstall refuses while either shows something held.
import { realpath } from 'node:fs/promises';
import { basename, dirname } from 'node:path';
import { volumeOfImageFile } from '../backend/loop.js';
import type { Config } from '../config.js';
import { LatchError, errorMessage } from '../errors.js';
import { nodeHoldsDevice } from '../ledger/arbitrate.js';
import type { DamagedVolume, Ledger } from '../ledger/ledger.js';
import type { VolumeDoc } from '../ledger/types.js';
import { listLoopDevices, type LoopDevice } from '../sys/loop.js';
import { readMountInfo, type MountInfo } from '../sys/mounts.js';

export interface PoolDevice extends LoopDevice {
  /** The volume its image is named after (the image's file name when it is not named `<volume>.img`). */
  volume: string;
  /** Where the kernel has the device mounted. */
  mountPoints: string[];
}

export interface Inventory {
  node: string;
  /** The pool's real path; undefined when it does not exist (then no device is the pool's). */
  pool: string | undefined;
  /** Every volume in the ledger whose document reads. */
  volumes: VolumeDoc[];
  /** The volumes whose documents cannot be read: whether this node holds them is unknown. */
  damaged: DamagedVolume[];
  /** The volumes whose device the ledger says this node holds. */
  holds: VolumeDoc[];
  /** Loop devices over files in the pool (over deleted images too), lowest number first. */
  devices: PoolDevice[];
}

/** The ledger could not be listed; the message is the store's. */
export class LedgerReadError extends LatchError {
  override name = 'LedgerReadError';
}

export async function inventory(ledger: Ledger, config: Pick<Config, 'nodeName' | 'poolDir'>): Promise<Inventory> {
  const node = config.nodeName;
  let volumes: VolumeDoc[];
  let damaged: DamagedVolume[];
  try {
    ({ docs: volumes, damaged } = await ledger.list());
  } catch (err) {
    throw new LedgerReadError(errorMessage(err), { cause: err });
  }
  let pool: string | undefined;
  try {
    pool = await realpath(config.poolDir);
  } catch {
    pool = undefined;
  }
  const loops = pool === undefined ? [] : (await listLoopDevices()).filter((d) => dirname(d.backingFile) === pool);
  let mounts: MountInfo[] = [];
  if (loops.length > 0) {
    try {
      mounts = await readMountInfo();
    } catch {
      mounts = [];
    }
  }
  return {
    node,
    pool,
    volumes,
    damaged,
    holds: volumes.filter((doc) => nodeHoldsDevice(doc, node)),
    devices: loops.map((d) => ({
      ...d,
      volume: volumeOfImageFile(d.backingFile) ?? basename(d.backingFile),
      mountPoints: mounts.filter((m) => m.source === d.device).map((m) => m.mountPoint),
    })),
  };
}

/** The device set up over the volume's current image (not a deleted one), if any. */
export function liveDevice(held: Inventory, volume: string): PoolDevice | undefined {
  return held.devices.find((d) => !d.deleted && d.volume === volume);
}

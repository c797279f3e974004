// A volume's block device on this node: set up after the ledger's grant, released once nothing mounts it, and each
// step recorded in the ledger. What is set up is always read back from the kernel (through the backend), never
// remembered, so both steps are safe to repeat after a crash.
import type { AttachAccess } from '../backend/types.js';
import type { Context } from '../context.js';
import { setTimeout as sleep } from 'node:timers/promises';
import { LatchError, errorMessage } from '../errors.js';
import { isInUse } from '../ledger/arbitrate.js';
import type { VolumeDoc } from '../ledger/types.js';
import { clearOwnFence } from './fence.js';
import { claimHome, refuseAwayFromHome } from './home.js';
import { clearHoldToCheck, markHoldToCheck, releaseIfProvenFree } from './self-release.js';

/**
 * Claims this node's grant (granted -> attaching) and sets up the volume's device: waitforattach's and mount's one
 * sequence, under the node's volume lock the caller holds. A marker on disk is written before the claim and removed
 * once the device is recorded (or there was no grant to claim): if the call dies in between, the next call on this
 * node checks the hold (self-release.ts). Undefined when the grant was withdrawn meanwhile.
 */
export async function claimAndSetUpDevice(ctx: Context, name: string): Promise<{ device: string; doc: VolumeDoc } | undefined> {
  const { config } = ctx;
  await markHoldToCheck(config, name);
  const claimed = await claimGrant(ctx, name);
  if (!claimed) {
    await clearHoldToCheck(config, name);
    return undefined;
  }
  const setUp = await setUpDevice(ctx, name, claimed);
  await clearHoldToCheck(config, name);
  return setUp;
}

/** Claims this node's grant (granted -> attaching); undefined when the grant was withdrawn meanwhile. */
export async function claimGrant(ctx: Context, name: string): Promise<VolumeDoc | undefined> {
  const node = ctx.config.nodeName;
  const claimed = await ctx.ledger.claimGrant(name, node);
  return claimed && isInUse(claimed.status.nodes[node]?.phase) ? claimed : undefined;
}

/**
 * After the grant, under the node's volume lock (so that no self-release runs meanwhile): makes sure the storage exists (created only for a volume that never held a filesystem, in its home node's pool), sets up
 * (or finds) its device and records it on the node's entry. If the grant was withdrawn meanwhile, undoes the device
 * unless something already mounted it, and fails. Logs the device as soon as it is known.
 */
export async function setUpDevice(ctx: Context, name: string, doc: VolumeDoc): Promise<{ device: string; doc: VolumeDoc }> {
  const { backend, ledger, config } = ctx;
  const node = config.nodeName;
  if (doc.spec.shared) {
    // Never an image under a shared volume's name: a job or a person's attach that needs a block device is refused.
    throw new LatchError(`volume ${name} is a shared (ReadWriteMany) CephFS volume: it has no block device to set up`);
  }
  let device: string;
  try {
    // A node-local image in another node's pool: this node must not make an empty one of its own (node/home.ts).
    refuseAwayFromHome(ctx, doc, node);
    if ((await backend.size(name)) === undefined) {
      if (doc.status.filesystem) {
        throw new LatchError(
          `the image of volume ${name} is missing from ${backend.storage} although it held a ` +
            `${doc.status.filesystem} filesystem; refusing to create an empty one in its place`,
        );
      }
      // The home is recorded before the image is made: a node racing to make one in its own pool is refused.
      await claimHome(ctx, doc);
      await backend.create(name, doc.spec.sizeBytes);
    } else {
      await claimHome(ctx, doc);
    }
    device = await backend.attach(name, attachAccess(doc, node));
  } catch (err) {
    // Setting up failed: if this node's kernel proves it has no device (nor a leftover mapping) of the volume, the
    // claim goes back now. Kept, it would become a fence nothing lifts: kubelet sends no unmountdevice for a device it
    // never mounted. The caller holds the node's volume lock (self-release.ts).
    await releaseIfProvenFree(ctx, name).catch((undoErr: unknown) => {
      ctx.log.undoError = errorMessage(undoErr);
    });
    throw err;
  }
  ctx.log.device = device;

  // The storage client behind the device, where the backend names one: a fence needs it once the node is unreachable.
  const client = backend.clientOf ? await backend.clientOf(name).catch(() => undefined) : undefined;
  const after = await ledger.recordDevice(name, node, device, client);
  if (after?.status.nodes[node]?.phase !== 'attached') {
    // The controller detached it while we were setting up: undo, unless something already mounted the device.
    if (!(await ctx.system.isDeviceMounted(device))) {
      await backend.release(name);
      await ledger.confirmRelease(name, node);
    }
    throw new LatchError(`volume ${name} was detached from node ${node} while its device was being set up`);
  }
  return { device, doc: after };
}

/**
 * What the ledger granted `node`, for a backend on shared storage to hold the storage against: read-only or not, and
 * the clients that may show on the volume without another writer being there (this node's own recorded one, from
 * before a crash; those the storage refuses, fenced).
 */
function attachAccess(doc: VolumeDoc, node: string): AttachAccess {
  const entry = doc.status.nodes[node];
  const fenced = Object.values(doc.status.fences ?? {}).flatMap((f) => (f.state === 'fenced' ? f.clients : []));
  return { readOnly: entry?.readOnly ?? false, knownClients: [...(entry?.client !== undefined ? [entry.client] : []), ...fenced] };
}

/**
 * Releases the volume's device on this node and confirms the release in the ledger, unless the device is still
 * mounted somewhere (then nothing changes and the device is returned: the node keeps its hold).
 */
export async function releaseDevice(ctx: Context, name: string): Promise<string | undefined> {
  const device = await ctx.backend.findDevice(name);
  if (device && (await ctx.system.isDeviceMounted(device))) return device;
  await ctx.backend.release(name);
  const doc = await ctx.ledger.confirmRelease(name, ctx.config.nodeName);
  // Released after a fence: the node says its old mapping is gone, so that it may have the volume again.
  await clearOwnFence(ctx, name, doc);
  return undefined;
}

/**
 * Unmounts the topmost mount at `path`; false when nothing was mounted there. Where that is its device's last mount on
 * this host and the backend's devices go with their last unmount (plain loop devices: Backend.freedByUnmount), the
 * same umount frees the device: one child where releaseDevice would run a second (it then finds the device gone). A
 * device mounted elsewhere too (a pod's bind mount kubelet has not removed) stays, and keeps the node's hold. For a
 * path where only the volume is mounted: unmountdevice's, once it found the volume there, or latch's own staging path.
 */
export async function unmountTop(ctx: Context, path: string): Promise<boolean> {
  const table = await ctx.system.readMountInfo();
  const top = (await ctx.system.mountsAt(path, table)).at(-1);
  if (!top) return false;
  const lastMount = ctx.backend.freedByUnmount === true && table.filter((m) => m.source === top.source).length === 1;
  return ctx.system.umount(path, { freeLoopDevice: lastMount });
}

/** How long an unmount right after a cut-off waits for the processes it unblocked to let go (unmountTopOnceFree). */
const CUT_OFF_SETTLE_MS = 10_000;

/**
 * unmountTop right after this node's fenced mapping was cut off (cutOffIfFenced): the processes that were waiting on
 * the storage (a pod's writer, in D state) get their errors now, and let go of their files a moment later. Until
 * they do the kernel refuses the unmount as busy, so it is tried again for up to CUT_OFF_SETTLE_MS.
 */
export async function unmountTopOnceFree(ctx: Context, path: string): Promise<boolean> {
  const until = Date.now() + CUT_OFF_SETTLE_MS;
  for (;;) {
    try {
      return await unmountTop(ctx, path);
    } catch (err) {
      if (!errorMessage(err).includes('target is busy') || Date.now() >= until) throw err;
      await sleep(250);
    }
  }
}

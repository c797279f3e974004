// A node's side of shared (ReadWriteMany) volumes: the ops call these in place of the block-device path when the
// volume's document says `shared` (docs/protocol.md, "Shared volumes"). The data plane is backend/cephfs.ts, loaded
// only here and only for a shared volume.
//
// Non-attach mode: mount grants the pod's ticket, mounts the subvolume once per node at the node's staging path
// (ceph-fuse as the node's identity) and bind-mounts it into the pod dir; unmount takes the bind down, and the node's
// mount with its last ticket. Attach mode: waitforattach records the grant with the volume's identifier
// (`/latch/shared/<volume>`, no device exists), mountdevice mounts the subvolume at kubelet's global path, and
// unmountdevice unmounts it and confirms the release.
//
// Each step reads the kernel (mountinfo, /proc) rather than remembering, so a call repeated after a SIGKILL finds what
// its predecessor left and finishes. A hung ceph-fuse never holds a call past its deadline: every child that touches
// its mount runs under guardFuse, which aborts the FUSE connection in time.
import { rmdir } from 'node:fs/promises';
import { dirname } from 'node:path';
import type { SharedVolumes } from '../backend/cephfs.js';
import type { VolumeOptions } from '../contract/options.js';
import { failure, success, type Reply } from '../contract/reply.js';
import type { Context } from '../context.js';
import { LatchError, errorMessage } from '../errors.js';
import { FS_TYPES, type FsType } from '../filesystems.js';
import { formatSize } from '../size.js';
import { isFencedOff, isInUse, ticketsOfNode } from '../ledger/arbitrate.js';
import type { VolumeDoc } from '../ledger/types.js';
import { guardFuse } from '../sys/fuse.js';
import { run } from '../sys/run.js';
import { withVolumeLock } from './lock.js';
import { clearHoldToCheck, markHoldToCheck } from './self-release.js';
import { ensureDirectory } from './mount.js';
import { stagingPath } from './staging.js';
import type { WorkloadRequest } from './tickets.js';

/** The configured shared volumes; a LatchError where the configuration has none. */
export async function sharedVolumesOf(ctx: Context): Promise<SharedVolumes> {
  const { sharedVolumesFor } = await import('../backend/cephfs.js');
  const shared = sharedVolumesFor(ctx.config);
  if (!shared) {
    throw new LatchError(
      'shared (ReadWriteMany) volumes need the rbd backend with backend.cephfs configured (docs/operations.md, "Shared volumes")',
    );
  }
  return shared;
}

/** What waitforattach replies for a shared volume and mountdevice accepts (backend/cephfs.ts sharedDeviceId). */
export function sharedDeviceId(volume: string): string {
  return `/latch/shared/${volume}`;
}

/**
 * Refuses a request that needs a block device of a shared volume (an fsType of latch's, which only a block volume
 * has), and a ReadWriteMany request for a block volume, with a message that says which is which.
 */
export function refuseKindMismatch(doc: VolumeDoc | undefined, options: Pick<VolumeOptions, 'fsType' | 'shared'>): string | undefined {
  if (!doc) return undefined;
  if (doc.spec.shared && options.fsType !== undefined && (FS_TYPES as readonly string[]).includes(options.fsType)) {
    return (
      `volume ${doc.name} is a shared (ReadWriteMany) CephFS volume: it has no block device and no ${options.fsType} ` +
      'filesystem; leave fsType empty in its PV'
    );
  }
  if (!doc.spec.shared && options.shared === true) {
    return `volume ${doc.name} is a block (ReadWriteOnce) volume; it cannot be used ReadWriteMany`;
  }
  return undefined;
}

// ---- non-attach mode -----------------------------------------------------------------------------------------------

/** mount in non-attach mode for a shared volume: the pod's ticket, the node's mount at staging, the pod's bind. */
export async function mountSharedForPod(ctx: Context, request: WorkloadRequest, podDir: string, options: VolumeOptions): Promise<Reply> {
  const { config, ledger } = ctx;
  const node = config.nodeName;
  const { name, ticket, create, caller } = request;
  const refused = refuseKindMismatch(request.existing, options);
  if (refused) return failure(refused);
  const shared = await sharedVolumesOf(ctx);
  const staging = stagingPath(config, name);

  return withVolumeLock(config, name, async () => {
    await ensureDirectory(podDir);
    const atPod = await shared.volumeAt(podDir);
    if (atPod) {
      if (atPod.volume !== name) return failure(`${podDir} already has another shared volume mounted; not mounting volume ${name} over it`);
      const repeat = await ledger.addTicketIfGranted(name, ticket, undefined, caller);
      if (repeat.refused === undefined) return success();
      return failure(`${podDir} shows volume ${name}, but its ticket on node ${node} is not granted: ${repeat.refused}`);
    }
    if ((await ctx.system.mountsAt(podDir)).length > 0)
      return failure(`${podDir} already has something mounted; not mounting volume ${name} over it`);

    let granted = await ledger.addTicketIfGranted(name, ticket, create, caller);
    if (granted.refused !== undefined && granted.doc && isFencedOff(granted.doc, node)) {
      await clearSharedFence(ctx, shared, name, granted.doc);
      granted = await ledger.addTicketIfGranted(name, ticket, create, caller);
    }
    if (granted.refused !== undefined || !granted.doc) {
      return failure(`volume ${name} cannot be mounted on node ${node}: ${granted.refused ?? 'not granted'}`);
    }
    try {
      const doc = await setUpShared(ctx, shared, name, staging);
      const readOnly = options.readOnly || (doc.status.nodes[node]?.readOnly ?? true);
      await bindShared(staging, podDir, readOnly, config.commandTimeout * 1000);
      return success();
    } catch (err) {
      // Nothing left behind for a pod that did not get its mount: kubelet sends no unmount for it.
      try {
        const after = await ledger.removeTicket(name, ticket.id);
        if (!after || ticketsOfNode(after, node).length === 0) await leaveShared(ctx, shared, name, staging);
      } catch (undoErr) {
        ctx.log.undoError = errorMessage(undoErr);
      }
      throw err;
    }
  });
}

/**
 * unmount in non-attach mode, when `podDir` shows a shared volume or names one: the pod's bind goes, its ticket
 * goes, and with the node's last ticket the node's own mount. undefined: not a shared volume (the block path goes on).
 */
export async function unmountSharedForPod(
  ctx: Context,
  podDir: string,
  podTicket: (doc: VolumeDoc) => string | undefined,
): Promise<Reply | undefined> {
  const name = await sharedVolumeAtPath(ctx, podDir);
  if (name === undefined) return undefined;
  const { config, ledger } = ctx;
  const node = config.nodeName;
  ctx.log.volume = name;
  const shared = await sharedVolumesOf(ctx);
  return withVolumeLock(config, name, async () => {
    await shared.unmountBind(podDir);
    const doc = await ledger.removeTicket(name, podTicket);
    if (doc && ticketsOfNode(doc, node).length > 0) return success();
    await leaveShared(ctx, shared, name, stagingPath(config, name));
    return success();
  });
}

/**
 * The shared volume at `path`: from the kernel when a CephFS mount is there (its client's command line names the
 * subvolume), else from the path's name when the ledger knows it as a shared volume. undefined otherwise.
 */
async function sharedVolumeAtPath(ctx: Context, path: string): Promise<string | undefined> {
  const top = (await ctx.system.mountsAt(path)).at(-1);
  if (top && top.fsType !== 'fuse.ceph-fuse' && top.fsType !== 'ceph') return undefined;
  if (top && ctx.config.backend.type === 'rbd' && ctx.config.backend.cephfs) {
    const found = await (await sharedVolumesOf(ctx)).volumeAt(path);
    if (found?.volume !== undefined) return found.volume;
  }
  const { volumeAtPath } = await import('./volume-at-path.js');
  if (top) {
    // A CephFS mount whose client is gone: the path's name says which volume it was.
    const name = await ctx.ledger.volumeOfPv(path.slice(path.lastIndexOf('/') + 1)).catch(() => undefined);
    return name !== undefined && (await ctx.ledger.get(name))?.spec.shared ? name : undefined;
  }
  const found = await volumeAtPath(ctx, path);
  if (found.kind !== 'unmounted') return undefined;
  return (await ctx.ledger.get(found.volume))?.spec.shared ? found.volume : undefined;
}

// ---- attach mode ---------------------------------------------------------------------------------------------------

/**
 * waitforattach's set-up for a shared volume, after the claim: the subvolume made if it is not there yet, and the
 * grant recorded with the volume's identifier. Nothing is mounted yet: mountdevice does that.
 */
export async function attachShared(ctx: Context, name: string, claimed: VolumeDoc): Promise<Reply> {
  const shared = await sharedVolumesOf(ctx);
  await shared.create(name, claimed.spec.sizeBytes);
  const device = sharedDeviceId(name);
  const after = await ctx.ledger.recordDevice(name, ctx.config.nodeName, device, await shared.clientOf(name));
  if (after?.status.nodes[ctx.config.nodeName]?.phase !== 'attached') {
    throw new LatchError(`volume ${name} was detached from node ${ctx.config.nodeName} while it was being set up`);
  }
  return success({ device });
}

/**
 * mountdevice for a shared volume. kubelet passes waitforattach's reply as devicePath; it checks nothing about it
 * itself for a Filesystem volume (it is never stat-ed as a device), and latch accepts exactly `/latch/shared/<volume>`.
 */
export async function mountSharedDevice(
  ctx: Context,
  doc: VolumeDoc,
  deviceMountPath: string,
  devicePath: string,
  options: VolumeOptions,
): Promise<Reply> {
  const name = doc.name;
  const refused = refuseKindMismatch(doc, options);
  if (refused) return failure(refused);
  if (devicePath !== sharedDeviceId(name)) {
    return failure(`device ${devicePath} is not shared volume ${name} (waitforattach replies ${sharedDeviceId(name)} for it)`);
  }
  const shared = await sharedVolumesOf(ctx);
  return withVolumeLock(ctx.config, name, async () => {
    await setUpShared(ctx, shared, name, deviceMountPath, options.readOnly);
    return success();
  });
}

/** unmountdevice for a shared volume at `deviceMountPath`; undefined when it is not one (the block path goes on). */
export async function unmountSharedDevice(ctx: Context, deviceMountPath: string): Promise<Reply | undefined> {
  const name = await sharedVolumeAtPath(ctx, deviceMountPath);
  if (name === undefined) return undefined;
  ctx.log.volume = name;
  const shared = await sharedVolumesOf(ctx);
  return withVolumeLock(ctx.config, name, async () => {
    await leaveShared(ctx, shared, name, deviceMountPath);
    return success();
  });
}

// ---- admin commands ------------------------------------------------------------------------------------------------

/** `latch volume create --shared`: the ledger's document first, then its subvolume with the size as quota. */
export async function createSharedVolume(
  ctx: Context,
  name: string,
  sizeBytes: number,
  fsType: FsType,
): Promise<{ doc: VolumeDoc; existed: boolean; storage: string }> {
  const shared = await sharedVolumesOf(ctx);
  const { doc, existed } = await ctx.ledger.createVolume(name, { sizeBytes, fsType, shared: true });
  await shared.create(name, sizeBytes);
  return { doc, existed, storage: shared.storage };
}

/**
 * The snapshots of a shared volume (`latch snapshot list|delete`, and the snapshot job's CephFS subvolume snapshots);
 * undefined for a block volume.
 */
export async function sharedSnapshotsOf(ctx: Context, volume: string): Promise<SharedVolumes | undefined> {
  return (await ctx.ledger.get(volume))?.spec.shared ? sharedVolumesOf(ctx) : undefined;
}

// ---- the node agent's jobs -----------------------------------------------------------------------------------------

/**
 * The job runner's set-up for a job ticket on a shared volume, in place of a block device's (jobs/runner.ts): the
 * node claims its grant and records it with the volume's identifier, and nothing is mounted. A snapshot or a clone is
 * the manager's work (no node client is needed); a job that reads or writes files mounts what it needs itself and
 * unmounts it before it ends. The subvolume is not made here: a clone or a restore makes its own target.
 */
export async function setUpSharedForJob(ctx: Context, name: string): Promise<{ device: string; doc: VolumeDoc }> {
  const node = ctx.config.nodeName;
  const claimed = await ctx.ledger.claimGrant(name, node);
  if (!claimed || !isInUse(claimed.status.nodes[node]?.phase)) {
    throw new LatchError(`volume ${name} was withdrawn from node ${node} before its job started`);
  }
  const device = sharedDeviceId(name);
  // The node's entity, so that a fence of another node spares the sessions of a job's own mount (a backup's).
  const client = await (await sharedVolumesOf(ctx)).clientOf(name);
  const after = await ctx.ledger.recordDevice(name, node, device, client);
  if (after?.status.nodes[node]?.phase !== 'attached') {
    await releaseSharedForJob(ctx, name);
    throw new LatchError(`volume ${name} was detached from node ${node} while its job was being set up`);
  }
  return { device, doc: after };
}

/**
 * The job runner's release of a shared volume after a job: the node's hold goes unless it still has the volume
 * mounted (a pod's mount, the other mode's); returns the mount point that keeps it then, as releaseDevice does.
 */
export async function releaseSharedForJob(ctx: Context, name: string): Promise<string | undefined> {
  const shared = await sharedVolumesOf(ctx);
  const kept = (await shared.ownMounts()).find((m) => m.volume === name);
  if (kept) return kept.target;
  const after = await ctx.ledger.confirmRelease(name, ctx.config.nodeName);
  await clearSharedFence(ctx, shared, name, after);
  return undefined;
}

/** `latch volume delete` of a shared volume (the caller checked that nobody holds it): its subvolume goes. */
export async function deleteSharedVolume(ctx: Context, name: string): Promise<string> {
  const shared = await sharedVolumesOf(ctx);
  await shared.delete(name);
  return shared.storage;
}

/** `latch volume expand` (and expandvolume) of a shared volume: the quota grows, every node's mount sees it at once. */
export async function expandShared(ctx: Context, doc: VolumeDoc, newBytes: number): Promise<string> {
  if (newBytes < doc.spec.sizeBytes) {
    throw new LatchError(`volume ${doc.name} is ${formatSize(doc.spec.sizeBytes)}; latch never shrinks a volume`);
  }
  const shared = await sharedVolumesOf(ctx);
  if ((await shared.size(doc.name)) === undefined) await shared.create(doc.name, newBytes);
  else await shared.grow(doc.name, newBytes);
  await ctx.ledger.recordSize(doc.name, newBytes);
  return `shared volume ${doc.name}: quota raised to ${formatSize(newBytes)}; every node's mount sees it at once`;
}

// ---- both modes ----------------------------------------------------------------------------------------------------

/**
 * Claims the grant, makes the subvolume if needed, mounts it at `target` (or finds it mounted) and records the mount
 * with its client instance. Returns the document after the record.
 */
async function setUpShared(ctx: Context, shared: SharedVolumes, name: string, target: string, readOnlyAsked = false): Promise<VolumeDoc> {
  const { ledger, config } = ctx;
  const node = config.nodeName;
  // A call that dies between its claim and the mount's record leaves the marker: the next call here, or the agent,
  // releases the hold once no mount of the volume is left on this node (self-release.ts).
  await markHoldToCheck(config, name);
  // Claimed with the node's entity, so that a fence of another node in the meantime spares the session this mount opens.
  const claimed = await ledger.claimGrant(name, node, shared.entityRecord());
  const entry = claimed?.status.nodes[node];
  if (!claimed || !entry || !isInUse(entry.phase)) {
    await clearHoldToCheck(config, name);
    throw new LatchError(`volume ${name} was withdrawn from node ${node} while it was being mounted; try again`);
  }
  await shared.create(name, claimed.spec.sizeBytes);
  const client = await shared.mountAt(name, target, { readOnly: readOnlyAsked || entry.readOnly });
  ctx.log.client = client;
  const after = await ledger.recordDevice(name, node, sharedDeviceId(name), client);
  if (after?.status.nodes[node]?.phase !== 'attached') {
    await shared.unmountAt(name, target);
    await ledger.confirmRelease(name, node);
    await clearHoldToCheck(config, name);
    throw new LatchError(`volume ${name} was detached from node ${node} while it was being mounted`);
  }
  await clearHoldToCheck(config, name);
  return after;
}

/** The node lets go: its mount at `target` goes (a fenced or hung one aborted first), then the ledger hears of it. */
async function leaveShared(ctx: Context, shared: SharedVolumes, name: string, target: string): Promise<void> {
  const node = ctx.config.nodeName;
  const doc = await ctx.ledger.get(name);
  const fence = doc?.status.fences?.[node];
  if (fence?.state === 'fenced' && fence.clearedAt === undefined) await shared.cutOff(target);
  await shared.unmountAt(name, target);
  await rmdir(target).catch(() => undefined);
  if (target === stagingPath(ctx.config, name)) await rmdir(dirname(target)).catch(() => undefined);
  if (await shared.mountedHere(name)) return; // another of the node's mounts of it (attach and non-attach at once)
  const after = await ctx.ledger.confirmRelease(name, node);
  await clearSharedFence(ctx, shared, name, after);
}

/** This node was fenced off the volume: once none of its mounts of it is left, it says so in the ledger. */
async function clearSharedFence(ctx: Context, shared: SharedVolumes, name: string, doc: VolumeDoc | undefined): Promise<void> {
  const node = ctx.config.nodeName;
  if (!doc || !isFencedOff(doc, node) || doc.status.fences?.[node]?.state !== 'fenced' || doc.status.nodes[node]) return;
  if (await shared.mountedHere(name)) {
    throw new LatchError(`volume ${name}: node ${node} was fenced off it and still has it mounted; its unmount clears that`);
  }
  ctx.log.fenceCleared = true;
  await ctx.ledger.clearFence(name, node);
}

/** Bind-mounts the node's mount into the pod dir under guardFuse (a hung client must not hang the call). */
async function bindShared(source: string, target: string, readOnly: boolean, timeoutMs: number): Promise<void> {
  await guardFuse(source, timeoutMs, (childTimeoutMs) => run('mount', ['--bind', source, target], { timeoutMs: childTimeoutMs }));
  if (!readOnly) return;
  try {
    await guardFuse(source, timeoutMs, (childTimeoutMs) => run('mount', ['-o', 'remount,bind,ro', target], { timeoutMs: childTimeoutMs }));
  } catch (err) {
    await run('umount', ['--lazy', target], { timeoutMs: 10_000 }).catch(() => undefined);
    throw err;
  }
}

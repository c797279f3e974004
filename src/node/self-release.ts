// A node releases, by itself, a hold on a volume that its own kernel proves it no longer has (docs/operations.md,
// "Automatic recovery"). The ledger can say a node is `attaching` or `detaching` long after the node lost (or never
// got) the device: a waitforattach that failed or was killed after the grant, a reboot. kubelet sends no
// unmountdevice for a device it never mounted, so without this only an admin could lift the hold.
//
// The proof, all on this node and under its volume lock (so no call here is setting the device up meanwhile):
// the backend finds no device of the volume, no mount on this host is of a device of the volume, the backend's
// release of whatever is left (an rbd-fuse mapping, a loop device over a deleted image) succeeds, and the backend
// still finds no device afterwards. Any error, or a busy lock, means no release.
//
// Where it runs: in the failing call itself (setUpDevice), in the next node call (a marker file per volume that a
// waitforattach or mount writes before it claims the grant and removes once the device is recorded: a call that dies
// in between leaves it behind), and in `latch agent` for every hold of this node.
//
// A shared volume (node/shared.ts) has no device: the proof is that no CephFS mount of the node (its identity's, a
// job's included) serves the volume. Its calls set the same marker around their claim and the mount's record.
import { closeSync, mkdirSync, openSync, readdirSync, unlinkSync } from 'node:fs';
import { join } from 'node:path';
import type { Config } from '../config.js';
import type { Context } from '../context.js';
import { errorMessage } from '../errors.js';
import type { AutomaticAction } from '../ledger/types.js';
import { checkVolumeName } from '../names.js';
import { withVolumeLock } from './lock.js';

export type SelfReleaseResult =
  { released: true; action: AutomaticAction } | { released: false; reason: 'no-hold' | 'device' | 'mounted' | 'busy'; detail: string };

/** Takes the node's volume lock without waiting (a busy lock means a call is working on it: no release) and proves. */
export async function releaseHoldWithoutDevice(ctx: Context, name: string): Promise<SelfReleaseResult> {
  let locked = false;
  try {
    return await withVolumeLock(
      ctx.config,
      name,
      () => {
        locked = true;
        return releaseIfProvenFree(ctx, name);
      },
      0,
    );
  } catch (err) {
    if (locked) throw err;
    return { released: false, reason: 'busy', detail: `another latch call is working on volume ${name} on this node` };
  }
}

/**
 * The proof and the release, for a caller that holds the node's volume lock. Throws (releasing nothing) when the
 * backend or the kernel cannot answer.
 */
export async function releaseIfProvenFree(ctx: Context, name: string): Promise<SelfReleaseResult> {
  const { backend, ledger, config } = ctx;
  const node = config.nodeName;
  const doc = await ledger.get(name);
  const phase = doc?.status.nodes[node]?.phase;
  if (phase !== 'attaching' && phase !== 'detaching') {
    return { released: false, reason: 'no-hold', detail: `node ${node} has no attaching or detaching hold on volume ${name}` };
  }
  if (doc?.spec.shared) {
    // A shared volume has no device: its proof is that none of this node's CephFS mounts serves it (a job's included).
    if ((await (await import('../backend/cephfs.js')).sharedVolumesFor(ctx.config)?.mountedHere(name)) !== false) {
      return { released: false, reason: 'mounted', detail: `shared volume ${name} is still mounted on ${node}` };
    }
    return releaseNow(ctx, name);
  }
  const device = await backend.findDevice(name);
  if (device !== undefined) return { released: false, reason: 'device', detail: `${device} of volume ${name} is set up on ${node}` };
  const mounted = await mountsOfVolume(ctx, name);
  if (mounted.length > 0) {
    return { released: false, reason: 'mounted', detail: `a device of volume ${name} is still mounted at ${mounted.join(', ')}` };
  }
  // Whatever the backend may still have (rbd: the image's mapping; loop: devices over a deleted image) goes first;
  // it refuses (throws) while anything of it is in use.
  await backend.release(name);
  const after = await backend.findDevice(name);
  if (after !== undefined) return { released: false, reason: 'device', detail: `${after} of volume ${name} appeared on ${node}` };
  return releaseNow(ctx, name);
}

/** The proof is made: the ledger releases the hold if it is still attaching or detaching. */
async function releaseNow(ctx: Context, name: string): Promise<SelfReleaseResult> {
  const node = ctx.config.nodeName;
  const action = await ctx.ledger.releaseHoldWithoutDevice(name, node);
  if (!action) return { released: false, reason: 'no-hold', detail: `node ${node} no longer holds volume ${name}` };
  return { released: true, action };
}

/** The mount points on this host whose source is a device of the volume (also one over a deleted image). */
async function mountsOfVolume(ctx: Context, name: string): Promise<string[]> {
  const mounts = await ctx.system.readMountInfo();
  const owners = new Map<string, string | undefined>();
  const found: string[] = [];
  for (const m of mounts) {
    if (!m.source.startsWith('/dev/')) continue;
    if (!owners.has(m.source)) owners.set(m.source, await ctx.backend.volumeOfDevice(m.source));
    if (owners.get(m.source) === name) found.push(m.mountPoint);
  }
  return found;
}

// ---- the markers: volumes whose hold the next call on this node checks ------------------------------------------

/** `<stateDir>/holds-to-check/<node>/`: node-private, like the staging mounts (simulated nodes may share a stateDir). */
function markerDir(config: Pick<Config, 'stateDir' | 'nodeName'>): string {
  return join(config.stateDir, 'holds-to-check', config.nodeName);
}

/** Before claiming a grant: if this call dies before the device is recorded, the next call here checks the hold. */
export async function markHoldToCheck(config: Pick<Config, 'stateDir' | 'nodeName'>, name: string): Promise<void> {
  const dir = markerDir(config);
  const file = join(dir, checkVolumeName(name));
  // Inline, as the file store writes the ledger in the same state directory: the call's first asynchronous file call
  // (loading fs/promises, starting the thread pool) comes later or not at all. The directory is made on its first
  // use only.
  let fd: number;
  try {
    fd = openSync(file, 'w', 0o600);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    fd = openSync(file, 'w', 0o600);
  }
  closeSync(fd);
}

/** The hold is settled (the device is recorded, or the hold is gone): nothing for the next call to check. */
export async function clearHoldToCheck(config: Pick<Config, 'stateDir' | 'nodeName'>, name: string): Promise<void> {
  const file = join(markerDir(config), checkVolumeName(name));
  try {
    unlinkSync(file);
  } catch {
    // Already gone.
  }
}

/**
 * At the start of a node call: checks each marked volume (usually none: one failed readdir) and releases the holds
 * proven free. Never throws and never fails the call; what it did goes into the call's log line.
 */
export async function releaseMarkedHolds(ctx: Context): Promise<void> {
  let names: string[];
  try {
    // Inline, as the file store reads: a small local directory, read by every node call, mostly to find it missing.
    names = readdirSync(markerDir(ctx.config));
  } catch {
    return;
  }
  for (const name of names) {
    try {
      checkVolumeName(name);
      const result = await releaseHoldWithoutDevice(ctx, name);
      // A busy lock: the call working on it settles it (or leaves the marker for the next one).
      if (result.released || result.reason !== 'busy') await clearHoldToCheck(ctx.config, name);
    } catch (err) {
      // The backend or the ledger could not answer: nothing released, the marker stays for the next call.
      ctx.log.selfReleaseError = `${name}: ${errorMessage(err)}`;
    }
  }
}

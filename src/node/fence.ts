// Fences (docs/ledger.md, "Fences"): before a volume moves away from a node that has not confirmed its release, the
// storage is made to refuse that node's clients; the node's hold goes only once it does. The node, when it is back,
// clears its old mapping from its own kernel state, and only then may the fence be lifted.
import type { Fencer } from '../backend/types.js';
import type { Context } from '../context.js';
import { LatchError } from '../errors.js';
import { isFencedOff } from '../ledger/arbitrate.js';
import type { NodePhase, VolumeDoc } from '../ledger/types.js';

// Clients that open the image while the fence is being put in place are fenced in further rounds, up to this many.
const MAX_FENCE_ROUNDS = 3;

export interface FenceOutcome {
  doc: VolumeDoc | undefined;
  /** Every client instance the storage now refuses for this node and volume. */
  clients: string[];
  /** What refuses them (the fencer's kind: a shared volume's is not the one the caller passed). */
  by: string;
}

export interface FenceOptions {
  /**
   * The admin's word that the node is powered off (not merely cut off): where the storage finds no client of it to
   * refuse, its hold goes all the same. Without it such a fence is refused and the ledger left as it was.
   */
  poweredOff?: boolean;
}

/** The phases in which a node may have a client that writes to the volume. */
const MAY_WRITE: ReadonlySet<NodePhase> = new Set(['attaching', 'attached', 'detaching']);

/**
 * Fences `node` off volume `name`: records the intent (the node is never granted the volume again from then on, and
 * cannot claim a grant it had), makes the storage refuse its clients, and only then releases its hold and tickets.
 * Safe to repeat: a repeat after a crash at any step finishes the job.
 *
 * Fails closed: when the node may have a client (attaching, attached, detaching) and the storage finds none (none
 * recorded, none watching or locking: a partitioned client's watch expires, and an image without the exclusive-lock
 * feature has no lock holder), nothing in the ledger changes and a LatchError says what the admin can do, unless the
 * admin said the node is powered off.
 */
export async function fenceNodeOffVolume(
  ctx: Context,
  givenFencer: Fencer,
  name: string,
  node: string,
  reason: string,
  options: FenceOptions = {},
): Promise<FenceOutcome> {
  const { ledger } = ctx;
  let fencer = givenFencer;
  const start = await ledger.get(name);
  if (!start) throw new LatchError(`volume ${name} does not exist`);
  // A shared volume is fenced on CephFS: its node's client blocklisted and its MDS session evicted, both confirmed.
  if (start.spec.shared) fencer = await sharedFencer(ctx);
  const recorded = (doc: VolumeDoc) => [doc.status.nodes[node]?.client, ...(doc.status.fences?.[node]?.clients ?? [])];
  // The recorded clients of the volume's other holders (read-only-many) are spared; every other client is the node's.
  const spare = (doc: VolumeDoc) => defined(Object.entries(doc.status.nodes).flatMap(([n, e]) => (n === node ? [] : [e.client])));
  // What the storage would refuse, looked at before anything is recorded; the intent records it, so a client found
  // here is fenced even if it goes meanwhile.
  const found = await fencer.find(name, defined(recorded(start)), spare(start));
  const phase = start.status.nodes[node]?.phase;
  if (found.length === 0 && phase !== undefined && MAY_WRITE.has(phase) && !options.poweredOff) {
    const none = start.spec.shared
      ? 'no client instance of it is recorded in the ledger, and no MDS lists a session of it on the volume (a client cut off ' +
        'from the cluster may still have the volume mounted). '
      : 'no client of it is recorded in the ledger, and none has the image open or locked (a client cut off from the ' +
        'cluster loses its watch, yet writes again once it is back). ';
    throw new LatchError(
      `volume ${name}: node ${node} holds it (${phase}), but ${fencer.kind} has nothing of it to refuse: ${none}Its hold stays. ` +
        'Either let the node come back and release the volume itself ' +
        `(or fence it then, when its client shows), or make sure the node is powered off and repeat with ` +
        `latch volume release ${name} --node ${node} --node-is-down --powered-off`,
    );
  }
  let doc = await ledger.beginFence(name, node, reason, found);
  let clients: string[] = [];
  for (let round = 1; doc; round++) {
    const fenced = await fencer.fence(name, defined(recorded(doc)), spare(doc));
    const added = fenced.filter((c) => !clients.includes(c));
    clients = [...new Set([...clients, ...fenced])].sort();
    if (added.length === 0 || round >= MAX_FENCE_ROUNDS) break;
    doc = await ledger.beginFence(name, node, reason, clients);
  }
  doc = await ledger.completeFence(name, node, clients);
  return { doc, clients, by: fencer.kind };
}

/**
 * This node was fenced off the volume: once nothing of its old mapping is left (a hung or dead client included, which
 * the backend's release clears), it says so in the ledger and may be granted the volume again. A device that is still
 * mounted stays (kubelet's unmount and unmountdevice release it, and clear the fence then). Nothing happens while the
 * fence is not yet in place: the fencer has still to cut off the clients it found.
 */
export async function clearOwnFence(ctx: Context, name: string, doc: VolumeDoc | undefined): Promise<VolumeDoc | undefined> {
  const node = ctx.config.nodeName;
  if (!doc || !isFencedOff(doc, node) || doc.status.fences?.[node]?.state !== 'fenced' || doc.status.nodes[node]) return doc;
  const device = await ctx.backend.findDevice(name);
  if (device && (await ctx.system.isDeviceMounted(device))) return doc;
  await ctx.backend.release(name);
  if (await ctx.backend.hasMapping(name)) {
    throw new LatchError(`volume ${name}: the mapping of node ${node}, which was fenced off it, is still there after its release`);
  }
  ctx.log.fenceCleared = true;
  return ctx.ledger.clearFence(name, node);
}

/**
 * Before this node unmounts a volume it was fenced off: the storage refuses its client, so a filesystem flush would
 * wait on it for ever (in D state, beyond any signal); the backend makes such waits fail at once instead. Nothing is
 * lost: nothing this node writes can land any more. Reads the ledger only where the backend can cut a client off.
 * Returns whether it cut the mapping off (then unmount with unmountTopOnceFree).
 */
export async function cutOffIfFenced(ctx: Context, name: string): Promise<boolean> {
  if (!ctx.backend.cutOff) return false;
  const node = ctx.config.nodeName;
  const doc = await ctx.ledger.get(name);
  const fence = doc?.status.fences?.[node];
  if (!doc || fence?.state !== 'fenced' || fence.clearedAt !== undefined || doc.status.nodes[node]) return false;
  ctx.log.cutOff = true;
  await ctx.backend.cutOff(name);
  return true;
}

/**
 * Lifts the fences of `node` on volume `name` that the node has cleared: the storage serves its old clients again
 * (they are gone) and the record goes. Returns what was lifted and what is still waiting for the node.
 */
export async function liftClearedFence(
  ctx: Context,
  fencer: Fencer,
  name: string,
  node: string,
): Promise<{ lifted: string[] } | { waiting: string } | undefined> {
  const doc = await ctx.ledger.get(name);
  const fence = doc?.status.fences?.[node];
  if (!fence) return undefined;
  if (fence.clearedAt === undefined) {
    return { waiting: `node ${node} has not cleared its old mapping of volume ${name} yet (fenced since ${fence.since})` };
  }
  await fencer.lift(fence.clients);
  await ctx.ledger.removeFence(name, node);
  return { lifted: fence.clients };
}

function defined(values: (string | undefined)[]): string[] {
  return [...new Set(values.filter((v): v is string => v !== undefined))].sort();
}

/** The fencer of shared volumes (backend/cephfs-fencer.ts); a LatchError where the configuration has none. */
async function sharedFencer(ctx: Context): Promise<Fencer> {
  const fencer = (await import('../backend/cephfs-fencer.js')).cephFsFencerFor(ctx.config);
  if (!fencer) throw new LatchError('fencing a shared volume needs backend.cephfs and backend.fencer in this configuration');
  return fencer;
}

// latch node fence | unfence | clear-fences: the storage's side of taking volumes away from a node that has not
// released them (docs/ledger.md, "Fences"; docs/operations.md, "Fencing").
//  - fence N (where the fencer identity is): for every volume N holds or has tickets for, the storage refuses N's
//    clients first, then N's hold and tickets go, so the volume may attach elsewhere at once.
//  - clear-fences (on the fenced node itself): its old mappings go, from its kernel state, and it says so.
//  - unfence N (where the fencer identity is): the storage serves N's old clients again where N has cleared.
import type { Fencer } from '../../backend/types.js';
import { configuredFencer } from '../../backend/index.js';
import type { Config } from '../../config.js';
import type { Context } from '../../context.js';
import { LatchError, errorMessage } from '../../errors.js';
import type { DamagedVolume } from '../../ledger/ledger.js';
import type { VolumeDoc } from '../../ledger/types.js';
import { clearOwnFence, fenceNodeOffVolume, liftClearedFence, type FenceOptions } from '../../node/fence.js';
import { checkNodeName, checkVolumeName } from '../../names.js';
import { configOf, type CommandIO } from '../io.js';
import { concernsNode } from '../volume/volume-doc.js';

export interface NodeFenceOptions {
  node: string;
  /** Only this volume (default: every volume the node holds or has tickets for). */
  volume?: string;
}

/** Exit 0 when every volume was fenced, 1 when any failed (each failure is printed; repeating it is harmless). */
export async function nodeFence(options: NodeFenceOptions, io: CommandIO): Promise<number> {
  const { node } = options;
  checkNodeName(node);
  const config = configOf(io);
  const fencer = await requireFencer(config);
  const ctx = io.context(config);
  const { volumes, damaged } = await volumesToVisit(ctx, options.volume, (d) => concernsNode(d, node));
  // A damaged document may name the node: it is neither fenced nor released blindly, and the command fails.
  for (const d of damaged) io.out(`volume ${d.name}: not fenced, nothing released: ${unreadable(d, node)}\n`);
  if (volumes.length === 0 && damaged.length === 0) {
    io.out(`no volume names node ${node}: nothing to fence\n`);
    return 0;
  }
  let failed = damaged.length;
  for (const volume of volumes) {
    try {
      io.out(`${await fenceVolume(ctx, fencer, volume, node, `latch node fence ${node}`)}\n`);
    } catch (err) {
      failed++;
      io.out(`volume ${volume}: not fenced: ${errorMessage(err)}\n`);
    }
  }
  return failed === 0 ? 0 : 1;
}

/**
 * The volume a command names, else every volume in the ledger that `concerns` picks, and the damaged documents, which
 * cannot say whether they concern the node.
 */
async function volumesToVisit(
  ctx: Context,
  volume: string | undefined,
  concerns: (doc: VolumeDoc) => boolean,
): Promise<{ volumes: string[]; damaged: DamagedVolume[] }> {
  if (volume !== undefined) return { volumes: [checkVolumeName(volume)], damaged: [] };
  const { docs, damaged } = await ctx.ledger.list();
  return { volumes: docs.filter(concerns).map((d) => d.name), damaged };
}

/** Why a damaged document was left alone, and how to go on once it is repaired. */
function unreadable(damaged: DamagedVolume, node: string, again = `repeat this with --volume ${damaged.name}`): string {
  return (
    `its ledger document cannot be read, so what it records of node ${node} is unknown (${damaged.reason}); ` +
    `repair the document, then ${again}`
  );
}

/** Fences `node` off `volume` and says what the storage now refuses (volume release --node-is-down uses it too). */
export async function fenceVolume(
  ctx: Context,
  fencer: Fencer,
  volume: string,
  node: string,
  reason: string,
  options: FenceOptions = {},
): Promise<string> {
  const { doc, clients, by } = await fenceNodeOffVolume(ctx, fencer, volume, node, reason, options);
  const refused =
    clients.length > 0
      ? `${by} refuses its client(s) ${clients.join(', ')}`
      : `no client of it had the image open or locked, and none was recorded: ${by} had nothing to refuse` +
        (options.poweredOff ? " (the node is powered off, on the admin's word)" : '');
  return `volume ${volume}: node ${node} fenced off (${refused}); its hold and tickets released; state now ${doc?.status.state}`;
}

/** The fencer of the configuration; a LatchError saying why there is none. */
export async function requireFencer(config: Config): Promise<Fencer> {
  if (config.backend.type === 'loop') {
    throw new LatchError(
      'the loop backend keeps each volume on one node: there is no shared storage to fence. ' +
        'If the node is down, latch volume release VOLUME --node NODE --node-is-down releases its hold',
    );
  }
  const fencer = await configuredFencer(config);
  if (!fencer) {
    throw new LatchError(
      `the configuration ${config.source} has no fencer identity (backend.fencer: { clientId, keyring }): ` +
        'fencing needs the Ceph identity that may blocklist client instances, which nodes never hold (docs/operations.md, "Fencing")',
    );
  }
  return fencer;
}

export interface NodeUnfenceOptions {
  node: string;
  volume?: string;
}

/** Exit 0 when no fence of the node is left, 1 when some still wait for the node to clear its mapping. */
export async function nodeUnfence(options: NodeUnfenceOptions, io: CommandIO): Promise<number> {
  const { node } = options;
  checkNodeName(node);
  const config = configOf(io);
  const fencer = await requireFencer(config);
  const ctx = io.context(config);
  const { volumes, damaged } = await volumesToVisit(ctx, options.volume, (d) => d.status.fences?.[node] !== undefined);
  for (const d of damaged) io.out(`volume ${d.name}: no fence lifted: ${unreadable(d, node)}\n`);
  let waiting = damaged.length;
  for (const volume of volumes) {
    const outcome = await liftClearedFence(ctx, fencer, volume, node);
    if (outcome === undefined) io.out(`volume ${volume}: node ${node} is not fenced off it\n`);
    else if ('waiting' in outcome) {
      waiting++;
      io.out(`volume ${volume}: fence kept: ${outcome.waiting} (run latch node clear-fences on ${node})\n`);
    } else io.out(`volume ${volume}: fence of node ${node} lifted (${outcome.lifted.join(', ') || 'no client entries'})\n`);
  }
  if (volumes.length === 0 && damaged.length === 0) io.out(`node ${node} is not fenced off any volume\n`);
  return waiting === 0 ? 0 : 1;
}

/** On the fenced node: its old mappings go and it tells the ledger. Exit 1 when any volume could not be cleared. */
export async function nodeClearFences(_options: object, io: CommandIO): Promise<number> {
  const ctx = io.context(configOf(io));
  const node = ctx.config.nodeName;
  const { docs, damaged } = await ctx.ledger.list();
  const fenced = docs.filter((d) => d.status.fences?.[node] && d.status.fences[node].clearedAt === undefined);
  for (const d of damaged) io.out(`volume ${d.name}: nothing cleared: ${unreadable(d, node, 'run this again')}\n`);
  let failed = damaged.length;
  for (const doc of fenced) {
    try {
      const after = await clearOwnFence(ctx, doc.name, doc);
      const fence = after?.status.fences?.[node];
      if (fence?.clearedAt !== undefined) io.out(`volume ${doc.name}: old mapping gone; fence cleared on node ${node}\n`);
      else if (fence?.state === 'fencing') io.out(`volume ${doc.name}: the fence is still being put in place; try again later\n`);
      else
        io.out(
          `volume ${doc.name}: its device is still mounted on node ${node}; unmount it (kubelet's unmountdevice does), then try again\n`,
        );
      if (fence?.clearedAt === undefined) failed++;
    } catch (err) {
      failed++;
      io.out(`volume ${doc.name}: not cleared: ${errorMessage(err)}\n`);
    }
  }
  if (fenced.length === 0 && damaged.length === 0) io.out(`node ${node} has no fence to clear\n`);
  return failed === 0 ? 0 : 1;
}

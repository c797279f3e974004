// latch volume release: the admin fence, declaring a node down so that the volume can attach elsewhere. On shared
// storage (rbd) the storage is made to refuse the node's clients first (docs/ledger.md, "Fences").
import { LatchError } from '../../errors.js';
import { checkNodeName } from '../../names.js';
import { configOf, type CommandIO } from '../io.js';
import { fenceVolume, requireFencer } from '../fencing.js';
import { getVolume } from '../volume-doc.js';

export interface VolumeReleaseOptions {
  name: string;
  node: string;
  /** The admin's word that the node is powered off or fenced. */
  nodeIsDown?: boolean;
  /** The admin's word that the node is powered off: on rbd its hold goes even where the fencer finds no client of it. */
  poweredOff?: boolean;
}

export async function volumeRelease(options: VolumeReleaseOptions, io: CommandIO): Promise<void> {
  const { name, node } = options;
  checkNodeName(node);
  if (!options.nodeIsDown) {
    throw new LatchError(
      `releasing volume ${name} from node ${node} lets another node mount it while ${node} may still write to it; ` +
        'make sure the node is down, then repeat with --node-is-down',
    );
  }
  const config = configOf(io);
  const ctx = io.context(config);
  await getVolume(ctx.ledger, name);
  if (config.backend.type !== 'loop') {
    // The node may not be down at all, only cut off from the ledger: the storage must refuse it before the volume moves.
    const fencer = await requireFencer(config);
    const reason = `latch volume release ${name} --node ${node} --node-is-down${options.poweredOff ? ' --powered-off' : ''}`;
    io.out(`${await fenceVolume(ctx, fencer, name, node, reason, { poweredOff: options.poweredOff === true })}\n`);
    return;
  }
  const doc = await ctx.ledger.releaseDeadNode(name, node);
  io.out(`volume ${name} released from node ${node}; state now ${doc?.status.state}\n`);
}

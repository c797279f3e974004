// latch volume release: the admin fence, declaring a node down so that the volume can attach elsewhere.
import { LatchError } from '../../errors.js';
import { checkNodeName } from '../../names.js';
import { configOf, type CommandIO } from '../io.js';
import { getVolume } from './volume-doc.js';

export interface VolumeReleaseOptions {
  name: string;
  node: string;
  /** The admin's word that the node is powered off or fenced. */
  nodeIsDown?: boolean;
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
  const { ledger } = io.context(configOf(io));
  await getVolume(ledger, name);
  const doc = await ledger.releaseDeadNode(name, node);
  io.out(`volume ${name} released from node ${node}; state now ${doc?.status.state}\n`);
}

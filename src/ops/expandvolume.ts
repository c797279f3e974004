// expandvolume: Not supported, on purpose. Nothing in Kubernetes calls it (PROTOCOL.md), and growing only the
// image from the control plane would leave the node's loop device and filesystem at the old size: a half-done
// resize. kubelet's expandfs does the whole job on the node (image, loop device, filesystem) and an admin has
// `latch volume expand NAME --size S`.
import { NotSupportedError } from '../errors.js';
import type { OpCall } from './types.js';

export async function run(_call: OpCall): Promise<never> {
  throw new NotSupportedError(
    'nothing in Kubernetes calls expandvolume; latch grows volumes in expandfs on the node (or latch volume expand)',
  );
}

// expandvolume: nothing upstream calls it (PROTOCOL.md); resizing goes through expandfs.
import { NotSupportedError } from '../errors.js';
import type { OpCall } from './types.js';

export async function run(_call: OpCall): Promise<never> {
  throw new NotSupportedError('nothing in Kubernetes calls expandvolume; latch grows volumes through expandfs');
}

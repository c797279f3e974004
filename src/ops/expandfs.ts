// expandfs: not offered yet (init says requiresFSResize: false, so kubelet does not call it).
import { NotSupportedError } from '../errors.js';
import type { OpCall } from './types.js';

export async function run(_call: OpCall): Promise<never> {
  throw new NotSupportedError('online resize is not implemented yet');
}

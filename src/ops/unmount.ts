// unmount <podVolumeDir>: in attach mode kubelet removes its own bind mount.
import { NotSupportedError } from '../errors.js';
import { failure } from '../protocol/reply.js';
import type { OpCall } from './types.js';

export async function run(call: OpCall) {
  if (call.config.attach) throw new NotSupportedError('in attach mode kubelet removes its own bind mount');
  return failure('non-attach mode (attach: false) is not implemented yet');
}

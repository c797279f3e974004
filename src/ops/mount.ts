// mount <podVolumeDir> <json>: in attach mode kubelet bind-mounts the global path itself.
import { NotSupportedError } from '../errors.js';
import { failure } from '../protocol/reply.js';
import type { OpCall } from './types.js';

export async function run(call: OpCall) {
  if (call.config.attach) throw new NotSupportedError('in attach mode kubelet bind-mounts the device mount itself');
  return failure('non-attach mode (attach: false) is not implemented yet');
}

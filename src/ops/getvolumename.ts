// getvolumename: kubelet replaces our answer with the PV name, but it documents which name latch uses.
import { success } from '../protocol/reply.js';
import type { OpCall } from './types.js';

export async function run(call: OpCall) {
  return success({ volumeName: call.options!.name });
}

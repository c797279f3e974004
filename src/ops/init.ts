// init: tell kubelet and the controller what latch can do. Every capability explicit, no side effects.
import { success } from '../protocol/reply.js';
import type { OpCall } from './types.js';

export async function run(call: OpCall) {
  return success({
    capabilities: {
      attach: call.config.attach,
      selinuxRelabel: true,
      fsGroup: true,
      // Only true once expandfs really grows the filesystem: kubelet calls it for every expanded PVC.
      requiresFSResize: false,
      supportsMetrics: false,
    },
  });
}

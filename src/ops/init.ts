// init: tell kubelet and the controller what latch can do. Every capability explicit, no side effects.
import { success } from '../protocol/reply.js';
import type { OpCall } from './types.js';

export async function run(call: OpCall) {
  return success({
    capabilities: {
      attach: call.config.attach,
      selinuxRelabel: true,
      fsGroup: true,
      // expandfs grows the image, the loop device and the mounted filesystem online: kubelet calls it after a PVC
      // is expanded (in both modes).
      requiresFSResize: true,
      supportsMetrics: false,
    },
  });
}

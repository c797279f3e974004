// init: tell kubelet and the controller what latch can do. Every capability explicit, no side effects.
import { success } from '../contract/reply.js';
import { defineOp } from './op.js';

export const op = defineOp({
  args: {},
  async run(ctx) {
    return success({
      capabilities: {
        attach: ctx.config.attach,
        selinuxRelabel: true,
        fsGroup: true,
        // expandfs grows the image, the device and the mounted filesystem online (in both modes).
        requiresFSResize: true,
        supportsMetrics: false,
      },
    });
  },
});

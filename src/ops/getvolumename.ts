// getvolumename: kubelet replaces our answer with the PV name, but it documents which name latch uses.
import { volumeOptions } from '../contract/args.js';
import { success } from '../contract/reply.js';
import { defineOp } from './op.js';

export const op = defineOp({
  args: { json: volumeOptions },
  async run(_ctx, { json }) {
    return success({ volumeName: json.name });
  },
});

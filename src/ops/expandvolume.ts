// expandvolume: Not supported, on purpose. Nothing in Kubernetes calls it, and growing only the image from the
// control plane would leave the node's device and filesystem at the old size: a half-done resize. expandfs does the
// whole job on the node, and an admin has `latch volume expand NAME --size S` (docs/protocol.md).
import { byteCount, path, volumeOptions } from '../contract/args.js';
import { NotSupportedError } from '../errors.js';
import { defineOp } from './op.js';

export const op = defineOp({
  args: { json: volumeOptions, deviceMountPath: path, newBytes: byteCount, oldBytes: byteCount },
  async run() {
    throw new NotSupportedError(
      'nothing in Kubernetes calls expandvolume; latch grows volumes in expandfs on the node (or latch volume expand)',
    );
  },
});

// unmountdevice <deviceMountPath> (node): find what is mounted there from the kernel, unmount it, release the
// device and confirm the release in the ledger. Works with no options and after a crash at any point.
import { path } from '../contract/args.js';
import { failure, success } from '../contract/reply.js';
import { releaseDevice, unmountTop, unmountTopOnceFree } from '../node/device.js';
import { cutOffIfFenced } from '../node/fence.js';
import { unmountSharedDevice } from '../node/shared.js';
import { volumeAtPath } from '../node/volume-at-path.js';
import { defineOp } from './op.js';

export const op = defineOp({
  args: { deviceMountPath: path },
  releasesMarkedHolds: true,
  attachModeOnly: true,
  async run(ctx, { deviceMountPath }) {
    const node = ctx.config.nodeName;
    const shared = await unmountSharedDevice(ctx, deviceMountPath);
    if (shared) return shared;
    const found = await volumeAtPath(ctx, deviceMountPath);
    if (found.kind === 'none') return success(); // not a name latch could have used: nothing of ours to finish
    if (found.kind === 'foreign') {
      return failure(`${deviceMountPath} has ${found.top.source} mounted, which is not a latch volume; not touching it`);
    }
    const name = found.volume;
    ctx.log.volume = name;
    if (found.kind === 'mounted') {
      if (await cutOffIfFenced(ctx, name)) await unmountTopOnceFree(ctx, deviceMountPath);
      else await unmountTop(ctx, deviceMountPath);
    } else if ((await ctx.backend.findDevice(name)) === undefined) {
      // Nothing mounted and no device: done, unless a previous call died before confirming the release.
      const phase = (await ctx.ledger.get(name))?.status.nodes[node]?.phase;
      if (phase === undefined || phase === 'granted') return success();
    }

    const busy = await releaseDevice(ctx, name);
    if (busy) {
      // Still mounted elsewhere (a pod bind mount kubelet has not removed yet): keep the device and the hold.
      return success({ message: `${deviceMountPath} unmounted; ${busy} is still mounted elsewhere, so it stays attached` });
    }
    return success();
  },
});

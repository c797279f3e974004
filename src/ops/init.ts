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
        // kubelet then reads the volume's usage itself, with statfs(2) on the pod's volume directory
        // (pkg/volume/flexvolume/plugin.go: newMounterInternal picks volume.NewMetricsStatFS(GetPodVolumeDir(...)) when
        // SupportsMetrics, else MetricsNil; pkg/volume/metrics_statfs.go -> pkg/volume/util/fs FsInfo). latch's volumes
        // are always a mounted filesystem there (bind mount of the global path, or latch's own mount), so statfs is right.
        supportsMetrics: true,
      },
    });
  },
});

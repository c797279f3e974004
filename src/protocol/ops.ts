// The FlexVolume call table: argument names in PROTOCOL.md's order, and the module that serves each op.
// Modules load lazily so a call pays only for the code it runs.
import type { OpHandler } from '../ops/types.js';

export interface OpSpec {
  /** Positional argument names after the op. */
  args: readonly string[];
  /** Arguments that may legitimately be empty strings. */
  mayBeEmpty?: readonly string[];
  load: () => Promise<{ run: OpHandler }>;
}

export const OPS: Record<string, OpSpec> = {
  init: { args: [], load: () => import('../ops/init.js') },
  getvolumename: { args: ['json'], load: () => import('../ops/getvolumename.js') },
  attach: { args: ['json', 'nodeName'], load: () => import('../ops/attach.js') },
  isattached: { args: ['json', 'nodeName'], load: () => import('../ops/isattached.js') },
  detach: { args: ['pvOrVolumeName', 'nodeName'], load: () => import('../ops/detach.js') },
  // The controller's attach reply carries no device (only the node can know it), so kubelet passes "".
  waitforattach: { args: ['devicePath', 'json'], mayBeEmpty: ['devicePath'], load: () => import('../ops/waitforattach.js') },
  mountdevice: { args: ['deviceMountPath', 'devicePath', 'json'], load: () => import('../ops/mountdevice.js') },
  unmountdevice: { args: ['deviceMountPath'], load: () => import('../ops/unmountdevice.js') },
  mount: { args: ['podVolumeDir', 'json'], load: () => import('../ops/mount.js') },
  unmount: { args: ['podVolumeDir'], load: () => import('../ops/unmount.js') },
  expandfs: {
    args: ['json', 'devicePath', 'podVolumeDir', 'newBytes', 'oldBytes'],
    load: () => import('../ops/expandfs.js'),
  },
  expandvolume: {
    args: ['json', 'deviceMountPath', 'newBytes', 'oldBytes'],
    load: () => import('../ops/expandvolume.js'),
  },
};

export function usageOf(op: string): string {
  const spec = OPS[op];
  return spec ? [op, ...spec.args.map((a) => `<${a}>`)].join(' ') : op;
}

// The FlexVolume call table: argument names in PROTOCOL.md's order, and the module that serves each op.
// Modules load lazily so a call pays only for the code it runs.
import type { OpHandler } from '../ops/types.js';

export interface OpSpec {
  /** Positional argument names after the op. */
  args: readonly string[];
  /** Arguments that may legitimately be empty strings. */
  mayBeEmpty?: readonly string[];
  /** Only used in attach mode: with `attach: false` in the config the op answers Not supported. */
  attachModeOnly?: boolean;
  load: () => Promise<{ run: OpHandler }>;
}

export const OPS: Record<string, OpSpec> = {
  init: { args: [], load: () => import('../ops/init.js') },
  getvolumename: { args: ['json'], load: () => import('../ops/getvolumename.js') },
  attach: { args: ['json', 'nodeName'], attachModeOnly: true, load: () => import('../ops/attach.js') },
  isattached: { args: ['json', 'nodeName'], attachModeOnly: true, load: () => import('../ops/isattached.js') },
  detach: { args: ['pvOrVolumeName', 'nodeName'], attachModeOnly: true, load: () => import('../ops/detach.js') },
  // The controller's attach reply carries no device (only the node can know it), so kubelet passes "".
  waitforattach: {
    args: ['devicePath', 'json'],
    mayBeEmpty: ['devicePath'],
    attachModeOnly: true,
    load: () => import('../ops/waitforattach.js'),
  },
  mountdevice: { args: ['deviceMountPath', 'devicePath', 'json'], attachModeOnly: true, load: () => import('../ops/mountdevice.js') },
  unmountdevice: { args: ['deviceMountPath'], attachModeOnly: true, load: () => import('../ops/unmountdevice.js') },
  mount: { args: ['podVolumeDir', 'json'], load: () => import('../ops/mount.js') },
  unmount: { args: ['podVolumeDir'], load: () => import('../ops/unmount.js') },
  // kubelet passes the device its actual state of world knows: "" for a non-attachable driver.
  expandfs: {
    args: ['json', 'devicePath', 'podVolumeDir', 'newBytes', 'oldBytes'],
    mayBeEmpty: ['devicePath'],
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

// The FlexVolume call table: every op latch answers, and the module that defines it. Modules load lazily so a call
// pays only for the code it runs; an op not listed here answers Not supported.
import type { OpDefinition } from '../ops/op.js';
import type { ControlPlaneOp } from './control-plane-ops.js';

/** Op name → its definition, loaded on first use. */
export type OpTable = Readonly<Record<string, () => Promise<OpDefinition>>>;

/** The control plane's ops (control-plane-ops.ts): the whole table of src/sea/control.ts's bundle. */
export const CONTROL_PLANE_OP_TABLE: Readonly<Record<ControlPlaneOp, () => Promise<OpDefinition>>> = {
  init: () => import('../ops/init.js').then((m) => m.op),
  getvolumename: () => import('../ops/getvolumename.js').then((m) => m.op),
  attach: () => import('../ops/attach.js').then((m) => m.op),
  isattached: () => import('../ops/isattached.js').then((m) => m.op),
  detach: () => import('../ops/detach.js').then((m) => m.op),
};

// Pure (the annotation lets esbuild drop it where unused): the control plane's bundle, which uses only the table
// above, then leaves out the other ops' modules.
export const OPS: OpTable = /* @__PURE__ */ Object.assign({}, CONTROL_PLANE_OP_TABLE, {
  waitforattach: () => import('../ops/waitforattach.js').then((m) => m.op),
  mountdevice: () => import('../ops/mountdevice.js').then((m) => m.op),
  unmountdevice: () => import('../ops/unmountdevice.js').then((m) => m.op),
  mount: () => import('../ops/mount.js').then((m) => m.op),
  unmount: () => import('../ops/unmount.js').then((m) => m.op),
  expandfs: () => import('../ops/expandfs.js').then((m) => m.op),
  expandvolume: () => import('../ops/expandvolume.js').then((m) => m.op),
});

/** The op's usage line, e.g. `detach <pvOrVolumeName> <nodeName>`. */
export function usageOf(op: string, definition: OpDefinition): string {
  return [op, ...Object.keys(definition.args).map((a) => `<${a}>`)].join(' ');
}

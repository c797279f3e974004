// The ops that the control plane calls all the time and that never touch a node's devices, in a file that imports
// nothing: bin/latch-sea's loader (src/sea/main.ts) reads it on every call to pick the bundle that answers it. These
// are answered by a bundle of their own (src/sea/control.ts), half the size of the one with every op: a call's
// start-up deserializes and evaluates all of its bundle, whatever the call runs.
export const CONTROL_PLANE_OPS = ['init', 'getvolumename', 'attach', 'isattached', 'detach'] as const;

export type ControlPlaneOp = (typeof CONTROL_PLANE_OPS)[number];

export function isControlPlaneOp(op: string): op is ControlPlaneOp {
  return (CONTROL_PLANE_OPS as readonly string[]).includes(op);
}

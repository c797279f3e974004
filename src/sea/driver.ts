// The bundle of bin/latch-sea that answers every op (src/sea/bundle.ts); the control plane's calls have a smaller one
// of their own (src/sea/control.ts).
import { OPS } from '../protocol/ops.js';
import { driverBundle } from './bundle.js';

export const { runDriverCall, warmUp } = driverBundle(OPS);

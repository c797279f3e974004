// The bundle of bin/latch-sea that answers the control plane's calls (src/protocol/control-plane-ops.ts): built from
// their op table alone, it leaves out the node's ops, the backends and the host's tools, whose code every call of the
// whole bundle (src/sea/driver.ts) deserializes and evaluates at start-up. build.mjs leaves out the modules that
// src/context.ts loads on first use (the backend, the host system), which these ops never touch.
import { CONTROL_PLANE_OP_TABLE } from '../protocol/ops.js';
import { driverBundle } from './bundle.js';

export const { runDriverCall, warmUp } = driverBundle(CONTROL_PLANE_OP_TABLE);

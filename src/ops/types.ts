// What every FlexVolume op handler receives and returns.
import type { Config } from '../config.js';
import type { VolumeOptions } from '../protocol/options.js';
import type { Reply } from '../protocol/reply.js';

export interface OpCall {
  op: string;
  /** Positional arguments by the names PROTOCOL.md gives them (json, nodeName, devicePath, ...). */
  args: Record<string, string>;
  /** The parsed options JSON, for ops that take one. */
  options?: VolumeOptions;
  config: Config;
  /** What the call learned (volume, node, device...): recorded in its log line. */
  facts: Record<string, unknown>;
}

export type OpHandler = (call: OpCall) => Promise<Reply>;

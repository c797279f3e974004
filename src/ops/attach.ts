import { failure } from '../protocol/reply.js';
import type { OpCall } from './types.js';

export async function run(_call: OpCall) {
  return failure('attach is not implemented yet');
}

// latch version: the version this build was made from.
import { VERSION } from '../version.js';
import type { CommandIO } from './io.js';

export async function version(_options: object, io: CommandIO): Promise<void> {
  io.out(`${VERSION}\n`);
}

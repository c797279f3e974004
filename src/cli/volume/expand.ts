// latch volume expand: grow a volume's image, and its filesystem online on the node that has it mounted.
import { checkVolumeName } from '../../names.js';
import { parseSize } from '../../size.js';
import { configOf, type CommandIO } from '../io.js';

export async function volumeExpand(options: { name: string; size: string }, io: CommandIO): Promise<void> {
  const config = configOf(io);
  checkVolumeName(options.name);
  const size = parseSize(options.size, '--size');
  const { expandVolume } = await import('../../node/resize.js');
  io.out(`${await expandVolume(io.context(config), options.name, size)}\n`);
}

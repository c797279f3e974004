// latch snapshot create: a consistent snapshot of a volume, on the node it is on (frozen if mounted there).
import { checkVolumeName } from '../../names.js';
import { snapshotVolume } from '../../node/snapshot.js';
import { formatSize } from '../../size.js';
import { configOf, type CommandIO } from '../io.js';
import { formatJson, type OutputFormat } from '../output.js';

export async function snapshotCreate(options: { volume: string; name: string; output: OutputFormat }, io: CommandIO): Promise<void> {
  const volume = checkVolumeName(options.volume);
  const name = checkVolumeName(options.name, 'snapshot name', 200);
  const { info, consistency } = await snapshotVolume(io.context(configOf(io)), volume, name);
  if (options.output === 'json') {
    io.out(formatJson({ ...info, consistency }));
    return;
  }
  const how = {
    frozen: 'its filesystem was frozen while it was cut',
    idle: 'the volume was not in use',
    'crash-consistent': 'set up here but not mounted, so crash-consistent',
  }[consistency];
  io.out(`snapshot ${name} of volume ${volume} created (${info.sharing}, ${formatSize(info.sizeBytes)}; ${how})\n`);
}

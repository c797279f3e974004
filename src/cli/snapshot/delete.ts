// latch snapshot delete: remove one of a volume's snapshots.
import { LatchError } from '../../errors.js';
import { checkVolumeName } from '../../names.js';
import { configOf, type CommandIO } from '../io.js';
import { backendSnapshots } from './list.js';

export async function snapshotDelete(options: { volume: string; name: string }, io: CommandIO): Promise<void> {
  const volume = checkVolumeName(options.volume);
  const name = checkVolumeName(options.name, 'snapshot name', 200);
  const ctx = io.context(configOf(io));
  const backend = (await (await import('../../node/shared.js')).sharedSnapshotsOf(ctx, volume)) ?? backendSnapshots(ctx);
  if (!(await backend.listSnapshots(volume)).some((s) => s.name === name)) {
    throw new LatchError(`volume ${volume} has no snapshot named ${name} (latch snapshot list ${volume})`);
  }
  await backend.deleteSnapshot(volume, name);
  io.out(`snapshot ${name} of volume ${volume} deleted\n`);
}

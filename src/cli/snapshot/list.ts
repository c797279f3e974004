// latch snapshot list: a volume's snapshots with their real space.
import type { Context } from '../../context.js';
import { hasSnapshots } from '../../backend/types.js';
import { LatchError, NotSupportedError } from '../../errors.js';
import { checkVolumeName } from '../../names.js';
import { formatSize } from '../../size.js';
import { configOf, type CommandIO } from '../io.js';
import { formatJson, formatTable, type OutputFormat } from '../output.js';

export async function snapshotList(options: { volume: string; output: OutputFormat }, io: CommandIO): Promise<void> {
  const volume = checkVolumeName(options.volume);
  const ctx = io.context(configOf(io));
  await checkVolumeExists(ctx, volume);
  const shared = await (await import('../../node/shared.js')).sharedSnapshotsOf(ctx, volume);
  const snapshots = await (shared ?? backendSnapshots(ctx)).listSnapshots(volume);
  if (options.output === 'json') {
    io.out(formatJson(snapshots));
    return;
  }
  const optional = (n: number | undefined) => (n === undefined ? '?' : formatSize(n));
  io.out(
    formatTable(
      ['name', 'size', 'sharing', 'allocated', 'exclusive', 'created'],
      snapshots.map((s) => [
        s.name,
        formatSize(s.sizeBytes),
        s.sharing === 'copy' ? 'copy (pool cannot reflink)' : s.sharing,
        optional(s.allocatedBytes),
        optional(s.exclusiveBytes),
        s.createdAt,
      ]),
    ),
  );
}

export function backendSnapshots(ctx: Context) {
  if (!hasSnapshots(ctx.backend)) throw new NotSupportedError(`${ctx.backend.storage} cannot take snapshots`);
  return ctx.backend;
}

/** The volume must exist in the ledger (a typo should not read as "no snapshots"). */
async function checkVolumeExists(ctx: Context, volume: string): Promise<void> {
  if (!(await ctx.ledger.get(volume))) throw new LatchError(`volume ${volume} does not exist (latch volume list shows the volumes)`);
}

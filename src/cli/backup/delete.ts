// latch backup delete: remove a backup's manifest, then every chunk no other backup needs.
import { deleteBackup } from '../../backup/delete.js';
import { checkBackupName } from '../../backup/layout.js';
import { formatSize } from '../../size.js';
import { configOf, type CommandIO } from '../io.js';
import { backupTargetOf } from '../../jobs/backup-target.js';

export async function backupDelete(options: { name: string }, io: CommandIO): Promise<void> {
  const config = configOf(io);
  const target = backupTargetOf(config);
  const report = await deleteBackup({ target, name: checkBackupName(options.name), node: config.nodeName });
  io.out(
    `backup ${options.name} deleted; ${report.removedChunks} chunk(s) no other backup needs were removed (${formatSize(report.freedBytes)}), ` +
      `${report.keptChunks} kept\n`,
  );
}

// latch backup verify: read every chunk of a backup back and check it; exit 1 when anything is missing or damaged.
import { checkBackupName } from '../../backup/layout.js';
import { verifyBackup } from '../../backup/verify.js';
import { configOf, type CommandIO } from '../io.js';
import { formatJson, type OutputFormat } from '../output.js';
import { backupTargetOf } from '../../jobs/backup-target.js';

export async function backupVerify(options: { name: string; output: OutputFormat }, io: CommandIO): Promise<number> {
  const target = backupTargetOf(configOf(io));
  const report = await verifyBackup({ target, name: checkBackupName(options.name) });
  if (options.output === 'json') {
    io.out(formatJson(report));
  } else if (report.ok) {
    io.out(
      `backup ${report.name} of volume ${report.volume} is intact: ${report.chunksChecked} chunk(s) read back` +
        `${report.encrypted ? ' and decrypted' : ''}, image checksum matches` +
        (report.authenticated
          ? ', manifest authenticated by the backup key\n'
          : '; its manifest is UNAUTHENTICATED (no backup key is configured: anyone who can write the target could have written it)\n'),
    );
  } else {
    const lines = report.problems.map((p) => `  chunk ${p.index} (${p.hash}): ${p.problem}: ${p.detail}`);
    if (report.imageChecksumMatches === false) lines.push('  the chunks put together do not match the image checksum');
    io.out(`backup ${report.name} of volume ${report.volume} is DAMAGED; it cannot be restored:\n${lines.join('\n')}\n`);
  }
  return report.ok ? 0 : 1;
}

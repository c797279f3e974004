// latch backup authenticate: sign a backup made before the backup key was configured, after checking it whole; the
// admin's explicit word that it is theirs (with a key configured, verify and restore refuse it until then).
import { authenticateBackup } from '../../backup/authenticate.js';
import { checkBackupName } from '../../backup/layout.js';
import { configOf, type CommandIO } from '../io.js';
import { backupTargetOf } from '../../jobs/backup-target.js';

export async function backupAuthenticate(options: { name: string }, io: CommandIO): Promise<number> {
  const config = configOf(io);
  const target = backupTargetOf(config);
  const name = checkBackupName(options.name);
  const report = await authenticateBackup({ target, name, node: config.nodeName });
  if (report.verify === undefined) {
    io.out(`backup ${name} is authenticated already\n`);
    return 0;
  }
  if (!report.signed) {
    const lines = report.verify.problems.map((p) => `  chunk ${p.index} (${p.hash}): ${p.problem}: ${p.detail}`);
    if (report.verify.imageChecksumMatches === false) lines.push('  the chunks put together do not match the image checksum');
    io.out(`backup ${name} is DAMAGED; it was not authenticated:\n${lines.join('\n')}\n`);
    return 1;
  }
  io.out(
    `backup ${name} is intact (${report.verify.chunksChecked} chunk(s) read back) and its manifest is now authenticated by the backup key\n`,
  );
  return 0;
}

// One restore of the S3 backup benchmark (backup-s3.ts) as another node makes it: a process of its own, with that
// node's configuration file (its name, its copies of the credentials and key files), restoring the backup its
// configuration's target names into an image file. Prints one JSON line: the restore's report, its time and the
// process's peak resident set in bytes.
import { readFileSync } from 'node:fs';
import { restoreBackup } from '../../src/backup/restore.js';
import { parseConfig } from '../../src/config.js';

async function main(): Promise<void> {
  const [configFile = '', name = '', destination = ''] = process.argv.slice(2);
  const config = parseConfig(JSON.parse(readFileSync(configFile, 'utf8')) as unknown, configFile);
  if (!config.backupTarget) throw new Error(`${configFile} names no backupTarget`);
  const started = performance.now();
  const report = await restoreBackup({ target: config.backupTarget, name, destination });
  const ms = performance.now() - started;
  process.stdout.write(
    `${JSON.stringify({ node: config.nodeName, bytesWritten: report.bytesWritten, ms, maxRssBytes: process.resourceUsage().maxRSS * 1024 })}\n`,
  );
}

main().catch((err: unknown) => {
  process.stderr.write(`${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});

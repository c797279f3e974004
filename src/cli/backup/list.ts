// latch backup list: the complete backups in the target (of one volume, or all), and damaged manifests as such; an
// unauthenticated manifest (an unkeyed checksum only: backup/manifest.ts) is listed, and says so.
import { listBackups } from '../../backup/manifest.js';
import { checkVolumeName } from '../../names.js';
import { formatSize } from '../../size.js';
import { configOf, type CommandIO } from '../io.js';
import { formatJson, formatTable, type OutputFormat } from '../output.js';
import { backupTargetOf } from '../../jobs/backup-target.js';

export async function backupList(options: { volume?: string; output: OutputFormat }, io: CommandIO): Promise<void> {
  if (options.volume !== undefined) checkVolumeName(options.volume);
  const target = backupTargetOf(configOf(io));
  const backups = await listBackups(target, options.volume);
  if (options.output === 'json') {
    io.out(
      formatJson(
        backups.map((b) => {
          if (!b.manifest) return { name: b.name, error: b.error };
          const { chunks, ...rest } = b.manifest;
          return { ...rest, chunkCount: chunks.length, authenticated: b.authenticated === true };
        }),
      ),
    );
    return;
  }
  io.out(
    formatTable(
      ['name', 'volume', 'size', 'data', 'stored', 'created', 'authenticated', 'parent'],
      backups.map((b) => {
        const m = b.manifest;
        if (!m) return [b.name, '?', '-', '-', '-', '-', '-', `DAMAGED: ${b.error ?? ''}`];
        return [
          m.name,
          m.volume,
          formatSize(m.sizeBytes),
          formatSize(m.stats.dataBytes),
          formatSize(m.stats.newBytesStored),
          m.createdAt,
          b.authenticated ? 'yes' : 'NO',
          m.parent ?? '-',
        ];
      }),
    ),
  );
}

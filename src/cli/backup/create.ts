// latch backup create: back a volume up to the backup target, from the node it is on. An idle loop volume is read
// from its image file; one in use here through a snapshot taken with its filesystem frozen; one in use on another
// node is refused, naming that node (through a ticket and the node agent, later).
import { createBackup } from '../../backup/create.js';
import { checkBackupName, checkTarget } from '../../backup/layout.js';
import { checkVolumeName } from '../../names.js';
import { openBackupSource } from '../../node/snapshot.js';
import { formatSize } from '../../size.js';
import { configOf, type CommandIO } from '../io.js';
import { formatJson, type OutputFormat } from '../output.js';
import { backupTargetOf } from './target.js';

export interface BackupCreateOptions {
  volume: string;
  name?: string;
  fromSnapshot?: string;
  output: OutputFormat;
}

export async function backupCreate(options: BackupCreateOptions, io: CommandIO): Promise<void> {
  const config = configOf(io);
  const volume = checkVolumeName(options.volume);
  if (options.name !== undefined) checkBackupName(options.name);
  const target = backupTargetOf(config);
  // Before a snapshot is taken for it (on an ext4 pool, a full copy): a missing target fails at once.
  await checkTarget(target);
  const ctx = io.context(config);
  const source = await openBackupSource(ctx, volume, options.fromSnapshot);
  let manifest;
  try {
    manifest = await createBackup({
      target,
      source: source.image.path,
      volume,
      name: options.name,
      sourceDescription: source.image.description,
      node: config.nodeName,
      beforePublish: source.beforePublish,
    });
  } finally {
    await source.release();
  }
  const { chunks, ...summary } = manifest;
  if (options.output === 'json') {
    io.out(formatJson({ ...summary, chunkCount: chunks.length, consistency: source.consistency }));
    return;
  }
  const s = manifest.stats;
  io.out(
    `backup ${manifest.name} of volume ${volume} created in ${target.path} (${source.consistency}, from ${manifest.source}):\n` +
      `  ${formatSize(manifest.sizeBytes)}, ${s.dataChunks} data chunk(s) (${formatSize(s.dataBytes)}), ${s.holeChunks} hole(s)\n` +
      `  ${s.newChunks} new chunk(s) written (${formatSize(s.newBytesStored)} compressed), ${s.presentChunks} already in the target` +
      (manifest.parent ? ` (previous backup: ${manifest.parent})` : '') +
      '\n',
  );
}

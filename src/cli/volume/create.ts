// latch volume create: a volume's ledger document and its image in the pool.
import { LatchError } from '../../errors.js';
import type { FsType } from '../../filesystems.js';
import { checkVolumeName } from '../../names.js';
import { claimHome } from '../../node/home.js';
import { formatSize, parseSize } from '../../size.js';
import { configOf, type CommandIO } from '../io.js';
import { formatJson, type OutputFormat } from '../output.js';

export interface VolumeCreateOptions {
  name: string;
  /** As given: bytes or a quantity such as 1Gi. */
  size: string;
  fsType?: string;
  /** A shared (ReadWriteMany) volume on CephFS. */
  shared?: boolean;
  output: OutputFormat;
}

export async function volumeCreate(options: VolumeCreateOptions, io: CommandIO): Promise<void> {
  const config = configOf(io);
  const { name } = options;
  checkVolumeName(name);
  const size = parseSize(options.size, '--size');
  if (size > config.maxSize) throw new LatchError(`--size ${options.size} is above maxSize (${formatSize(config.maxSize)})`);
  const fsType = (options.fsType ?? config.defaultFsType) as FsType;
  if (!config.allowedFsTypes.includes(fsType)) {
    throw new LatchError(`--fs-type ${options.fsType} is not allowed; allowed: ${config.allowedFsTypes.join(', ')}`);
  }
  const ctx = io.context(config);
  if (options.shared) {
    const { createSharedVolume } = await import('../../node/shared.js');
    const { doc, existed, storage } = await createSharedVolume(ctx, name, size, fsType);
    io.out(
      options.output === 'json'
        ? formatJson(doc)
        : `shared volume ${name} ${existed ? 'already exists' : 'created'} (${formatSize(size)} in ${storage})\n`,
    );
    return;
  }
  const { doc, existed } = await ctx.ledger.createVolume(name, { sizeBytes: size, fsType });
  // A node-local image is made in its home node's pool only, and the home recorded first (node/home.ts).
  await claimHome(ctx, doc);
  await ctx.backend.create(name, size);
  io.out(
    options.output === 'json'
      ? formatJson(doc)
      : `volume ${name} ${existed ? 'already exists' : 'created'} (${formatSize(size)}, ${fsType} on first mount)\n`,
  );
}

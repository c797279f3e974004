// What a backup reads: a regular image file or a block device, by path.
import { open, stat } from 'node:fs/promises';
import type { FileHandle } from 'node:fs/promises';
import { LatchError } from '../errors.js';
import { blockDeviceSize } from '../sys/blockdev.js';

export interface OpenedImage {
  handle: FileHandle;
  sizeBytes: number;
  /** A regular file (which may have holes to skip), not a block device. */
  isFile: boolean;
}

/** Opens a block device or an image file for reading and finds its size. */
export async function openImage(path: string, flags: 'r' | 'r+' = 'r'): Promise<OpenedImage> {
  let stats;
  try {
    stats = await stat(path);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') throw new LatchError(`${path} does not exist`);
    throw err;
  }
  if (!stats.isFile() && !stats.isBlockDevice()) throw new LatchError(`${path} is neither a regular file nor a block device`);
  const sizeBytes = stats.isFile() ? stats.size : await blockDeviceSize(path);
  return { handle: await open(path, flags), sizeBytes, isFile: stats.isFile() };
}

/** What a chunk source gives for one position: its bytes, null for a hole, or a chunk the parent backup holds as is. */
export type SourceChunk = Buffer | null | { carried: string };

/**
 * A source that gives an image chunk by chunk rather than as a file (backup/delta.ts: the extents Ceph reports,
 * over the chunks of the previous backup). createBackup asks for each position once, in order, one ahead.
 */
export interface ChunkSource {
  sizeBytes: number;
  /** The backup whose chunks the `carried` positions are (the new backup's parent). */
  parent?: string | undefined;
  /** Position `index` (`length` bytes); `into` is a buffer of the chunk size that the bytes may be read into. */
  chunk(index: number, length: number, into: Buffer): Promise<SourceChunk>;
  /** Bytes read from the source so far (the volume's storage, not the target). */
  bytesRead(): number;
  /** After the last position: throws when the source failed or gave more than the image (the backup is not published). */
  finish(): Promise<void>;
  /** Lets go of the source early (a failed or abandoned backup). */
  cancel(): void;
}

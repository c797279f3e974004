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

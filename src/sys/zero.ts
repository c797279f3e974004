// Zeroing a range of a block device: `blkdiscard --zeroout` asks the device to do it (a loop device punches a hole in
// its image file, so a restored volume stays sparse); where it cannot, zeros are written.
import type { FileHandle } from 'node:fs/promises';
import { run } from './run.js';

const SECTOR = 512;
const ZERO_BLOCK = 1024 * 1024;

export async function zeroRange(handle: FileHandle, device: string, offset: number, length: number): Promise<void> {
  if (length <= 0) return;
  if (offset % SECTOR === 0 && length % SECTOR === 0) {
    try {
      await run('blkdiscard', ['--zeroout', '--offset', String(offset), '--length', String(length), device]);
      return;
    } catch {
      // Not supported by this device or this blkdiscard: write the zeros ourselves.
    }
  }
  const zeros = Buffer.alloc(Math.min(ZERO_BLOCK, length));
  for (let done = 0; done < length;) {
    const { bytesWritten } = await handle.write(zeros, 0, Math.min(zeros.length, length - done), offset + done);
    done += bytesWritten;
  }
}

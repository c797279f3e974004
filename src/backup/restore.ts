// Restoring a backup onto a block device or into an image file. Every chunk's hash is checked as it is read, and
// the image's checksum at the end (the chunk list's for a v2 manifest, the sha256 of every byte for a v1:
// manifest.ts); a damaged backup stops the restore with an error naming the chunk (what was written so far stays:
// the destination is not usable, and the caller must not hand it to a workload).
//
// Holes stay holes: an image file is emptied first (truncated to 0, then to the size: all holes) and only data
// chunks are written (nothing is written for a hole: a fresh sparse file reads zeros there); on a block device, whose
// old contents are not known to be zeros, the hole ranges are zeroed with `blkdiscard --zeroout`, which a loop device
// turns into holes punched in its image file (zeros are written where the device cannot), unless the caller knows the
// device reads zeros (`fresh`: a volume just made, such as a thin rbd image), when only the data chunks are written
// and the image stays as thin as the backup.
import { constants } from 'node:fs';
import { open, stat } from 'node:fs/promises';
import { LatchError } from '../errors.js';
import { blockDeviceSize } from '../sys/blockdev.js';
import { zeroRange } from '../sys/zero.js';
import { chunkLength, readAhead } from './chunks.js';
import type { BackupTarget } from './layout.js';
import { imageCheck, readCheckedManifest } from './manifest.js';
import { checkTarget } from './store.js';

/** How much a restore onto a device writes between two flushes. */
const SYNC_EVERY = 64 * 1024 * 1024;

export interface RestoreOptions {
  target: BackupTarget;
  name: string;
  /** A block device (at least the backup's size), or an image file path. */
  destination: string;
  /** An existing image file is refused unless this is set (a block device is always overwritten: the caller chose it). */
  overwriteFile?: boolean | undefined;
  /** The block device reads zeros wherever nothing is written (a volume just made): its holes are not zeroed. */
  fresh?: boolean | undefined;
  /** Chunks read ahead and decompressed at once (default 4). */
  parallel?: number | undefined;
  /** Stops the restore between chunks (the node agent's job was preempted or the agent is stopping). */
  signal?: AbortSignal | undefined;
}

export interface RestoreReport {
  name: string;
  sizeBytes: number;
  dataChunks: number;
  holeChunks: number;
  bytesWritten: number;
  /** Whether the configured key authenticated the manifest (false only when no key is configured: manifest.ts). */
  authenticated: boolean;
  /** Whether its chunks were encrypted (false: a backup made without a key, or before encryption). */
  encrypted: boolean;
}

export async function restoreBackup(options: RestoreOptions): Promise<RestoreReport> {
  const { target, name, destination } = options;
  await checkTarget(target);
  // With a key configured, an unauthenticated manifest is refused here: a restore never takes one on trust.
  const { manifest, authenticated, codec } = await readCheckedManifest(target, name);
  const { sizeBytes, chunkSize } = manifest;

  const existing = await stat(destination).catch((err: NodeJS.ErrnoException) => {
    if (err.code === 'ENOENT') return undefined;
    throw err;
  });
  const isDevice = existing?.isBlockDevice() ?? false;
  if (existing && !isDevice && !existing.isFile()) throw new LatchError(`${destination} is neither a block device nor a regular file`);
  if (existing?.isFile() && !options.overwriteFile) {
    throw new LatchError(`${destination} already exists; refusing to overwrite a file without being told to`);
  }
  if (isDevice) {
    const deviceBytes = await blockDeviceSize(destination);
    if (deviceBytes < sizeBytes) {
      throw new LatchError(`${destination} holds ${deviceBytes} bytes, less than the ${sizeBytes} of backup ${name}`);
    }
  }

  const handle = await open(destination, isDevice ? 'r+' : constants.O_RDWR | constants.O_CREAT | constants.O_NOFOLLOW, 0o600);
  const report: RestoreReport = {
    name,
    sizeBytes,
    dataChunks: 0,
    holeChunks: 0,
    bytesWritten: 0,
    authenticated,
    encrypted: codec.encrypted,
  };
  try {
    if (!isDevice) {
      await handle.truncate(0);
      await handle.truncate(sizeBytes);
    }
    const check = imageCheck(manifest);
    const parallel = Math.max(1, options.parallel ?? 4);
    // The next `parallel` data chunks are read and decompressed while one is written.
    const take = readAhead(target, codec, manifest, parallel);
    let synced = 0;
    let holeStart: number | undefined;
    const flushHoles = async (end: number) => {
      if (holeStart !== undefined && isDevice && !options.fresh) await zeroRange(handle, destination, holeStart, end - holeStart);
      holeStart = undefined;
    };
    for (let index = 0; index < manifest.chunks.length; index++) {
      options.signal?.throwIfAborted();
      const offset = index * chunkSize;
      const length = chunkLength(sizeBytes, chunkSize, index);
      const hash = manifest.chunks[index];
      if (hash === null || hash === undefined) {
        check.add(null, length);
        report.holeChunks++;
        holeStart ??= offset;
        continue;
      }
      const reading = take(index); // (the reads ahead start before the holes behind this chunk are zeroed)
      await flushHoles(offset);
      const read = await reading;
      if (!read?.ok) {
        throw new LatchError(
          `backup ${name}: chunk ${index} (${hash}) is ${read?.problem ?? 'missing'} (${read?.detail ?? ''}); ` +
            `the restore to ${destination} is incomplete and must not be used`,
        );
      }
      check.add(hash, read.data);
      let written = 0;
      while (written < length) written += (await handle.write(read.data, written, length - written, offset + written)).bytesWritten;
      report.dataChunks++;
      report.bytesWritten += length;
      // On a device, flushed every SYNC_EVERY bytes: a restore of a large backup would otherwise leave gigabytes dirty
      // in the page cache (the writeback of a thin image through rbd-fuse is slow), with nothing of it on the storage.
      if (isDevice && (report.bytesWritten - synced >= SYNC_EVERY || report.bytesWritten === length)) {
        await handle.datasync();
        synced = report.bytesWritten;
      }
    }
    await flushHoles(sizeBytes);
    await handle.sync();
    if (!check.matches()) {
      throw new LatchError(`backup ${name}: the restored image does not match the manifest's checksum; the restore must not be used`);
    }
  } finally {
    await handle.close();
  }
  return report;
}

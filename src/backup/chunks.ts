// Chunks: fixed-size pieces of an image, named by the sha256 of their bytes and stored compressed with brotli at
// quality 1. Measured on a filesystem image of libraries and documents (4 MiB chunks, one core): brotli-1 gave a
// ratio of 2.70 at 155 MB/s, gzip-1 2.63 at 93 MB/s, gzip-6 2.84 at 41 MB/s, brotli-3 3.00 at 69 MB/s; Node 20 has
// no zstd. brotli-1 is faster than gzip at a better ratio, and compression runs on libuv's thread pool, so
// several chunks compress in parallel.
import { createHash } from 'node:crypto';
import { mkdir, open, stat } from 'node:fs/promises';
import { dirname } from 'node:path';
import { promisify } from 'node:util';
import { brotliCompress, brotliDecompress, constants as zlibConstants } from 'node:zlib';
import { chunkPath, type BackupTarget } from './layout.js';
import { writeFileAtomic } from '../atomic-file.js';

export const DEFAULT_CHUNK_SIZE = 4 * 1024 * 1024;
/**
 * The largest chunk a backup may have: a manifest that declares more is refused, so that the reads ahead of a restore
 * or verify (4 chunks decompressed at once) never hold more than 64 MiB whatever a target holds.
 */
export const MAX_CHUNK_SIZE = 16 * 1024 * 1024;

const compress = promisify(brotliCompress);
const decompress = promisify(brotliDecompress);

export function sha256(data: Uint8Array): string {
  return createHash('sha256').update(data).digest('hex');
}

let zeros = Buffer.alloc(0);

/** Whether every byte is zero (a hole: recorded in the manifest, never stored). */
export function isAllZero(data: Buffer): boolean {
  if (zeros.length < data.length) zeros = Buffer.alloc(data.length);
  return data.equals(zeros.subarray(0, data.length));
}

export async function chunkExists(target: BackupTarget, hash: string): Promise<boolean> {
  try {
    await stat(chunkPath(target, hash));
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return false;
    throw err;
  }
}

/**
 * Stores a chunk under its hash: compressed into a temp file, fsynced, renamed into place. The caller fsyncs the
 * shard directories once before it publishes a manifest that needs them. Returns the bytes written.
 */
export async function storeChunk(target: BackupTarget, hash: string, data: Buffer): Promise<number> {
  const packed = await compress(data, {
    // Output in 1 MiB pieces rather than zlib's 16 KiB: each piece is a round trip between the thread pool and the
    // main thread (a 4 MiB chunk compressed to 600 KiB took 40).
    chunkSize: Math.min(data.length, 1024 * 1024),
    params: { [zlibConstants.BROTLI_PARAM_QUALITY]: 1, [zlibConstants.BROTLI_PARAM_SIZE_HINT]: data.length },
  });
  const path = chunkPath(target, hash);
  // Private: a chunk is a piece of a volume (layout.ts).
  await mkdir(dirname(path), { recursive: true, mode: 0o700 });
  // Without a directory fsync per chunk (as before): verify finds a chunk a power loss took.
  await writeFileAtomic(path, packed, { sync: 'file' });
  return packed.length;
}

export type ChunkRead = { ok: true; data: Buffer } | { ok: false; problem: 'missing' | 'corrupt'; detail: string };

/**
 * More bytes than brotli makes of `length` bytes: what it cannot compress it stores in meta-blocks of a few bytes of
 * header each (random data measured: 4 bytes more for 64 KiB, 5 for 4 MiB, 17 for 16 MiB), so a larger file is not
 * a chunk latch wrote.
 */
function maxPackedLength(length: number): number {
  return length + (length >> 6) + 1024;
}

/**
 * Reads a chunk back and checks that its bytes still hash to its name. A chunk file is read from a target that others
 * may write, so nothing in it is trusted: the file may be no larger than a chunk of its length compresses to, and it
 * is decompressed into at most that length (zlib's maxOutputLength stops the decompression there). A chunk that
 * would inflate further (a decompression bomb: 203 bytes of brotli make 256 MiB) is corrupt, and costs little more
 * memory than an honest one (brotli's window: at most 16 MiB per decompression).
 */
async function readChunk(target: BackupTarget, hash: string, expectedLength: number): Promise<ChunkRead> {
  let packed: Buffer;
  let handle;
  try {
    handle = await open(chunkPath(target, hash), 'r');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return { ok: false, problem: 'missing', detail: 'the chunk file is missing' };
    throw err;
  }
  try {
    const { size } = await handle.stat();
    if (size > maxPackedLength(expectedLength)) {
      return {
        ok: false,
        problem: 'corrupt',
        detail: `its file holds ${size} bytes, more than a chunk of ${expectedLength} bytes compresses to`,
      };
    }
    // Read into a buffer of the size found (one byte more, to see a file that grew since): never more than that.
    const buffer = Buffer.allocUnsafe(size + 1);
    let done = 0;
    while (done < buffer.length) {
      const { bytesRead } = await handle.read(buffer, done, buffer.length - done, done);
      if (bytesRead === 0) break;
      done += bytesRead;
    }
    if (done > size) return { ok: false, problem: 'corrupt', detail: 'its file grew while it was read' };
    packed = buffer.subarray(0, done);
  } finally {
    await handle.close();
  }
  let data: Buffer;
  try {
    // The output in one buffer of the chunk's length (not 16 KiB pieces joined on the main thread), and never more.
    data = await decompress(packed, { chunkSize: Math.max(expectedLength, 64), maxOutputLength: Math.max(expectedLength, 1) });
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ERR_BUFFER_TOO_LARGE') {
      return { ok: false, problem: 'corrupt', detail: `it inflates past its ${expectedLength} bytes (a decompression bomb?)` };
    }
    return { ok: false, problem: 'corrupt', detail: 'it does not decompress' };
  }
  if (data.length !== expectedLength) {
    return { ok: false, problem: 'corrupt', detail: `it holds ${data.length} bytes, not ${expectedLength}` };
  }
  if (sha256(data) !== hash) return { ok: false, problem: 'corrupt', detail: 'its bytes do not match its sha256' };
  return { ok: true, data };
}

/** An image's chunk list as a manifest holds it: each position's hash, or null for a hole. */
export interface ChunkList {
  chunks: readonly (string | null)[];
  sizeBytes: number;
  chunkSize: number;
}

/**
 * Reads an image's data chunks ahead of a loop that goes through its positions in order (restore, verify): the next
 * `parallel` reads are in flight while the loop works on one. Counted in reads, not positions, so that a run of holes
 * never leaves the read after it waiting. With `repeatsOnce`, a chunk that appears at several positions is read at
 * the first one only. Returns `take(index)`: the read of that position, or undefined for a hole or a repeat.
 */
export function readAhead(
  target: BackupTarget,
  list: ChunkList,
  parallel: number,
  options: { repeatsOnce?: boolean } = {},
): (index: number) => Promise<ChunkRead> | undefined {
  const pending = new Map<number, Promise<ChunkRead>>();
  const scheduled = new Set<string>();
  let ahead = 0;
  return (index) => {
    for (; ahead < list.chunks.length && pending.size < parallel; ahead++) {
      const hash = list.chunks[ahead];
      if (typeof hash !== 'string' || (options.repeatsOnce && scheduled.has(hash))) continue;
      scheduled.add(hash);
      const read = readChunk(target, hash, chunkLength(list.sizeBytes, list.chunkSize, ahead));
      read.catch(() => undefined); // awaited in its turn; a failure before then is not an unhandled rejection
      pending.set(ahead, read);
    }
    const read = pending.get(index);
    pending.delete(index);
    return read;
  };
}

/** The byte length of chunk `index` of an image of `sizeBytes` (the last one may be short). */
export function chunkLength(sizeBytes: number, chunkSize: number, index: number): number {
  return Math.min(chunkSize, sizeBytes - index * chunkSize);
}

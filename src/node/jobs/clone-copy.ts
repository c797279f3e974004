// How a block volume's clone (node/jobs/clone.ts) reads its source and writes NEW, in one place.
//
// The source: a consistent image of SOURCE (snapshot S; else a temporary snapshot, node/snapshot.ts), as *pieces* in
// order on a grid of BLOCK bytes from offset 0: one block of data, or a run of blocks that read as zeros. Two readers:
// - a backend that reports snapshot diffs (rbd: `rbd export-diff` without --from-snap, sys/rbd-diff.ts) gives the
//   snapshot's allocated extents only, straight from the storage: their pieces are gathered into whole blocks in one
//   buffer, what lies between them is zeros (a diff from the image's creation lists everything allocated). Nothing is
//   written on the node and memory is one block (and the parser's piece), whatever the volume's size. A diff whose
//   size is not the snapshot's, from another start, out of order or past its size is refused (backend/rbd.ts,
//   sys/rbd-diff.ts), as is one larger than NEW (below).
// - any other backend (loop) gives an image file (its snapshot, or its idle image checked unchanged before the
//   result counts): read block by block.
//
// The writer (one for both): a data block is written at its offset, unless it is all zeros; zeros are never written
// but zeroed as holes (`blkdiscard --zeroout`), and so is NEW past the source's size, unless NEW has never been
// written (a fresh thin image reads zeros: it stays as thin as the source). A repeat after a kill finds NEW written,
// so it zeroes the holes, whatever the earlier run left where the source has zeros: where the storage lists NEW's
// allocated extents (rbd), only the parts of the holes inside them (the rest reads zeros already; zeroing it through
// rbd-fuse would write zeros, and allocate all of NEW), else all of them.
//
// The check: while writing, a digest of the source's content, sha256 over (offset, bytes) of each block that is not
// all zeros. After the copy the device is flushed, its cached blocks dropped, and every byte of it read back: the
// same digest over its first sizeBytes must match, and the rest (a NEW larger than the source) must read as zeros.
// Where the storage lists NEW's allocated extents (rbd), only the blocks that touch them are read: the storage reads
// every other byte as zeros, and a thin 1 TiB volume holding 10 GiB is checked by reading about 10 GiB, not 1 TiB.
// That is enough: two images of one size with equal digests have the same non-zero blocks at the same offsets with
// the same bytes, and zeros everywhere else, so every byte of NEW equals the source's whatever it held before (a
// partial copy, an older image); and the source's side is complete, the diff's tool having exited cleanly after its
// end record. The digest skips zero blocks so that a large thin volume costs no hashing of its holes.
import { createHash, type Hash } from 'node:crypto';
import type { FileHandle } from 'node:fs/promises';
import { isAllZero } from '../../backup/chunks.js';
import { readExactly } from '../../backup/files.js';
import { openImage } from '../../backup/source.js';
import type { SnapshotDiff } from '../../backend/types.js';
import type { Context } from '../../context.js';
import { LatchError } from '../../errors.js';
import { blockDeviceSize, flushBuffers } from '../../sys/blockdev.js';
import { zeroRange } from '../../sys/zero.js';
import { diffingBackend } from '../backup.js';
import { openBackupSource, takeTemporarySnapshot, type Consistency, type TemporarySnapshot } from '../snapshot.js';

/** The unit of the copy: a block of zeros this size becomes a hole. */
const BLOCK = 1024 * 1024;

/** A stretch of the source: one block of data at its offset, or `zeros` bytes that read as zeros. */
type Piece = { offset: number; data: Buffer } | { offset: number; zeros: number };

export interface CloneSource {
  sizeBytes: number;
  consistency: Consistency | 'snapshot';
  /** What is read, in words, for the job's message. */
  reading: string;
  /** Read once, in order; throws when the source fails or makes no sense. */
  pieces: AsyncGenerator<Piece>;
  /** Throws when what was read may have changed meanwhile: the copy must then not count. */
  beforeUse?: () => Promise<void>;
  /** Lets go of it: stops its reader, removes a temporary snapshot (also after a failure). */
  release(): Promise<void>;
}

/** What SOURCE's clone reads (see above): snapshot `fromSnapshot`, else a consistent image of SOURCE in use here. */
export async function openCloneSource(ctx: Context, volume: string, fromSnapshot: string | undefined): Promise<CloneSource> {
  const backend = diffingBackend(ctx);
  if (!backend) {
    const source = await openBackupSource(ctx, volume, fromSnapshot);
    try {
      const { handle, sizeBytes } = await openImage(source.image.path);
      return {
        sizeBytes,
        consistency: source.consistency,
        reading: source.image.description,
        pieces: imageBlocks(handle, sizeBytes, source.image.path),
        ...(source.beforePublish && { beforeUse: source.beforePublish }),
        release: async () => {
          await handle.close().catch(() => undefined);
          await source.release();
        },
      };
    } catch (err) {
      await source.release().catch(() => undefined);
      throw err;
    }
  }
  let snapshot = fromSnapshot;
  let temporary: TemporarySnapshot | undefined;
  if (snapshot === undefined) {
    // Removed on release; one that a killed run left is removed by the next run on this node (its pid is gone).
    temporary = await takeTemporarySnapshot(ctx, volume);
    snapshot = temporary.name;
  } else if ((await ctx.ledger.get(volume)) === undefined) {
    throw new LatchError(`volume ${volume} does not exist`);
  }
  let diff: SnapshotDiff;
  try {
    diff = await backend.snapshotDiff(volume, snapshot, undefined);
  } catch (err) {
    await temporary?.remove().catch(() => undefined);
    throw err;
  }
  return {
    sizeBytes: diff.sizeBytes,
    consistency: temporary?.consistency ?? 'snapshot',
    reading: diff.description,
    pieces: diffBlocks(diff),
    release: async () => {
      diff.cancel();
      await temporary?.remove();
    },
  };
}

/** An image file, block by block. */
async function* imageBlocks(handle: FileHandle, sizeBytes: number, path: string): AsyncGenerator<Piece> {
  for (let offset = 0; offset < sizeBytes; offset += BLOCK) {
    const data = await readExactly(handle, Math.min(BLOCK, sizeBytes - offset), offset, path);
    yield isAllZero(data) ? { offset, zeros: data.length } : { offset, data };
  }
}

/** A diff from the image's creation as whole blocks: data extents gathered into one block buffer, zeros between. */
async function* diffBlocks(diff: SnapshotDiff): AsyncGenerator<Piece> {
  const { sizeBytes } = diff;
  /** The block being gathered, and where the pieces handed on so far end. */
  let block: { offset: number; data: Buffer } | undefined;
  let end = 0;
  for await (const record of diff.records) {
    // A `z` record (discarded within the extents) reads as zeros, like everything the diff does not list.
    if (record.kind !== 'data') continue;
    for (let done = 0; done < record.data.length;) {
      const at = record.offset + done;
      const start = at - (at % BLOCK);
      if (block !== undefined && block.offset !== start) {
        if (start < block.offset) throw new LatchError(`the diff's extent at ${at} comes after one at ${block.offset}`);
        yield block;
        end = block.offset + block.data.length;
        block = undefined;
      }
      if (block === undefined) {
        if (start < end) throw new LatchError(`the diff's extent at ${at} comes after one that ends at ${end}`);
        if (start > end) yield { offset: end, zeros: start - end };
        block = { offset: start, data: Buffer.alloc(Math.min(BLOCK, sizeBytes - start)) };
      }
      const length = Math.min(record.data.length - done, block.offset + block.data.length - at);
      record.data.copy(block.data, at - block.offset, done, done + length);
      done += length;
    }
  }
  // The tool exited cleanly after the diff's end: nothing it had to say is missing.
  await diff.finish();
  if (block !== undefined) {
    yield block;
    end = block.offset + block.data.length;
  }
  if (end < sizeBytes) yield { offset: end, zeros: sizeBytes - end };
}

export interface CopyReport {
  sizeBytes: number;
  /** NEW's size: what the check reads (past sizeBytes, zeros). */
  deviceBytes: number;
  dataBytes: number;
  /** sha256 over (offset, bytes) of each block of the source that is not all zeros (see above). */
  contentSha256: string;
}

/** The digest of the check: each block that is not all zeros, with its offset. */
class ContentDigest {
  private readonly hash: Hash = createHash('sha256');
  private readonly offset = Buffer.alloc(8);

  add(offset: number, data: Buffer): void {
    this.offset.writeBigUInt64LE(BigInt(offset));
    this.hash.update(this.offset);
    this.hash.update(data);
  }

  hex(): string {
    return this.hash.digest('hex');
  }
}

export interface CopyOptions {
  /** NEW was never written: holes need no zeroing. */
  fresh: boolean;
  /** Else, where the storage can tell, NEW's allocated extents in order: only those parts of the holes are zeroed. */
  allocated?: AsyncIterable<{ offset: number; length: number }> | undefined;
  signal: AbortSignal;
}

/** Writes the source onto NEW's device (see above). */
export async function copyOnto(source: CloneSource, device: string, options: CopyOptions): Promise<CopyReport> {
  const { sizeBytes } = source;
  const { handle: output } = await openImage(device, 'r+');
  const allocated = options.fresh ? undefined : options.allocated && new Allocation(options.allocated);
  try {
    const deviceBytes = await blockDeviceSize(device);
    if (deviceBytes < sizeBytes) throw new LatchError(`${device} holds ${deviceBytes} bytes, less than the source's ${sizeBytes}`);
    const digest = new ContentDigest();
    let dataBytes = 0;
    let end = 0;
    let holeStart: number | undefined;
    const closeHole = async (at: number) => {
      if (holeStart !== undefined && !options.fresh) {
        const ranges = allocated ? await allocated.within(holeStart, at) : [{ offset: holeStart, length: at - holeStart }];
        for (const range of ranges) await zeroRange(output, device, range.offset, range.length);
      }
      holeStart = undefined;
    };
    for await (const piece of source.pieces) {
      options.signal.throwIfAborted();
      const length = 'data' in piece ? piece.data.length : piece.zeros;
      // The readers above give pieces in order on the grid; anything else would make the digest mean something else.
      const next = piece.offset + length;
      if (piece.offset !== end || length <= 0 || next > sizeBytes || (next % BLOCK !== 0 && next !== sizeBytes)) {
        throw new LatchError(`the clone's source gave ${length} bytes at ${piece.offset}, where ${end} of ${sizeBytes} were read`);
      }
      end = next;
      if (!('data' in piece) || isAllZero(piece.data)) {
        holeStart ??= piece.offset;
        continue;
      }
      await closeHole(piece.offset);
      for (let written = 0; written < length;) {
        written += (await output.write(piece.data, written, length - written, piece.offset + written)).bytesWritten;
      }
      digest.add(piece.offset, piece.data);
      dataBytes += length;
    }
    if (end !== sizeBytes) throw new LatchError(`the clone's source ended at byte ${end} of ${sizeBytes}`);
    // Past the source's size NEW must read zeros too.
    holeStart ??= sizeBytes;
    await closeHole(deviceBytes);
    await output.sync();
    return { sizeBytes, deviceBytes, dataBytes, contentSha256: digest.hex() };
  } finally {
    await allocated?.close().catch(() => undefined);
    await output.close();
  }
}

/** NEW's allocated extents, walked forward once as the holes come in order. */
class Allocation {
  private readonly extents: AsyncIterator<{ offset: number; length: number }>;
  private current: { offset: number; end: number } | undefined;
  private done = false;

  constructor(extents: AsyncIterable<{ offset: number; length: number }>) {
    this.extents = extents[Symbol.asyncIterator]();
  }

  /** The parts of [from, to) that are allocated (`from` never below an earlier call's `to`). */
  async within(from: number, to: number): Promise<{ offset: number; length: number }[]> {
    const ranges = [];
    for (;;) {
      if (this.current === undefined) {
        if (this.done) break;
        const next = await this.extents.next();
        if (next.done) {
          this.done = true;
          break;
        }
        this.current = { offset: next.value.offset, end: next.value.offset + next.value.length };
      }
      if (this.current.end <= from) {
        this.current = undefined;
        continue;
      }
      if (this.current.offset >= to) break;
      const offset = Math.max(from, this.current.offset);
      ranges.push({ offset, length: Math.min(to, this.current.end) - offset });
      if (this.current.end > to) break;
      this.current = undefined;
    }
    return ranges;
  }

  /** Stops the listing (its tool) where the copy is done with it. */
  async close(): Promise<void> {
    await this.extents.return?.();
  }
}

/**
 * Reads NEW back from the device itself (its cached blocks dropped first): every byte, or with `allocated` (NEW's
 * allocated extents in order, listed by the storage after the copy) the blocks that touch them. Returns the bytes read.
 */
export async function verifyCopy(
  device: string,
  copied: CopyReport,
  signal: AbortSignal,
  allocated?: AsyncIterable<{ offset: number; length: number }>,
): Promise<number> {
  await flushBuffers(device);
  const { handle } = await openImage(device);
  const listing = allocated && new Allocation(allocated);
  try {
    const digest = new ContentDigest();
    const buffer = Buffer.allocUnsafe(BLOCK);
    let bytesRead = 0;
    for (let offset = 0, length = 0; offset < copied.deviceBytes; offset += length) {
      signal.throwIfAborted();
      // Blocks on the same grid as the copy's, the last one of the source cut at its size.
      length = Math.min(BLOCK, (offset < copied.sizeBytes ? copied.sizeBytes : copied.deviceBytes) - offset);
      // Nothing of it allocated: the storage reads it as zeros, which the digest skips.
      if (listing && (await listing.within(offset, offset + length)).length === 0) continue;
      const data = await readExactly(handle, length, offset, device, buffer);
      bytesRead += length;
      if (isAllZero(data)) continue;
      if (offset >= copied.sizeBytes) {
        throw new LatchError(`${device} holds data at byte ${offset}, past the source's ${copied.sizeBytes}; this clone must not be used`);
      }
      digest.add(offset, data);
    }
    if (digest.hex() !== copied.contentSha256) {
      throw new LatchError(`the copy on ${device} does not read back as what was written; this clone must not be used`);
    }
    return bytesRead;
  } finally {
    await listing?.close().catch(() => undefined);
    await handle.close();
  }
}

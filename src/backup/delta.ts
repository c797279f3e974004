// A backup read from the extents the storage reports instead of from a whole image: Ceph's `rbd export-diff`
// (sys/rbd-diff.ts) gives the allocated extents of a first backup's snapshot, or the extents that changed since the
// snapshot of the previous backup, straight from the cluster. Each chunk position then is:
// - untouched by the diff: the previous backup's chunk at that position, carried over without a read (or a hole
//   when there is no previous backup: an extent the first diff does not report is not allocated, so it reads zeros);
// - touched: the previous backup's chunk (read back from the target and checked, when the diff covers only part of
//   the position) with the diff's bytes laid over it, hashed and stored like any other chunk.
// So a backup reads from the cluster only what changed, and needs no local copy: at most one chunk of the diff is
// held at a time (the records of one position), plus the engine's buffers.
import { LatchError } from '../errors.js';
import type { DiffRecord } from '../sys/rbd-diff.js';
import { chunkLength, readAhead } from './chunks.js';
import type { ChunkCodec } from './codec.js';
import type { BackupTarget } from './layout.js';
import type { Manifest } from './manifest.js';
import type { ChunkSource, SourceChunk } from './source.js';

export interface DiffSourceOptions {
  target: BackupTarget;
  sizeBytes: number;
  chunkSize: number;
  /** The diff's extents, in order of offset. */
  records: AsyncIterator<DiffRecord>;
  /** The backup the diff starts from (its snapshot's content is this manifest's); none: the diff is of everything. */
  parent?: Manifest | undefined;
  /** How the parent's chunks are read back (the codec the new backup writes with: its IDs are carried over as they are). */
  parentCodec?: ChunkCodec | undefined;
  /** Waits for the tool that produces the diff to exit cleanly; throws when it failed. */
  finish: () => Promise<void>;
  cancel: () => void;
}

function recordEnd(record: DiffRecord): number {
  return record.offset + (record.kind === 'data' ? record.data.length : record.length);
}

/** The part of `record` that starts at `at` (at inside it). */
function tailOf(record: DiffRecord, at: number): DiffRecord {
  if (record.kind === 'data') return { kind: 'data', offset: at, data: record.data.subarray(at - record.offset) };
  return { kind: 'zero', offset: at, length: recordEnd(record) - at };
}

/** The part of `record` that ends at `at` (at inside it). */
function headOf(record: DiffRecord, at: number): DiffRecord {
  if (record.kind === 'data') return { kind: 'data', offset: record.offset, data: record.data.subarray(0, at - record.offset) };
  return { kind: 'zero', offset: record.offset, length: at - record.offset };
}

export function diffChunkSource(options: DiffSourceOptions): ChunkSource {
  const { target, sizeBytes, chunkSize, records, parent, parentCodec } = options;
  if (parent !== undefined && (parent.chunkSize !== chunkSize || parent.sizeBytes > sizeBytes)) {
    throw new LatchError(
      `backup ${parent.name} has chunks of ${parent.chunkSize} bytes over ${parent.sizeBytes} bytes: an incremental backup ` +
        `of ${sizeBytes} bytes in chunks of ${chunkSize} cannot build on it`,
    );
  }
  if (parent !== undefined && parentCodec === undefined)
    throw new LatchError(`backup ${parent.name}: its chunks' codec is needed to build on it`);
  let pending: DiffRecord | undefined;
  let ended = false;
  let read = 0;
  let nextIndex = 0;

  const pull = async (): Promise<DiffRecord | undefined> => {
    if (pending !== undefined) {
      const record = pending;
      pending = undefined;
      return record;
    }
    if (ended) return undefined;
    const next = await records.next();
    if (next.done) {
      ended = true;
      return undefined;
    }
    if (next.value.kind === 'data') read += next.value.data.length;
    return next.value;
  };

  /** The parent's chunk at `index`, checked against its hash, as the base a partial change is laid over. */
  const parentBytes = async (index: number, hash: string): Promise<Buffer> => {
    if (parent === undefined || parentCodec === undefined) throw new LatchError('no parent');
    const length = chunkLength(parent.sizeBytes, parent.chunkSize, index);
    const one = { chunks: [hash], sizeBytes: length, chunkSize: length };
    const result = await readAhead(target, parentCodec, one, 1)(0);
    if (!result?.ok) {
      throw new LatchError(
        `backup ${parent.name}: chunk ${index} (${hash}) is ${result?.problem ?? 'missing'} (${result?.detail ?? ''}); an ` +
          'incremental backup cannot build on it: run latch backup verify, and delete the damaged backup',
      );
    }
    return result.data;
  };

  return {
    sizeBytes,
    parent: parent?.name,
    bytesRead: () => read,
    cancel: options.cancel,
    async chunk(index, length, into): Promise<SourceChunk> {
      if (index !== nextIndex) throw new LatchError(`chunk ${index} asked for out of order (expected ${nextIndex})`);
      nextIndex++;
      const start = index * chunkSize;
      const end = start + length;
      const here: DiffRecord[] = [];
      for (let record = await pull(); record !== undefined; record = await pull()) {
        if (record.offset >= end) {
          pending = record;
          break;
        }
        if (recordEnd(record) > end) {
          pending = tailOf(record, end);
          here.push(headOf(record, end));
          break;
        }
        here.push(record);
      }
      const inParent = parent !== undefined && index < parent.chunks.length ? (parent.chunks[index] ?? null) : null;
      const parentLength = parent === undefined ? 0 : Math.max(0, chunkLength(parent.sizeBytes, chunkSize, index));
      if (here.length === 0) {
        if (inParent === null) return null;
        if (parentLength === length) return { carried: inParent };
      }
      // The base: the parent's bytes (zeros past its end, when the volume grew), or zeros.
      const buffer = into.subarray(0, length);
      buffer.fill(0);
      if (inParent !== null) (await parentBytes(index, inParent)).copy(buffer, 0, 0, Math.min(parentLength, length));
      for (const record of here) {
        if (record.kind === 'data') record.data.copy(buffer, record.offset - start);
        else buffer.fill(0, record.offset - start, recordEnd(record) - start);
      }
      return buffer;
    },
    async finish() {
      if (nextIndex * chunkSize < sizeBytes) throw new LatchError('the backup ended before the last chunk');
      if ((await pull()) !== undefined) throw new LatchError(`the diff goes on past the image's ${sizeBytes} bytes`);
      await options.finish();
    },
  };
}

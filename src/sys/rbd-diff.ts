// Ceph's rbd diff format, version 1, as `rbd export-diff` writes it (Ceph's docs: dev/rbd-diff): the header line
// `rbd diff v1\n`, then records, each a one-byte tag and little-endian integers:
//   f <u32 length><name>   the snapshot the diff starts from (absent: from the image's creation)
//   t <u32 length><name>   the snapshot it ends at
//   s <u64 size>           the image's size at that snapshot
//   w <u64 offset><u64 length><data>   bytes that changed (or, without a start, that are allocated)
//   z <u64 offset><u64 length>         a range that became zeros (discarded, or a removed object)
//   e                      the end
// The stream is read as it comes, data handed on in pieces of at most MAX_PIECE bytes, so that a diff of any size
// costs a bounded buffer. Nothing in it is taken on trust: offsets must lie within the size and grow, lengths are
// bounded, an unknown tag or a stream that ends before `e` is an error.
import { LatchError } from '../errors.js';

const HEADER = 'rbd diff v1\n';
/** The largest piece of a `w` record handed on at once. */
const MAX_PIECE = 1024 * 1024;
/** Snapshot names are short; a longer one is not a diff latch asked for. */
const MAX_NAME = 4096;

export type DiffRecord = { kind: 'data'; offset: number; data: Buffer } | { kind: 'zero'; offset: number; length: number };

export interface DiffStream {
  fromSnap?: string;
  toSnap?: string;
  sizeBytes: number;
  /** The extents, in order of offset, data in pieces; throws on anything that is not a well-formed diff. */
  records: AsyncGenerator<DiffRecord>;
}

/** Reads exact byte counts from a stream of buffers. */
class ByteReader {
  private readonly iterator: AsyncIterator<Buffer>;
  private buffered: Buffer[] = [];
  private length = 0;
  /** Bytes handed out so far (for error messages). */
  position = 0;

  constructor(stream: AsyncIterable<Buffer>) {
    this.iterator = stream[Symbol.asyncIterator]();
  }

  /** At least one byte and at most `max`, or undefined at the end of the stream. */
  async some(max: number): Promise<Buffer | undefined> {
    if (this.length === 0 && !(await this.fill())) return undefined;
    const first = this.buffered[0] as Buffer;
    const piece = first.length <= max ? first : first.subarray(0, max);
    if (piece === first) this.buffered.shift();
    else this.buffered[0] = first.subarray(max);
    this.length -= piece.length;
    this.position += piece.length;
    return piece;
  }

  /** Exactly `n` bytes (n small); throws at the end of the stream. */
  async exactly(n: number, what: string): Promise<Buffer> {
    while (this.length < n) {
      if (!(await this.fill())) throw new LatchError(`the rbd diff ends inside ${what} (at byte ${this.position + this.length})`);
    }
    const joined = this.buffered.length === 1 ? (this.buffered[0] as Buffer) : Buffer.concat(this.buffered);
    const out = joined.subarray(0, n);
    const rest = joined.subarray(n);
    this.buffered = rest.length > 0 ? [rest] : [];
    this.length -= n;
    this.position += n;
    return out;
  }

  private async fill(): Promise<boolean> {
    const next = await this.iterator.next();
    if (next.done) return false;
    const chunk = Buffer.isBuffer(next.value) ? next.value : Buffer.from(next.value);
    this.buffered.push(chunk);
    this.length += chunk.length;
    return true;
  }
}

function u64(bytes: Buffer, at: number, what: string): number {
  const value = bytes.readBigUInt64LE(at);
  if (value > BigInt(Number.MAX_SAFE_INTEGER)) throw new LatchError(`the rbd diff's ${what} ${value} is out of range`);
  return Number(value);
}

/** Reads the diff's header and metadata; its extents then come from `records`. */
export async function parseExportDiff(stream: AsyncIterable<Buffer>): Promise<DiffStream> {
  const reader = new ByteReader(stream);
  const header = (await reader.exactly(HEADER.length, 'its header')).toString('latin1');
  if (header !== HEADER) throw new LatchError(`not an rbd diff of version 1 (it starts ${JSON.stringify(header)})`);
  const meta: { fromSnap?: string; toSnap?: string; sizeBytes?: number } = {};
  let tag: string;
  for (;;) {
    tag = (await reader.exactly(1, 'a record tag')).toString('latin1');
    if (tag !== 'f' && tag !== 't' && tag !== 's') break;
    if (tag === 's') {
      meta.sizeBytes = u64(await reader.exactly(8, 'the size'), 0, 'size');
      continue;
    }
    const length = (await reader.exactly(4, 'a snapshot name')).readUInt32LE(0);
    if (length > MAX_NAME) throw new LatchError(`the rbd diff names a snapshot of ${length} bytes`);
    const name = (await reader.exactly(length, 'a snapshot name')).toString('utf8');
    if (tag === 'f') meta.fromSnap = name;
    else meta.toSnap = name;
  }
  const sizeBytes = meta.sizeBytes;
  if (sizeBytes === undefined) throw new LatchError('the rbd diff gives no image size before its extents');
  return { ...meta, sizeBytes, records: extents(reader, sizeBytes, tag) };
}

async function* extents(reader: ByteReader, sizeBytes: number, firstTag: string): AsyncGenerator<DiffRecord> {
  let tag = firstTag;
  let end = 0;
  for (;;) {
    if (tag === 'e') return;
    if (tag !== 'w' && tag !== 'z') throw new LatchError(`the rbd diff has a record of unknown type ${JSON.stringify(tag)}`);
    const fields = await reader.exactly(16, 'an extent');
    const offset = u64(fields, 0, 'offset');
    const length = u64(fields, 8, 'length');
    if (offset < end || offset + length > sizeBytes) {
      throw new LatchError(
        `the rbd diff has an extent at ${offset} of ${length} bytes, out of order or past the image's ${sizeBytes} bytes`,
      );
    }
    end = offset + length;
    if (tag === 'z') {
      if (length > 0) yield { kind: 'zero', offset, length };
    } else {
      for (let done = 0; done < length;) {
        const piece = await reader.some(Math.min(MAX_PIECE, length - done));
        if (piece === undefined) throw new LatchError(`the rbd diff ends inside the data of the extent at ${offset}`);
        yield { kind: 'data', offset: offset + done, data: piece };
        done += piece.length;
      }
    }
    tag = (await reader.exactly(1, 'a record tag')).toString('latin1');
  }
}

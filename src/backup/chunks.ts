// Chunks: fixed-size pieces of an image, named by their ID and stored compressed with brotli at quality 1 (and
// encrypted, with a key: codec.ts). Measured on a filesystem image of libraries and documents (4 MiB chunks, one
// core): brotli-1 gave a ratio of 2.70 at 155 MB/s, gzip-1 2.63 at 93 MB/s, gzip-6 2.84 at 41 MB/s, brotli-3 3.00 at
// 69 MB/s; Node 20 has no zstd. brotli-1 is faster than gzip at a better ratio, and compression runs on libuv's
// thread pool, so several chunks compress in parallel.
import { chunkKey, type BackupTarget } from './layout.js';
import type { ChunkCodec } from './codec.js';
import { storeOf } from './store.js';

export { sha256 } from './codec.js';

export const DEFAULT_CHUNK_SIZE = 4 * 1024 * 1024;
/**
 * The largest chunk a backup may have: a manifest that declares more is refused, so that the reads ahead of a restore
 * or verify (4 chunks decompressed at once) never hold more than 64 MiB whatever a target holds.
 */
export const MAX_CHUNK_SIZE = 16 * 1024 * 1024;

let zeros = Buffer.alloc(0);

/** Whether every byte is zero (a hole: recorded in the manifest, never stored). */
export function isAllZero(data: Buffer): boolean {
  if (zeros.length < data.length) zeros = Buffer.alloc(data.length);
  return data.equals(zeros.subarray(0, data.length));
}

export async function chunkExists(target: BackupTarget, id: string): Promise<boolean> {
  return (await storeOf(target)).exists(chunkKey(id));
}

/** How many chunk look-ups `missingChunk` keeps in flight: an object store answers each HEAD in a round trip. */
const LOOKUPS_IN_FLIGHT = 16;

/** How many objects one listing request names (S3 ListObjectsV2's page). */
const LISTING_PAGE = 1000;

/**
 * One of `ids` that the target lacks, or undefined when it holds them all, stopping at the first one missing: an
 * incremental backup checks every chunk of the backup it builds on this way, 256 of them per GiB of data. The IDs
 * are grouped by shard (`chunks/<first two hex digits>/`): a shard is listed when that takes fewer requests than a
 * look-up (an S3 HEAD) of each of its IDs, else they are looked up. A listing's requests are its pages of 1,000; the
 * first shard listed (the one with the most IDs) tells how many a shard holds, since IDs are hashes and spread evenly.
 * A 1 TiB volume's 262,144 chunks then take 256 listings of about 1,000 in a target of their own, not 262,144 HEADs.
 * LOOKUPS_IN_FLIGHT listings or look-ups at a time.
 */
export async function missingChunk(target: BackupTarget, ids: Iterable<string>): Promise<string | undefined> {
  const store = await storeOf(target);
  const byShard = new Map<string, string[]>();
  for (const id of new Set(ids)) {
    const key = chunkKey(id);
    const shard = key.slice(0, key.lastIndexOf('/') + 1);
    const sought = byShard.get(shard);
    if (sought) sought.push(id);
    else byShard.set(shard, [id]);
  }
  const shards = [...byShard].sort((a, b) => b[1].length - a[1].length);
  const listed = async (shard: string, sought: string[]) => {
    const held = new Set((await store.list(shard)).map((o) => o.key));
    return { pages: Math.max(1, Math.ceil(held.size / LISTING_PAGE)), missing: sought.find((id) => !held.has(chunkKey(id))) };
  };
  let pages = 1;
  const first = shards[0];
  if (first !== undefined && first[1].length > 1) {
    const found = await listed(...first);
    if (found.missing !== undefined) return found.missing;
    pages = found.pages;
    shards.shift();
  }
  // Each task answers for some IDs: a shard's listing for all of its own, a look-up for one.
  const tasks: (() => Promise<string | undefined>)[] = [];
  for (const [shard, sought] of shards) {
    if (sought.length > pages) tasks.push(async () => (await listed(shard, sought)).missing);
    else for (const id of sought) tasks.push(async () => ((await store.exists(chunkKey(id))) ? undefined : id));
  }
  let next = 0;
  let missing: string | undefined;
  const work = async () => {
    while (missing === undefined && next < tasks.length) {
      const found = await (tasks[next++] as () => Promise<string | undefined>)();
      missing ??= found;
    }
  };
  await Promise.all(Array.from({ length: Math.min(LOOKUPS_IN_FLIGHT, tasks.length) }, work));
  return missing;
}

/**
 * Stores a chunk under its ID, sealed by the codec (compressed, and encrypted with a key), whole or not at all. The
 * caller flushes the store before it publishes a manifest that needs it. Returns the bytes written.
 */
export async function storeChunk(target: BackupTarget, codec: ChunkCodec, id: string, data: Buffer): Promise<number> {
  const sealed = await codec.seal(id, data);
  await (await storeOf(target)).put(chunkKey(id), sealed);
  return sealed.length;
}

export type ChunkRead = { ok: true; data: Buffer } | { ok: false; problem: 'missing' | 'corrupt'; detail: string };

/**
 * Reads a chunk back and checks it (codec.ts). A chunk is read from a target that others may write, so nothing in it
 * is trusted: the object may be no larger than a chunk of its length is stored as, and it is decompressed into at
 * most that length (zlib's maxOutputLength stops the decompression there). A chunk that would inflate further (a
 * decompression bomb: 203 bytes of brotli make 256 MiB) is corrupt, and costs little more memory than an honest one.
 */
async function readChunk(target: BackupTarget, codec: ChunkCodec, id: string, expectedLength: number): Promise<ChunkRead> {
  const got = await (await storeOf(target)).get(chunkKey(id), codec.maxStoredLength(expectedLength));
  if (!got.found) return { ok: false, problem: 'missing', detail: 'the chunk is missing' };
  if ('tooLarge' in got) {
    return {
      ok: false,
      problem: 'corrupt',
      detail: `its file holds ${got.tooLarge} bytes, more than a chunk of ${expectedLength} bytes compresses to`,
    };
  }
  const opened = await codec.open(id, got.data, expectedLength);
  return opened.ok ? opened : { ok: false, problem: 'corrupt', detail: opened.detail };
}

/** An image's chunk list as a manifest holds it: each position's ID, or null for a hole. */
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
  codec: ChunkCodec,
  list: ChunkList,
  parallel: number,
  options: { repeatsOnce?: boolean } = {},
): (index: number) => Promise<ChunkRead> | undefined {
  const pending = new Map<number, Promise<ChunkRead>>();
  const scheduled = new Set<string>();
  let ahead = 0;
  return (index) => {
    for (; ahead < list.chunks.length && pending.size < parallel; ahead++) {
      const id = list.chunks[ahead];
      if (typeof id !== 'string' || (options.repeatsOnce && scheduled.has(id))) continue;
      scheduled.add(id);
      const read = readChunk(target, codec, id, chunkLength(list.sizeBytes, list.chunkSize, ahead));
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

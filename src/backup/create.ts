// Creating a backup: read the source chunk by chunk, hash each, store only the chunks the target does not have yet,
// then publish the manifest. Incremental by content: the target already holds every unchanged chunk, so a second
// backup moves only what changed (and chunks that other volumes already stored). Nothing tracks dirty blocks, so
// a backup from a file or device reads and hashes the whole source (except the holes of an image file, which it
// learns from the kernel and records without reading: extents.ts); only new chunks are compressed and written. A
// backup from a chunk source (delta.ts: the extents Ceph says changed since the previous backup's snapshot) reads
// only those, and carries the previous backup's other chunks over as they are. The next chunk is
// read while the current one is hashed, and compression runs on libuv's thread pool.
//
// Crash safety: chunks appear only complete (a directory's temp, fsync, rename; an S3 PUT, which stores an object
// whole or not at all); the manifest is written last, after the store is flushed (a directory's new chunk
// directories fsynced). A backup killed at any point has no manifest, so `list` never shows it; its stored chunks
// are reused by the next backup or removed by gc, and its temp files are removed by the next writer (all writers
// hold the target's lock).
//
// With a key, chunks are named by a keyed ID and encrypted (codec.ts), and the manifest is latch-backup/v3.
import { hostname } from 'node:os';
import { LatchError } from '../errors.js';
import { DEFAULT_CHUNK_SIZE, MAX_CHUNK_SIZE, chunkExists, chunkLength, isAllZero, missingChunk, storeChunk } from './chunks.js';
import { ENCRYPTION, codecForWriting, type ChunkCodec } from './codec.js';
import { dataRanges, overlapsData, type ByteRange } from './extents.js';
import { readExactly } from './files.js';
import { checkBackupName, describeTarget, type BackupTarget } from './layout.js';
import { backupKey, type BackupKey } from './keys.js';
import type { HeldLock, LockOptions } from './lock.js';
import { withTargetLock } from './target-lock.js';
import { checkTarget, storeOf } from './store.js';
import {
  ENCRYPTED_FORMAT,
  MANIFEST_FORMAT,
  chunkListDigest,
  listBackups,
  manifestExists,
  publishManifest,
  readCheckedManifest,
  type BackupStats,
  type Manifest,
} from './manifest.js';
import { openImage, type ChunkSource, type SourceChunk } from './source.js';

export interface CreateBackupOptions {
  target: BackupTarget;
  /**
   * A readable block device or image file holding the volume's bytes, ideally a snapshot (it must not change), or a
   * chunk source (delta.ts), which the backup lets go of (cancel) when it fails.
   */
  source: string | ChunkSource;
  volume: string;
  /** The backup's name; default `<volume>-<UTC date>-<time>`. */
  name?: string | undefined;
  /** What `source` is, in words, for the manifest (default: its path). */
  sourceDescription?: string | undefined;
  /** The filesystem the volume holds (the ledger's status.filesystem), for the manifest: a restore recreates it. */
  fsType?: string | undefined;
  /** The snapshot read, kept as the base of the volume's next backup (Manifest.baseSnapshot). */
  baseSnapshot?: { name: string; id: string } | undefined;
  /** This node's name, for the manifest and the target's lock. */
  node?: string | undefined;
  chunkSize?: number | undefined;
  /** Chunks compressed and written at once (default 4). */
  parallel?: number | undefined;
  /** Runs after every chunk is stored and before the manifest is published: throw to abandon (e.g. the source changed). */
  beforePublish?: (() => Promise<void>) | undefined;
  /** Called after each chunk is read (tests use it to interrupt a backup midway). */
  onChunk?: ((index: number, total: number) => void | Promise<void>) | undefined;
  lock?: LockOptions | undefined;
  /** The clock (ms since the epoch); default Date.now. */
  now?: (() => number) | undefined;
}

export async function createBackup(options: CreateBackupOptions): Promise<Manifest> {
  const { target, volume } = options;
  const now = options.now ?? Date.now;
  const createdAt = new Date(now()).toISOString();
  const name = checkBackupName(options.name ?? defaultBackupName(volume, createdAt));
  const chunkSize = options.chunkSize ?? DEFAULT_CHUNK_SIZE;
  if (!Number.isSafeInteger(chunkSize) || chunkSize < 4096 || chunkSize % 4096 !== 0 || chunkSize > MAX_CHUNK_SIZE) {
    throw new LatchError(`chunk size must be a positive multiple of 4096 bytes up to ${MAX_CHUNK_SIZE}, got ${chunkSize}`);
  }
  await checkTarget(target);
  // A key file that cannot be used fails the backup before it reads anything, not when it publishes.
  const key = await backupKey(target);
  const codec = codecForWriting(key, target.encrypt);
  const node = options.node;

  return withTargetLock(target, `backup ${name} of volume ${volume}`, { ...options.lock, node }, (lock) =>
    writeBackup(options, { name, chunkSize, createdAt, now, node, codec, key }, lock).catch((err: unknown) => {
      throw targetFault(target, err);
    }),
  );
}

/** A target that is full, read-only or not ours to write is the admin's to fix: say so, and that nothing was published. */
function targetFault(target: BackupTarget, err: unknown): unknown {
  const code = (err as NodeJS.ErrnoException).code;
  const what: Record<string, string> = {
    ENOSPC: 'is full',
    EDQUOT: 'is over its quota',
    EROFS: 'is read-only',
    EACCES: 'cannot be written by this process',
    EPERM: 'cannot be written by this process',
  };
  if (code === undefined || !(code in what)) return err;
  return new LatchError(
    `the backup target ${describeTarget(target)} ${what[code]} (${(err as Error).message}); the backup was abandoned and nothing was published`,
    { cause: err },
  );
}

async function writeBackup(
  options: CreateBackupOptions,
  settled: {
    name: string;
    chunkSize: number;
    createdAt: string;
    now: () => number;
    node: string | undefined;
    /** How chunks are named and sealed, and the key they and the manifest are under (undefined: none configured). */
    codec: ChunkCodec;
    key: BackupKey | undefined;
  },
  lock: HeldLock,
): Promise<Manifest> {
  const { target, volume } = options;
  const { name, chunkSize, createdAt, now, node, codec, key } = settled;
  const store = await storeOf(target);
  const chunkSource = typeof options.source === 'string' ? undefined : options.source;
  let opened;
  try {
    opened = typeof options.source === 'string' ? await openImage(options.source) : undefined;
  } catch (err) {
    chunkSource?.cancel();
    throw err;
  }
  const handle = opened?.handle;
  const sizeBytes = opened?.sizeBytes ?? chunkSource?.sizeBytes ?? 0;
  const isFile = opened?.isFile ?? false;
  const what = options.sourceDescription ?? (typeof options.source === 'string' ? options.source : 'a chunk source');
  const stats: BackupStats = { dataChunks: 0, holeChunks: 0, newChunks: 0, newBytesStored: 0, presentChunks: 0, dataBytes: 0 };
  const chunks: (string | null)[] = [];
  const seen = new Set<string>();
  const parallel = Math.max(1, options.parallel ?? 4);
  const inFlight = new Set<Promise<void>>();
  let failure: Error | undefined;
  let nextRead: Promise<SourceChunk> | undefined;
  let finished = false;
  let parent: string | undefined;
  let mapping: Promise<ByteRange[] | undefined> | undefined;
  try {
    // The hole map (a child process: tens of ms) is asked for while the target is tidied and listed. Undefined for a
    // block device, or when it cannot be had: then every chunk is read.
    mapping = isFile && typeof options.source === 'string' ? dataRanges(options.source, sizeBytes) : Promise.resolve(undefined);
    await store.tidy();
    if (await manifestExists(target, name)) throw new LatchError(`a backup named ${name} already exists in ${describeTarget(target)}`);
    parent = chunkSource ? chunkSource.parent : (await listBackups(target, volume)).filter((b) => b.manifest).at(-1)?.name;
    const stored = chunkSource ? undefined : await parentChunks(target, parent, codec);
    const ranges = await mapping;

    // Read buffers are reused once a chunk is hashed, or once its compression is done: a fresh 4 MiB buffer per chunk
    // made V8 collect garbage every few chunks (a fifth of a backup's main-thread time).
    const spare: Buffer[] = [];
    const release = (data: Buffer) => spare.push(Buffer.from(data.buffer, data.byteOffset, chunkSize));
    // A chunk in a hole reads as null without a read; any other is read (and checked for zeros: data can be zeros).
    const read = (index: number): Promise<SourceChunk> => {
      const length = chunkLength(sizeBytes, chunkSize, index);
      if (chunkSource) {
        const into = spare.pop() ?? Buffer.allocUnsafeSlow(chunkSize);
        const reading = chunkSource.chunk(index, length, into).then((chunk) => {
          if (!Buffer.isBuffer(chunk)) spare.push(into);
          return chunk;
        });
        reading.catch(() => undefined);
        return reading;
      }
      if (handle === undefined) throw new LatchError('no source to read');
      if (ranges !== undefined && !overlapsData(ranges, index * chunkSize, length)) return Promise.resolve(null);
      const reading = readExactly(handle, length, index * chunkSize, what, spare.pop() ?? Buffer.allocUnsafeSlow(chunkSize));
      // Its failure is thrown where it is awaited; until then it must not count as an unhandled rejection.
      reading.catch(() => undefined);
      return reading;
    };
    // A chunk the target may lack: looked for, then compressed and stored if absent. Off the loop, so that neither
    // the look-up nor the compression (both on the thread pool, behind one another) holds up reading and hashing.
    const storeIfNew = async (hash: string, data: Buffer): Promise<void> => {
      if (await chunkExists(target, hash)) {
        stats.presentChunks++;
        return;
      }
      stats.newChunks++;
      // Not `+= await`: that reads the total before the await and loses the other jobs' additions.
      const bytes = await storeChunk(target, codec, hash, data);
      stats.newBytesStored += bytes;
    };

    const total = Math.ceil(sizeBytes / chunkSize);
    nextRead = total > 0 ? read(0) : undefined;
    for (let index = 0; index < total; index++) {
      const length = chunkLength(sizeBytes, chunkSize, index);
      const data = await nextRead;
      // Read ahead: the next chunk comes from the thread pool while this one is hashed.
      nextRead = index + 1 < total ? read(index + 1) : undefined;
      if (data !== null && data !== undefined && !Buffer.isBuffer(data)) {
        // Carried over from the parent backup, unread: the target holds it (checked before the backup began).
        chunks.push(data.carried);
        stats.dataChunks++;
        stats.dataBytes += length;
        stats.presentChunks++;
      } else if (data === null || data === undefined || isAllZero(data)) {
        chunks.push(null);
        stats.holeChunks++;
        if (data) release(data);
      } else {
        const hash = codec.id(data);
        chunks.push(hash);
        stats.dataChunks++;
        stats.dataBytes += length;
        if (seen.has(hash) || stored?.has(hash)) {
          stats.presentChunks++;
          release(data);
          seen.add(hash);
        } else {
          seen.add(hash);
          // The buffer goes back only when the job is over: until then the compression may still be reading it.
          const job: Promise<void> = storeIfNew(hash, data).then(
            () => {
              release(data);
              inFlight.delete(job);
            },
            (err: unknown) => {
              failure ??= err instanceof Error ? err : new Error(String(err));
              inFlight.delete(job);
            },
          );
          inFlight.add(job);
          if (inFlight.size >= parallel) await Promise.race(inFlight);
        }
      }
      if (failure !== undefined) throw failure;
      await options.onChunk?.(index, total);
    }
    await Promise.all(inFlight);
    if (failure !== undefined) throw failure;
    await chunkSource?.finish();
    finished = true;
  } finally {
    if (!finished) chunkSource?.cancel();
    await Promise.allSettled([...inFlight, nextRead, mapping]);
    await handle?.close();
  }

  await store.flush();
  await options.beforePublish?.();
  await lock.check();
  const manifest: Manifest = {
    format: codec.encrypted ? ENCRYPTED_FORMAT : MANIFEST_FORMAT,
    name,
    volume,
    sizeBytes,
    chunkSize,
    compression: 'brotli',
    ...(codec.encrypted && { encryption: ENCRYPTION }),
    chunks,
    chunkListSha256: chunkListDigest(sizeBytes, chunkSize, chunks),
    createdAt,
    completedAt: new Date(now()).toISOString(),
    source: what,
    node: node ?? hostname(),
    ...(parent !== undefined && { parent }),
    ...(options.fsType !== undefined && { fsType: options.fsType }),
    ...(options.baseSnapshot !== undefined && { baseSnapshot: options.baseSnapshot }),
    stats,
  };
  await publishManifest(target, manifest, key);
  return manifest;
}

/** From how many chunks a parent's list stands for a look-up of each (parentChunks). */
const KNOWN_FROM = 1024;

/**
 * The chunk IDs of the volume's previous backup, when they can stand for a look-up of each: a parent of KNOWN_FROM
 * chunks or more (4 GiB of data), whose manifest checks (authenticated with a key), sealed as this backup seals (the
 * same bytes have the same ID), and all of whose chunks the target holds, found by listing its shards (missingChunk).
 * Then a chunk with one of those IDs is known stored, without a HEAD: a 1 TiB volume read whole makes 256 listings
 * instead of 262,144 look-ups. Otherwise undefined, and each chunk is looked up as before, which also stores again
 * one the target lost. The target's lock is held throughout, so nothing removes those chunks meanwhile.
 */
async function parentChunks(target: BackupTarget, parent: string | undefined, codec: ChunkCodec): Promise<Set<string> | undefined> {
  if (parent === undefined) return undefined;
  let checked;
  try {
    checked = await readCheckedManifest(target, parent);
  } catch {
    return undefined;
  }
  if (checked.codec.encrypted !== codec.encrypted) return undefined;
  const ids = new Set(checked.manifest.chunks.filter((c): c is string => c !== null));
  if (ids.size < KNOWN_FROM) return undefined;
  return (await missingChunk(target, ids)) === undefined ? ids : undefined;
}

/**
 * `<volume>-<yyyymmdd>-<hhmmss>-<milliseconds>` in UTC: sorts by time, fits the name rules, and two backups of one
 * volume asked for within the same second get names of their own.
 */
export function defaultBackupName(volume: string, createdAt: string): string {
  const compact = createdAt.replace(/[-:]/g, '').replace(/Z$/, '').replace('T', '-').replace('.', '-').toLowerCase();
  return `${volume.slice(0, 180)}-${compact}`;
}

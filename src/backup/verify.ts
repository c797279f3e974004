// Verifying a backup: every chunk it needs is read back, decompressed and hashed, and the image's checksum is
// recomputed from them (the chunk list's for a v2 manifest, the sha256 of every byte for a v1: manifest.ts). Reads
// only; it takes no lock.
import { chunkLength, readAhead } from './chunks.js';
import type { BackupTarget } from './layout.js';
import { imageCheck, readCheckedManifest, type CheckedManifest } from './manifest.js';
import { checkTarget } from './store.js';

export interface ChunkProblem {
  /** The chunk's position in the image (its byte offset is index × chunkSize). */
  index: number;
  hash: string;
  problem: 'missing' | 'corrupt';
  detail: string;
}

export interface VerifyReport {
  name: string;
  volume: string;
  ok: boolean;
  /** The chunk files read back: each distinct chunk once (a v1 backup's at each of its positions). */
  chunksChecked: number;
  problems: ChunkProblem[];
  /** Whether the chunks put together match the manifest's image checksum (undefined when chunks are unusable). */
  imageChecksumMatches: boolean | undefined;
  /**
   * Whether the configured key authenticated the manifest. false: its checksum is unkeyed, so the backup is intact but
   * anyone who could write the target could have made it (only without a key configured: with one, it is refused).
   */
  authenticated: boolean;
  /** Whether its chunks are encrypted (false: made without a key, or before encryption). */
  encrypted: boolean;
}

export interface VerifyOptions {
  target: BackupTarget;
  name: string;
  /** Chunks read and decompressed at once (default 4). */
  parallel?: number | undefined;
}

export async function verifyBackup(options: VerifyOptions): Promise<VerifyReport> {
  const { target, name } = options;
  await checkTarget(target);
  const checked = await readCheckedManifest(target, name);
  return verifyManifest(target, checked, options.parallel);
}

/** Verifies the backup of a manifest already read (`latch backup authenticate` signs the very manifest it checked). */
export async function verifyManifest(
  target: BackupTarget,
  { manifest, authenticated, codec }: CheckedManifest,
  parallelOption?: number,
): Promise<VerifyReport> {
  const { name, chunks, sizeBytes, chunkSize } = manifest;
  const check = imageCheck(manifest);
  const parallel = Math.max(1, parallelOption ?? 4);

  // A chunk that appears at several positions is read once, unless the image check needs its bytes at each (v1).
  const take = readAhead(target, codec, manifest, parallel, { repeatsOnce: !check.needsBytes });

  const problems: ChunkProblem[] = [];
  const damaged = new Map<string, ChunkProblem>();
  let checked = 0;
  for (const [index, hash] of chunks.entries()) {
    const length = chunkLength(sizeBytes, chunkSize, index);
    if (hash === null) {
      check.add(null, length);
      continue;
    }
    const pending = take(index);
    if (pending === undefined) {
      // A repeat of a chunk read at an earlier position, which this loop has already checked (only where the check
      // goes by hashes, so its bytes need not be passed).
      const earlier = damaged.get(hash);
      if (earlier) problems.push({ ...earlier, index });
      else check.add(hash, length);
      continue;
    }
    const read = await pending;
    checked++;
    if (read.ok) {
      check.add(hash, read.data);
    } else {
      const problem: ChunkProblem = { index, hash, problem: read.problem, detail: read.detail };
      problems.push(problem);
      damaged.set(hash, problem);
    }
  }
  const imageChecksumMatches = problems.length === 0 ? check.matches() : undefined;
  return {
    name,
    volume: manifest.volume,
    ok: problems.length === 0 && imageChecksumMatches === true,
    chunksChecked: checked,
    problems,
    imageChecksumMatches,
    authenticated,
    encrypted: codec.encrypted,
  };
}

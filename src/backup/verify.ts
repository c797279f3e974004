// Verifying a backup: every chunk it needs is read back, decompressed and hashed, and the image's checksum is
// recomputed from them (the chunk list's for a v2 manifest, the sha256 of every byte for a v1: manifest.ts). Reads
// only; it takes no lock.
import { chunkLength, readChunk } from './chunks.js';
import { checkTarget, type BackupTarget } from './layout.js';
import { imageCheck, readManifest } from './manifest.js';

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
  chunksChecked: number;
  problems: ChunkProblem[];
  /** Whether the chunks put together match the manifest's image checksum (undefined when chunks are unusable). */
  imageChecksumMatches: boolean | undefined;
}

export async function verifyBackup(options: { target: BackupTarget; name: string }): Promise<VerifyReport> {
  const { target, name } = options;
  await checkTarget(target);
  const manifest = await readManifest(target, name);
  const check = imageCheck(manifest);
  const problems: ChunkProblem[] = [];
  const known = new Map<string, ChunkProblem | undefined>();
  let checked = 0;
  for (const [index, hash] of manifest.chunks.entries()) {
    const length = chunkLength(manifest.sizeBytes, manifest.chunkSize, index);
    if (hash === null) {
      check.add(null, length);
      continue;
    }
    const earlier = known.get(hash);
    if (earlier) {
      problems.push({ ...earlier, index });
      continue;
    }
    const read = await readChunk(target, hash, length);
    checked++;
    if (read.ok) {
      check.add(hash, read.data);
      known.set(hash, undefined);
    } else {
      const problem: ChunkProblem = { index, hash, problem: read.problem, detail: read.detail };
      problems.push(problem);
      known.set(hash, problem);
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
  };
}

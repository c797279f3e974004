// A backup's image as a stream of bytes, for a restore that does not write an image (a shared volume's files,
// node/shared-files.ts). Each data chunk is checked against its ID as it is read (readAhead), a hole gives zeros, and
// after the last chunk the chunk list is checked against the manifest: a damaged backup throws, naming the chunk.
// The consumer must treat whatever it made before a throw as incomplete.
import { LatchError } from '../errors.js';
import { chunkLength, readAhead } from './chunks.js';
import type { BackupTarget } from './layout.js';
import { imageCheck, readCheckedManifest, type CheckedManifest } from './manifest.js';
import { checkTarget } from './store.js';

export interface BackupStream extends CheckedManifest {
  /** The image, chunk by chunk (holes as zeros). */
  bytes: AsyncGenerator<Buffer>;
}

/** Opens backup `name` of `target` for reading as a stream (the manifest checked, and authenticated with a key). */
export async function openBackupStream(target: BackupTarget, name: string, signal?: AbortSignal): Promise<BackupStream> {
  await checkTarget(target);
  const checked = await readCheckedManifest(target, name);
  const { manifest, codec } = checked;
  async function* bytes(): AsyncGenerator<Buffer> {
    const check = imageCheck(manifest);
    const take = readAhead(target, codec, manifest, 4);
    for (let index = 0; index < manifest.chunks.length; index++) {
      signal?.throwIfAborted();
      const length = chunkLength(manifest.sizeBytes, manifest.chunkSize, index);
      const hash = manifest.chunks[index];
      if (hash === null || hash === undefined) {
        const zeros = Buffer.alloc(length);
        check.add(null, length);
        yield zeros;
        continue;
      }
      const read = await take(index);
      if (!read?.ok) {
        throw new LatchError(`backup ${name}: chunk ${index} (${hash}) is ${read?.problem ?? 'missing'} (${read?.detail ?? ''})`);
      }
      check.add(hash, read.data);
      yield read.data.subarray(0, length);
    }
    if (!check.matches()) throw new LatchError(`backup ${name}: the image read does not match the manifest's checksum`);
  }
  return { ...checked, bytes: bytes() };
}

// A backup's manifest: everything needed to restore it, and a checksum of itself so that a damaged manifest is
// reported as damaged rather than restored wrong. Written last, atomically: a backup without one does not exist.
//
// Two formats. latch-backup/v1 carried `imageSha256`, the sha256 of the whole image, holes included: every backup,
// verify and restore hashed every byte of the image a second time (holes too), which cost 0.7 s per GiB on an idle
// core of the bench machine and nearly 2 s under load, and made a backup several times slower than a copy. latch-backup/v2 (written since) carries
// `chunkListSha256` instead: the sha256 of the ordered chunk list (`chunkListDigest`), computed without touching
// the image's bytes again. It protects the image as well: each chunk is read back and checked against its sha256,
// the list fixes which chunk goes where (and the manifest's own checksum covers the list), so chunks that hash
// right, put in the listed order, are the image that was read. v1 manifests are still read, verified (whole-image
// sha256) and restored.
//
// Authentication. With a key configured (backupTarget.keyFile: keys.ts), a manifest carries `hmacSha256`, an
// HMAC-SHA256 of its body under that key, and `keyId`, instead of the unkeyed `checksum`: whoever can write the
// target but lacks the key cannot write a manifest latch accepts, so cannot make a restore put another volume's data
// (or their own) onto a volume. A manifest with only a `checksum` (all of them before keys, and those written with
// no key configured) is unauthenticated: anyone who can write the target can have written it. Without a key
// configured, such manifests are used and reported as unauthenticated. With a key configured, they are listed as
// unauthenticated but refused by verify and restore: otherwise dropping the HMAC would be all a forger needs. A
// backup made before the key that the admin trusts is signed once, explicitly (`latch backup authenticate`).
//
// Encryption. latch-backup/v3 (written with a key, unless backupTarget.encrypt is false) is v2 with encrypted chunks:
// `encryption` names the scheme (codec.ts: AES-256-GCM chunks, HMAC-SHA256 chunk IDs, subkeys by HKDF-SHA256), its
// chunk list holds the chunks' keyed IDs, and its HMAC is under the derived manifest key (keys.ts). A v3 manifest is
// authenticated like v2 (one with only an unkeyed checksum is refused by restore and verify, since they need the key
// to decrypt anyway). v1 and v2 backups stay readable, and are reported as not
// encrypted. A latch from before v3 refuses a v3 manifest as of an unknown format rather than restoring ciphertext.
import { createHash } from 'node:crypto';
import { open } from 'node:fs/promises';
import { isDeepStrictEqual } from 'node:util';
import { LatchError } from '../errors.js';
import { DEFAULT_CHUNK_SIZE, MAX_CHUNK_SIZE, chunkLength, isAllZero, sha256 } from './chunks.js';
import { ENCRYPTION, codecForReading, type ChunkCodec, type EncryptionScheme } from './codec.js';
import { backupKey, macMatches, manifestMac, type BackupKey } from './keys.js';
import { readExactly } from './files.js';
import { BACKUPS, MANIFEST_SUFFIX, checkBackupName, describeTarget, isChunkHash, manifestKey, type BackupTarget } from './layout.js';
import { storeOf } from './store.js';

/** The format new unencrypted backups are written in. */
export const MANIFEST_FORMAT = 'latch-backup/v2';
/** The format of encrypted backups. */
export const ENCRYPTED_FORMAT = 'latch-backup/v3';
const FORMATS = ['latch-backup/v1', MANIFEST_FORMAT, ENCRYPTED_FORMAT] as const;
/** A manifest larger than this is not one latch wrote (a 16 TiB volume's, in 4 MiB chunks, is about 270 MB). */
const MAX_MANIFEST_BYTES = 512 * 1024 * 1024;

export interface BackupStats {
  /** Chunks with data / all-zero chunks (holes: recorded, not stored). */
  dataChunks: number;
  holeChunks: number;
  /** Data chunks this backup stored, and the bytes it wrote for them (compressed). */
  newChunks: number;
  newBytesStored: number;
  /** Data chunks already in the target (from earlier backups, other volumes, or earlier in this one). */
  presentChunks: number;
  /** Bytes of the source that are not holes. */
  dataBytes: number;
}

export interface Manifest {
  format: (typeof FORMATS)[number];
  name: string;
  volume: string;
  sizeBytes: number;
  chunkSize: number;
  /** How chunk files are compressed. */
  compression: 'brotli';
  /** v3: how its chunks are encrypted and named (codec.ts). */
  encryption?: EncryptionScheme;
  /**
   * Each chunk's ID in order (the sha256 of its uncompressed bytes; v3: their HMAC under the chunk-ID key); null for
   * an all-zero chunk (a hole).
   */
  chunks: (string | null)[];
  /** v2, v3: the sha256 of the chunk list (chunkListDigest): what restore and verify check the chunks they read against. */
  chunkListSha256?: string;
  /** v1 only: the sha256 of the whole image, holes included. */
  imageSha256?: string;
  createdAt: string;
  completedAt: string;
  /** What was read: an image file, a snapshot or a device, in words. */
  source: string;
  node?: string;
  /** The volume's previous complete backup in this target, when there was one. */
  parent?: string;
  /**
   * The snapshot it was read from and that the volume keeps as the base of its next backup (node/backup.ts), by name
   * and by the storage's own ID: the next backup is built on this one only while that very snapshot is there.
   */
  baseSnapshot?: { name: string; id: string };
  /** The filesystem the volume held, when the caller knew it: `latch volume restore` creates the new volume with it. */
  fsType?: string;
  stats: BackupStats;
}

/**
 * Writes the manifest, which makes the backup exist (or replaces it: `latch backup authenticate`); authenticated with
 * the target's key when one is configured. Refusing a name that is taken is the caller's (it holds the lock).
 */
export async function publishManifest(target: BackupTarget, manifest: Manifest, keyUsed?: BackupKey): Promise<void> {
  const body = JSON.stringify(manifest);
  // A backup's chunks and its manifest under the same key, even if the key file was replaced while it ran.
  const key = keyUsed ?? (await backupKey(target));
  if (manifest.format === ENCRYPTED_FORMAT && !key) throw new LatchError('an encrypted backup needs the backup key (backupTarget.keyFile)');
  const envelope = key
    ? { ...manifest, keyId: key.id, hmacSha256: manifestMac(key, body, manifest.format === ENCRYPTED_FORMAT) }
    : { ...manifest, checksum: createHash('sha256').update(body).digest('hex') };
  await (await storeOf(target)).put(manifestKey(manifest.name), `${JSON.stringify(envelope)}\n`);
}

/** Whether a manifest of that name exists (complete or not readable). */
export async function manifestExists(target: BackupTarget, name: string): Promise<boolean> {
  return (await storeOf(target)).exists(manifestKey(name));
}

interface ReadManifestOptions {
  /**
   * Accept an unauthenticated manifest although a key is configured (list, and `latch backup authenticate`, which
   * checks the backup whole before it signs it). Never for a restore.
   */
  allowUnauthenticated?: boolean | undefined;
}

/** A manifest as read, and whether the configured key authenticated it (false: its checksum is unkeyed). */
export interface CheckedManifest {
  manifest: Manifest;
  authenticated: boolean;
  /** How its chunks are read back (plain, or decrypted with the configured key). */
  codec: ChunkCodec;
}

/**
 * Reads and checks a manifest: a missing backup, a damaged manifest, one the configured key does not authenticate,
 * and (unless allowed) an unauthenticated one when a key is configured are errors that say which.
 */
export async function readManifest(target: BackupTarget, name: string): Promise<Manifest> {
  return (await readCheckedManifest(target, name)).manifest;
}

export async function readCheckedManifest(target: BackupTarget, name: string, options: ReadManifestOptions = {}): Promise<CheckedManifest> {
  // First: a key file that cannot be used is the error, whatever the manifest holds.
  return readManifestWith(await backupKey(target), target, name, options);
}

async function readManifestWith(
  key: BackupKey | undefined,
  target: BackupTarget,
  name: string,
  options: ReadManifestOptions,
): Promise<CheckedManifest> {
  const path = `${manifestKey(name)} in ${describeTarget(target)}`;
  const got = await (await storeOf(target)).get(manifestKey(name), MAX_MANIFEST_BYTES);
  if (!got.found) throw new LatchError(`backup ${name} does not exist in ${describeTarget(target)} (latch backup list shows the backups)`);
  if ('tooLarge' in got) {
    throw new LatchError(`the manifest of backup ${name} (${path}) is corrupted: it holds ${got.tooLarge} bytes, more than a manifest`);
  }
  const checked = parseManifest(key, got.data.toString('utf8'), name, path);
  if (!checked.authenticated && key !== undefined && !options.allowUnauthenticated) {
    throw new LatchError(
      `the manifest of backup ${name} (${path}) is not authenticated (it has only an unkeyed checksum, which anyone who can ` +
        `write the target can forge), and a backup key is configured, so it is refused. If it was made before the key and ` +
        `the target was never open to others, sign it once: latch backup authenticate ${name}`,
    );
  }
  return checked;
}

function parseManifest(key: BackupKey | undefined, text: string, name: string, path: string): CheckedManifest {
  const corrupt = (why: string) =>
    new LatchError(`the manifest of backup ${name} (${path}) is corrupted: ${why}; this backup cannot be used`);
  let parsed: Record<string, unknown>;
  try {
    parsed = JSON.parse(text) as Record<string, unknown>;
  } catch {
    throw corrupt('it is not JSON');
  }
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) throw corrupt('it is not a JSON object');
  const { checksum, hmacSha256, keyId, ...rest } = parsed;
  const body = JSON.stringify(rest);
  let authenticated: boolean;
  if (hmacSha256 !== undefined) {
    if (checksum !== undefined) throw corrupt('it has both a checksum and an authentication code');
    if (!key) {
      throw new LatchError(
        `the manifest of backup ${name} (${path}) is authenticated with a key, and no backup key is configured here ` +
          '(backupTarget.keyFile): it cannot be checked, so it is not used',
      );
    }
    if (!macMatches(manifestMac(key, body, rest.format === ENCRYPTED_FORMAT), hmacSha256)) {
      const other =
        typeof keyId === 'string' && /^[0-9a-f]{16}$/.test(keyId) && keyId !== key.id
          ? ` (it names key ${keyId}, the configured key is ${key.id})`
          : '';
      throw new LatchError(
        `the manifest of backup ${name} (${path}) is not authentic: its authentication code does not match the configured ` +
          `key${other}; it was changed or written by someone without the key, and is not used`,
      );
    }
    authenticated = true;
  } else {
    if (createHash('sha256').update(body).digest('hex') !== checksum) throw corrupt('its checksum does not match');
    authenticated = false;
  }
  const m = rest as unknown as Manifest;
  if (!FORMATS.includes(m.format)) throw corrupt(`unknown format ${JSON.stringify(m.format)}`);
  if (m.format === ENCRYPTED_FORMAT ? !isDeepStrictEqual(m.encryption, ENCRYPTION) : m.encryption !== undefined) {
    throw corrupt(`unknown encryption ${JSON.stringify(m.encryption)}`);
  }
  if (m.name !== name) throw corrupt(`it names itself ${JSON.stringify(m.name)}`);
  if (
    !Number.isSafeInteger(m.sizeBytes) ||
    m.sizeBytes < 0 ||
    !Number.isSafeInteger(m.chunkSize) ||
    m.chunkSize < 1 ||
    m.chunkSize > MAX_CHUNK_SIZE
  ) {
    throw corrupt('bad size or chunk size');
  }
  if (!Array.isArray(m.chunks) || m.chunks.length !== Math.ceil(m.sizeBytes / m.chunkSize)) throw corrupt('wrong number of chunks');
  if (!m.chunks.every((c) => c === null || isChunkHash(c))) throw corrupt('a chunk entry is not a sha256');
  const checksumField = m.format === 'latch-backup/v1' ? m.imageSha256 : m.chunkListSha256;
  if (typeof checksumField !== 'string' || !/^[0-9a-f]{64}$/.test(checksumField)) throw corrupt('no image checksum');
  if (m.compression !== 'brotli') throw corrupt(`unknown compression ${JSON.stringify(m.compression)}`);
  if (m.fsType !== undefined && (typeof m.fsType !== 'string' || !/^[a-z0-9]{1,16}$/.test(m.fsType))) throw corrupt('bad fsType');
  if (m.baseSnapshot !== undefined && !isSnapshotRef(m.baseSnapshot)) throw corrupt('bad baseSnapshot');
  if (m.encryption !== undefined && key === undefined) {
    throw new LatchError(
      `backup ${name} (${path}) is encrypted, and no backup key is configured here (backupTarget.keyFile): it cannot be read without the key it was made with`,
    );
  }
  return { manifest: m, authenticated, codec: codecForReading(key, m.encryption) };
}

/** A manifest's baseSnapshot as the backups that build on it compare it: two short strings, and nothing else. */
function isSnapshotRef(value: unknown): value is { name: string; id: string } {
  if (value === null || typeof value !== 'object' || Array.isArray(value)) return false;
  const { name, id, ...other } = value as Record<string, unknown>;
  return (
    Object.keys(other).length === 0 &&
    typeof name === 'string' &&
    name.length > 0 &&
    name.length <= 250 &&
    typeof id === 'string' &&
    /^[0-9a-z@._:-]{1,130}$/.test(id)
  );
}

/**
 * The image checksum of a v2 manifest: the sha256 of `latch-chunk-list/v1 <sizeBytes> <chunkSize>` and then one
 * line per chunk in order, its sha256 or `hole`, each line ending in a newline. Restore and verify recompute it from
 * the hashes of the chunks they read back and checked, in the order they put them.
 */
export function chunkListDigest(sizeBytes: number, chunkSize: number, chunks: readonly (string | null)[]): string {
  const hash = createHash('sha256').update(`latch-chunk-list/v1 ${sizeBytes} ${chunkSize}\n`);
  for (const chunk of chunks) hash.update(`${chunk ?? 'hole'}\n`);
  return hash.digest('hex');
}

/**
 * The chunkListSha256 a backup of the image file at `path` would carry, from its bytes: what a caller compares a
 * manifest with to know that the backup holds that image (as it once compared imageSha256 with the file's sha256).
 */
export async function chunkListSha256OfImage(path: string, chunkSize = DEFAULT_CHUNK_SIZE): Promise<string> {
  const handle = await open(path, 'r');
  try {
    const { size } = await handle.stat();
    const chunks: (string | null)[] = [];
    for (let index = 0; index * chunkSize < size; index++) {
      const data = await readExactly(handle, chunkLength(size, chunkSize, index), index * chunkSize, path);
      chunks.push(isAllZero(data) ? null : sha256(data));
    }
    return chunkListDigest(size, chunkSize, chunks);
  } finally {
    await handle.close();
  }
}

/**
 * How restore and verify check the image they put together from a manifest's chunks: v2 by the chunk list (each
 * chunk's sha256 as read back, or its hole, in order), v1 by the sha256 of every byte (holes as zeros).
 */
export interface ImageCheck {
  /** The next chunk in order: its sha256 and bytes as read back and checked, or null and its length for a hole. */
  add(hash: string | null, data: Buffer | number): void;
  matches(): boolean;
  /** Whether `add` uses a chunk's bytes (v1), or its hash alone (v2: a chunk seen before need not be read again). */
  readonly needsBytes: boolean;
}

export function imageCheck(manifest: Manifest): ImageCheck {
  if (manifest.format !== 'latch-backup/v1') {
    const seen: (string | null)[] = [];
    return {
      add: (hash) => seen.push(hash),
      matches: () => chunkListDigest(manifest.sizeBytes, manifest.chunkSize, seen) === manifest.chunkListSha256,
      needsBytes: false,
    };
  }
  const whole = createHash('sha256');
  let zeros = Buffer.alloc(0);
  return {
    add: (_hash, data) => {
      if (typeof data !== 'number') {
        whole.update(data);
        return;
      }
      if (zeros.length < data) zeros = Buffer.alloc(data);
      whole.update(zeros.subarray(0, data));
    },
    matches: () => whole.digest('hex') === manifest.imageSha256,
    needsBytes: true,
  };
}

/** A manifest as a listing keeps it: without its chunk list (17 MB for a 1 TiB volume), which the one that needs it reads. */
export type ManifestSummary = Omit<Manifest, 'chunks'>;

export interface ListedBackup {
  name: string;
  manifest?: ManifestSummary;
  /** With a manifest: whether the configured key authenticated it (false: an unkeyed checksum only). */
  authenticated?: boolean;
  /** Why the manifest cannot be used, when it cannot. */
  error?: string;
}

/** How many manifests a listing reads at once: each is a round trip to an object store. */
const MANIFEST_READS_IN_FLIGHT = 4;

/**
 * Every complete backup in the target (optionally of one volume), oldest first; damaged manifests with their error.
 * Each manifest is read and checked whole, MANIFEST_READS_IN_FLIGHT at a time, and kept without its chunk list, so
 * that a listing's memory grows with the number of backups, not with their volumes' sizes. `onChunks` sees each
 * checked manifest's chunk list before it is dropped (garbage collection gathers what is needed that way).
 */
export async function listBackups(
  target: BackupTarget,
  volume?: string,
  onChunks?: (chunks: readonly (string | null)[]) => void,
): Promise<ListedBackup[]> {
  // Read once: a key file that cannot be used fails the listing, rather than every manifest in it.
  const key = await backupKey(target);
  const names: string[] = [];
  for (const { key: objectKey } of await (await storeOf(target)).list(BACKUPS)) {
    const file = objectKey.slice(BACKUPS.length);
    if (!file.endsWith(MANIFEST_SUFFIX) || file.startsWith('.') || file.includes('/')) continue;
    names.push(file.slice(0, -MANIFEST_SUFFIX.length));
  }
  const listed: ListedBackup[] = [];
  let next = 0;
  const read = async () => {
    while (next < names.length) {
      const name = names[next++] as string;
      try {
        checkBackupName(name);
        const { manifest, authenticated } = await readManifestWith(key, target, name, { allowUnauthenticated: true });
        const { chunks, ...summary } = manifest;
        onChunks?.(chunks);
        listed.push({ name, manifest: summary, authenticated });
      } catch (err) {
        if (err instanceof LatchError) listed.push({ name, error: err.message });
        else throw err;
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(MANIFEST_READS_IN_FLIGHT, names.length) }, read));
  const filtered = volume === undefined ? listed : listed.filter((b) => b.manifest === undefined || b.manifest.volume === volume);
  return filtered.sort((a, b) => (a.manifest?.createdAt ?? '').localeCompare(b.manifest?.createdAt ?? '') || a.name.localeCompare(b.name));
}

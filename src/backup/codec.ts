// How a chunk is named and what its stored bytes are, in the two schemes a manifest can name:
//
//   plain (latch-backup/v1, v2)  ID = sha256(bytes); stored = brotli(bytes). Anyone who can read the target reads the
//                                data, and can tell which chunks hold known contents.
//   aes-256-gcm (latch-backup/v3, with a key: keys.ts)
//                                ID = HMAC-SHA256(chunk-ID key, bytes): the same bytes get the same ID under one key,
//                                so dedup works across volumes and backups of that key, and the store learns nothing
//                                from IDs (no hash of known contents to compare with).
//                                stored = 0x01 | nonce (12 random bytes) | AES-256-GCM(chunk key, brotli(bytes),
//                                additional data = the ID) | tag (16 bytes). Compressed before it is encrypted
//                                (ciphertext does not compress). The ID as additional data binds the stored bytes to
//                                their name: a chunk copied under another ID fails authentication.
//
// Nonces: a fresh random 96-bit nonce for every chunk written, never a counter (writers on many nodes share the key
// and keep no state). A nonce is never reused in practice: two of them collide with a probability near n²/2⁹⁷ after n
// chunks (under 2⁻³² after 2³² chunks, 16 PiB at 4 MiB), which is NIST's bound for random GCM nonces per key.
//
// Reading back checks everything before it returns data: GCM's tag (tampering, truncation, a wrong key), the
// decompressed length (at most the chunk's: zlib stops there, so a decompression bomb costs nothing), and the ID
// recomputed from the bytes. A chunk that fails any of these is corrupt; never wrong data.
import { createCipheriv, createDecipheriv, createHash, createHmac, randomBytes } from 'node:crypto';
import { promisify } from 'node:util';
import { brotliCompress, brotliDecompress, constants as zlibConstants } from 'node:zlib';
import type { BackupKey } from './keys.js';

/** What a v3 manifest records of its scheme (manifest.ts): anything else is refused. */
export const ENCRYPTION = { cipher: 'aes-256-gcm', kdf: 'hkdf-sha256', chunkIds: 'hmac-sha256' } as const;
export type EncryptionScheme = typeof ENCRYPTION;

const VERSION = 0x01;
const NONCE_BYTES = 12;
const TAG_BYTES = 16;
/** What encryption adds to a chunk's compressed bytes. */
export const SEAL_OVERHEAD = 1 + NONCE_BYTES + TAG_BYTES;

const compress = promisify(brotliCompress);
const decompress = promisify(brotliDecompress);

export type Opened = { ok: true; data: Buffer } | { ok: false; detail: string };

export interface ChunkCodec {
  readonly encrypted: boolean;
  /** The chunk's ID (its name in the target) from its bytes. */
  id(data: Buffer): string;
  /** The bytes to store for a chunk. */
  seal(id: string, data: Buffer): Promise<Buffer>;
  /** The chunk's bytes from what was stored, checked (see above); `length` is what the manifest says it holds. */
  open(id: string, stored: Buffer, length: number): Promise<Opened>;
  /** The largest stored object a chunk of `length` bytes can be: anything larger is not a chunk latch wrote. */
  maxStoredLength(length: number): number;
}

export function sha256(data: Uint8Array): string {
  return createHash('sha256').update(data).digest('hex');
}

async function pack(data: Buffer): Promise<Buffer> {
  return compress(data, {
    // Output in 1 MiB pieces rather than zlib's 16 KiB: each piece is a round trip between the thread pool and the
    // main thread (a 4 MiB chunk compressed to 600 KiB took 40).
    chunkSize: Math.min(Math.max(data.length, 64), 1024 * 1024),
    params: { [zlibConstants.BROTLI_PARAM_QUALITY]: 1, [zlibConstants.BROTLI_PARAM_SIZE_HINT]: data.length },
  });
}

async function unpack(packed: Buffer, length: number): Promise<Opened> {
  let data: Buffer;
  try {
    // The output in one buffer of the chunk's length (not 16 KiB pieces joined on the main thread), and never more.
    data = await decompress(packed, { chunkSize: Math.max(length, 64), maxOutputLength: Math.max(length, 1) });
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ERR_BUFFER_TOO_LARGE') {
      return { ok: false, detail: `it inflates past its ${length} bytes (a decompression bomb?)` };
    }
    return { ok: false, detail: 'it does not decompress' };
  }
  if (data.length !== length) return { ok: false, detail: `it holds ${data.length} bytes, not ${length}` };
  return { ok: true, data };
}

/**
 * More bytes than brotli makes of `length` bytes: what it cannot compress it stores in meta-blocks of a few bytes of
 * header each (random data measured: 4 bytes more for 64 KiB, 5 for 4 MiB, 17 for 16 MiB).
 */
function maxPackedLength(length: number): number {
  return length + (length >> 6) + 1024;
}

const plainCodec: ChunkCodec = {
  encrypted: false,
  id: sha256,
  seal: (_id, data) => pack(data),
  async open(id, stored, length) {
    const opened = await unpack(stored, length);
    if (opened.ok && sha256(opened.data) !== id) return { ok: false, detail: 'its bytes do not match its sha256' };
    return opened;
  },
  maxStoredLength: maxPackedLength,
};

function encryptedCodec(key: BackupKey): ChunkCodec {
  const id = (data: Buffer) => createHmac('sha256', key.chunkId).update(data).digest('hex');
  return {
    encrypted: true,
    id,
    async seal(chunkId, data) {
      const packed = await pack(data);
      const nonce = randomBytes(NONCE_BYTES);
      const cipher = createCipheriv('aes-256-gcm', key.chunkCipher, nonce, { authTagLength: TAG_BYTES });
      cipher.setAAD(Buffer.from(chunkId, 'ascii'));
      return Buffer.concat([Buffer.of(VERSION), nonce, cipher.update(packed), cipher.final(), cipher.getAuthTag()]);
    },
    async open(chunkId, stored, length) {
      if (stored.length < SEAL_OVERHEAD) return { ok: false, detail: `it holds ${stored.length} bytes, too few for an encrypted chunk` };
      if (stored[0] !== VERSION) return { ok: false, detail: `it is not an encrypted chunk of a version latch knows (${stored[0]})` };
      const nonce = stored.subarray(1, 1 + NONCE_BYTES);
      const tag = stored.subarray(stored.length - TAG_BYTES);
      const decipher = createDecipheriv('aes-256-gcm', key.chunkCipher, nonce, { authTagLength: TAG_BYTES });
      decipher.setAAD(Buffer.from(chunkId, 'ascii'));
      decipher.setAuthTag(tag);
      let packed: Buffer;
      try {
        packed = Buffer.concat([decipher.update(stored.subarray(1 + NONCE_BYTES, stored.length - TAG_BYTES)), decipher.final()]);
      } catch {
        return {
          ok: false,
          detail: 'it fails authentication (AES-256-GCM): it was changed or truncated, or encrypted under another key',
        };
      }
      const opened = await unpack(packed, length);
      if (opened.ok && id(opened.data) !== chunkId) return { ok: false, detail: 'its bytes do not match its ID' };
      return opened;
    },
    maxStoredLength: (length) => maxPackedLength(length) + SEAL_OVERHEAD,
  };
}

/** The codec of new backups: encrypted when a key is configured (and encryption not turned off), else plain. */
export function codecForWriting(key: BackupKey | undefined, encrypt: boolean | undefined): ChunkCodec {
  return key !== undefined && encrypt !== false ? encryptedCodec(key) : plainCodec;
}

/** The codec a manifest's chunks were written with (its `encryption`, checked by manifest.ts). */
export function codecForReading(key: BackupKey | undefined, encryption: EncryptionScheme | undefined): ChunkCodec {
  if (encryption === undefined) return plainCodec;
  // manifest.ts refuses an encrypted manifest without a key before this is asked.
  if (key === undefined) throw new Error('an encrypted backup needs the key');
  return encryptedCodec(key);
}

// The backup target's key (backupTarget.keyFile): what authenticates manifests, so that someone who can write the
// target but does not hold the key cannot make latch restore data of their choosing (a manifest with an unkeyed
// checksum can be rewritten by anyone, its checksum fixed up). One place for the key, so that what comes next (an
// encryption key, a key from elsewhere than a file) grows here.
//
// The key file is the admin's: a regular file owned by the user latch runs as (root), readable by nobody else, of at
// least 32 bytes (trailing whitespace is not part of the key, so `openssl rand -base64 48 > file` works). Its
// contents never leave this module except as a KeyObject: never in a message, a log line, argv or a manifest (a
// manifest names the key only by its id, an HMAC of a fixed string: it tells keys apart and reveals nothing).
//
// Three subkeys are derived from it with HKDF-SHA256 (a label each), so that no key serves two purposes: the chunks'
// AES-256-GCM key, the HMAC key that names chunks, and the manifests' HMAC key (codec.ts, manifest.ts). Losing the key
// file loses every backup made with it: nothing else can decrypt them (docs/operations.md, "Backups").
import { constants } from 'node:fs';
import { open, realpath } from 'node:fs/promises';
import { createHmac, createSecretKey, hkdfSync, timingSafeEqual, type KeyObject } from 'node:crypto';
import { LatchError } from '../errors.js';
import type { BackupTarget } from './layout.js';

const MIN_KEY_BYTES = 32;
// Far more than any key; a larger "key file" is a mistake (a disk image named by accident), not a key.
const MAX_KEY_FILE_BYTES = 4096;

export interface BackupKey {
  /** The key file's key itself: the HMAC of latch-backup/v1 and v2 manifests, and the key id. Never printed. */
  secret: KeyObject;
  /** Tells keys apart in messages and manifests (16 hex digits of an HMAC of a fixed string). */
  id: string;
  /** Subkeys derived from it (HKDF-SHA256, one label each), for latch-backup/v3: chunks' AES-256-GCM key, */
  chunkCipher: KeyObject;
  /** the HMAC-SHA256 key that names chunks (their IDs), */
  chunkId: KeyObject;
  /** and the manifests' HMAC-SHA256 key. */
  manifestMac: KeyObject;
}

// HKDF's salt: fixed, so that one key file always gives the same subkeys (on every node, for every backup).
const HKDF_SALT = 'latch-backup-keys/v1';

/**
 * The target's key, or undefined when the configuration names none (manifests are then unauthenticated). Read anew
 * each time (a few syscalls against a backup's gigabytes): an agent that runs for months sees a key the admin
 * replaced, or a file whose mode went wrong, at once.
 */
export async function backupKey(target: BackupTarget): Promise<BackupKey | undefined> {
  return target.keyFile === undefined ? undefined : readKeyFile(target.keyFile);
}

async function readKeyFile(path: string): Promise<BackupKey> {
  const refuse = (why: string) => new LatchError(`the backup key file ${path} (backupTarget.keyFile) ${why}`);
  const raw = await readPrivateFile(path, refuse);
  let end = raw.length;
  while (end > 0 && [0x0a, 0x0d, 0x20, 0x09].includes(raw[end - 1] ?? 0)) end--;
  if (end < MIN_KEY_BYTES) {
    raw.fill(0);
    throw refuse(`holds fewer than ${MIN_KEY_BYTES} bytes of key (make one with: openssl rand -base64 48 > ${path})`);
  }
  const material = raw.subarray(0, end);
  const secret = createSecretKey(material);
  const derive = (label: string) => createSecretKey(Buffer.from(hkdfSync('sha256', material, HKDF_SALT, label, 32)));
  const key: BackupKey = {
    secret,
    id: createHmac('sha256', secret).update('latch-backup-key-id').digest('hex').slice(0, 16),
    chunkCipher: derive('latch backup chunk encryption (aes-256-gcm)'),
    chunkId: derive('latch backup chunk id (hmac-sha256)'),
    manifestMac: derive('latch backup manifest mac (hmac-sha256)'),
  };
  raw.fill(0);
  return key;
}

/**
 * The bytes of a file that holds a secret (the backup key, S3 credentials): a regular file, not a link, owned by the
 * user latch runs as and readable by nobody else, of at most 4 KiB. `refuse` words the error (it names the setting).
 * `followLinksInside`: a Kubernetes secret volume's files are links into its own ..data directory; a link is then
 * followed only when it resolves inside that directory.
 */
export async function readPrivateFile(path: string, refuse: (why: string) => Error, followLinksInside?: string): Promise<Buffer> {
  let real = path;
  if (followLinksInside !== undefined) {
    try {
      real = await realpath(path);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') throw refuse('does not exist');
      throw refuse(`cannot be resolved (${(err as NodeJS.ErrnoException).code ?? 'error'})`);
    }
    if (!real.startsWith(`${await realpath(followLinksInside)}/`)) throw refuse('is a link to outside its directory');
  }
  let handle;
  try {
    handle = await open(real, constants.O_RDONLY | constants.O_NOFOLLOW);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') throw refuse('does not exist');
    if (code === 'ELOOP') throw refuse('is a symbolic link; name the file itself');
    throw refuse(`cannot be opened (${code ?? 'error'})`);
  }
  try {
    const stats = await handle.stat();
    if (!stats.isFile()) throw refuse('is not a regular file');
    const uid = process.geteuid?.();
    if (uid !== undefined && stats.uid !== uid) throw refuse(`is owned by uid ${stats.uid}, not by uid ${uid} that latch runs as`);
    if ((stats.mode & 0o077) !== 0) {
      throw refuse(`is readable or writable by others (mode ${(stats.mode & 0o777).toString(8)}); chmod 600 it`);
    }
    if (stats.size > MAX_KEY_FILE_BYTES) throw refuse(`holds ${stats.size} bytes, more than a key`);
    return await handle.readFile();
  } finally {
    await handle.close();
  }
}

/**
 * The HMAC-SHA256 of a manifest's body (its JSON without the authentication fields), in hex: under the derived
 * manifest key for latch-backup/v3 (encrypted), under the key itself for the formats before it.
 */
export function manifestMac(key: BackupKey, body: string, derived: boolean): string {
  return createHmac('sha256', derived ? key.manifestMac : key.secret)
    .update('latch-backup-manifest\n')
    .update(body)
    .digest('hex');
}

/** Compares a MAC read from a target with the one computed, in constant time. */
export function macMatches(expected: string, found: unknown): boolean {
  if (typeof found !== 'string' || !/^[0-9a-f]{64}$/.test(found)) return false;
  return timingSafeEqual(Buffer.from(expected, 'hex'), Buffer.from(found, 'hex'));
}

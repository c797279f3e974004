// The backup target's key (backupTarget.keyFile): what authenticates manifests, so that someone who can write the
// target but does not hold the key cannot make latch restore data of their choosing (a manifest with an unkeyed
// checksum can be rewritten by anyone, its checksum fixed up). One place for the key, so that what comes next (an
// encryption key, a key from elsewhere than a file) grows here.
//
// The key file is the admin's: a regular file owned by the user latch runs as (root), readable by nobody else, of at
// least 32 bytes (trailing whitespace is not part of the key, so `openssl rand -base64 48 > file` works). Its
// contents never leave this module except as a KeyObject: never in a message, a log line, argv or a manifest (a
// manifest names the key only by its id, an HMAC of a fixed string: it tells keys apart and reveals nothing).
import { constants } from 'node:fs';
import { open } from 'node:fs/promises';
import { createHmac, createSecretKey, timingSafeEqual, type KeyObject } from 'node:crypto';
import { LatchError } from '../errors.js';
import type { BackupTarget } from './layout.js';

const MIN_KEY_BYTES = 32;
// Far more than any key; a larger "key file" is a mistake (a disk image named by accident), not a key.
const MAX_KEY_FILE_BYTES = 4096;

export interface BackupKey {
  /** For the HMAC only: never printed. */
  secret: KeyObject;
  /** Tells keys apart in messages and manifests (16 hex digits of an HMAC of a fixed string). */
  id: string;
}

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
  let handle;
  try {
    handle = await open(path, constants.O_RDONLY | constants.O_NOFOLLOW);
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
    const raw = await handle.readFile();
    let end = raw.length;
    while (end > 0 && [0x0a, 0x0d, 0x20, 0x09].includes(raw[end - 1] ?? 0)) end--;
    if (end < MIN_KEY_BYTES) {
      raw.fill(0);
      throw refuse(`holds fewer than ${MIN_KEY_BYTES} bytes of key (make one with: openssl rand -base64 48 > ${path})`);
    }
    const secret = createSecretKey(raw.subarray(0, end));
    raw.fill(0);
    return { secret, id: createHmac('sha256', secret).update('latch-backup-key-id').digest('hex').slice(0, 16) };
  } finally {
    await handle.close();
  }
}

/** The HMAC-SHA256 of a manifest's body (its JSON without the authentication fields), in hex. */
export function manifestMac(key: BackupKey, body: string): string {
  return createHmac('sha256', key.secret).update('latch-backup-manifest\n').update(body).digest('hex');
}

/** Compares a MAC read from a target with the one computed, in constant time. */
export function macMatches(expected: string, found: unknown): boolean {
  if (typeof found !== 'string' || !/^[0-9a-f]{64}$/.test(found)) return false;
  return timingSafeEqual(Buffer.from(expected, 'hex'), Buffer.from(found, 'hex'));
}

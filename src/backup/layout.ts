// Where things live in a backup target: a directory (local, or an NFS or CephFS mount) shared by every node.
//
//   <path>/chunks/<2 hex>/<sha256>   one chunk's bytes, compressed; named by the sha256 of its uncompressed bytes,
//                                    so a chunk is stored once however many volumes and backups contain it
//   <path>/backups/<name>.json       one manifest per complete backup, written last
//   <path>/lock                      the writers' lock (lock.ts)
//
// Everything latch writes here is root's alone: files 0600, directories 0700 (chunks and manifests hold volume data
// and what it is). Targets written by older versions are tightened by the next writer: chunks/ and backups/ become
// 0700 (which closes everything below them, whatever the older files' modes): files.ts, tightenTarget.
//   .<name>.<pid>.<tag>.tmp          files being written (atomic-file.ts); a dead writer's are removed under the lock
import { stat } from 'node:fs/promises';
import { join } from 'node:path';
import { LatchError } from '../errors.js';
import { checkVolumeName } from '../names.js';

/** A backup target as config.json names it (`backupTarget`). */
export interface BackupTarget {
  type: 'dir';
  /** An existing directory; latch never creates it, so an unmounted share is an error rather than a local copy. */
  path: string;
  /**
   * The key that authenticates its manifests (keys.ts): a root-only file. Without one, manifests carry an unkeyed
   * checksum, and verify, restore and list say they are unauthenticated.
   */
  keyFile?: string | undefined;
}

export const MANIFEST_SUFFIX = '.json';

export function chunksDir(target: BackupTarget): string {
  return join(target.path, 'chunks');
}

export function chunkPath(target: BackupTarget, hash: string): string {
  return join(chunksDir(target), hash.slice(0, 2), hash);
}

export function backupsDir(target: BackupTarget): string {
  return join(target.path, 'backups');
}

export function manifestPath(target: BackupTarget, name: string): string {
  return join(backupsDir(target), `${checkBackupName(name)}${MANIFEST_SUFFIX}`);
}

export function lockPath(target: BackupTarget): string {
  return join(target.path, 'lock');
}

/** Backup names become file names in the target: the volume name rules, shorter. */
export function checkBackupName(name: string): string {
  return checkVolumeName(name, 'backup name', 200);
}

/** A sha256 in hex, as chunk names are; anything else read from a manifest is corruption. */
export function isChunkHash(value: unknown): value is string {
  return typeof value === 'string' && /^[0-9a-f]{64}$/.test(value);
}

/** Refuses a target that is not an existing directory, before anything is written into it. */
export async function checkTarget(target: BackupTarget): Promise<void> {
  try {
    const stats = await stat(target.path);
    if (stats.isDirectory()) return;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    throw new LatchError(
      `the backup target ${target.path} does not exist; create it (or mount the share there) first: latch does not ` +
        'create it, so that an unmounted share is never mistaken for an empty local directory',
    );
  }
  throw new LatchError(`the backup target ${target.path} is not a directory`);
}

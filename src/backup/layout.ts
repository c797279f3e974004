// Where things live in a backup target: a directory (local, or an NFS or CephFS mount) shared by every node, or a
// prefix in an S3 bucket (the same keys below the prefix: s3-store.ts).
//
//   <path>/chunks/<2 hex>/<id>       one chunk's bytes, compressed (and encrypted, with a key: codec.ts); named by its
//                                    ID, the sha256 of its uncompressed bytes (an HMAC of them when encrypted), so a
//                                    chunk is stored once however many volumes and backups contain it
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

/** A backup target as config.json names it (`backupTarget`): a directory, or a prefix in an S3 bucket (s3-store.ts). */
export type BackupTarget = DirTarget | S3Target;

interface TargetKeys {
  /**
   * The key that authenticates manifests and encrypts chunks (keys.ts): a root-only file. Without one, manifests carry
   * an unkeyed checksum, chunks are stored in the clear, and verify, restore and list say they are unauthenticated.
   */
  keyFile?: string | undefined;
  /** With a keyFile: whether new backups' chunks are encrypted (default true; false: authenticated only, as before). */
  encrypt?: boolean | undefined;
}

export interface DirTarget extends TargetKeys {
  type: 'dir';
  /** An existing directory; latch never creates it, so an unmounted share is an error rather than a local copy. */
  path: string;
}

export interface S3Target extends TargetKeys {
  type: 's3';
  /** The S3 service's URL (https://..., or http://... on a trusted network), path-style requests. */
  endpoint: string;
  /** An existing bucket: latch never creates it. */
  bucket: string;
  /** Where in the bucket this target's objects live ('' or e.g. "cluster-a/"); the same layout as a directory's. */
  prefix: string;
  region?: string | undefined;
  /** A root-only JSON file {"accessKeyId": ..., "secretAccessKey": ...}. */
  credentialsFile?: string | undefined;
  /** A Kubernetes secret mounted as a directory: files accessKeyId and secretAccessKey (defaultMode 0400). */
  credentialsDir?: string | undefined;
  /** PEM certificates to trust for an https endpoint, beside the system's. */
  caFile?: string | undefined;
}

/** The target in words for messages: the directory, or s3://bucket/prefix at the endpoint (never a secret). */
export function describeTarget(target: BackupTarget): string {
  return target.type === 'dir' ? target.path : `s3://${target.bucket}/${target.prefix} at ${target.endpoint}`;
}

// Object keys, relative to the target (a directory's path, or the bucket's prefix).
export const CHUNKS = 'chunks/';
export const BACKUPS = 'backups/';
export const LOCK = 'lock';

export function chunkKey(hash: string): string {
  return `${CHUNKS}${hash.slice(0, 2)}/${hash}`;
}

export function manifestKey(name: string): string {
  return `${BACKUPS}${checkBackupName(name)}${MANIFEST_SUFFIX}`;
}

export const MANIFEST_SUFFIX = '.json';

export function chunksDir(target: DirTarget): string {
  return join(target.path, 'chunks');
}

export function chunkPath(target: DirTarget, hash: string): string {
  return join(chunksDir(target), hash.slice(0, 2), hash);
}

export function backupsDir(target: DirTarget): string {
  return join(target.path, 'backups');
}

export function lockPath(target: DirTarget): string {
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

/** Refuses a directory target that is not an existing directory, before anything is written into it. */
export async function checkDirTarget(target: DirTarget): Promise<void> {
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

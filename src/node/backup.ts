// Incremental backups from the storage's own snapshots, for a backend that reports a snapshot's changed extents
// (rbd: SnapshotBackend.snapshotDiff). Each backup of a volume is read from a snapshot of its own, the *base*
// `latch-base-<backup>`, and that snapshot is kept after the backup: the next backup of the volume reads only the
// extents changed since it, and carries every other chunk over from the backup made from it (backup/delta.ts). The
// first backup (or one with no usable base) reads the snapshot's allocated extents. Nothing is copied to the node.
//
// Crash safety: a base is removed only once a newer backup of the volume has been published (then every older base
// goes); a backup that fails removes its own new snapshot and leaves the previous base in place, and one killed
// before it could is removed by the next success (it is older). A base is used only when the target holds the
// backup of its name, complete, checked (authenticated when a key is configured), of the same chunk size, and every
// chunk it lists, and when the base is the very snapshot that backup was read from: the manifest records the
// storage's own ID of it, and a name alone can lie (a backup of the same name to another target takes the base of
// that name again, later; carried over, the first target's chunks would miss what changed in between). Otherwise
// the backup reads everything allocated, and says why.
import { createHash } from 'node:crypto';
import { DEFAULT_CHUNK_SIZE, missingChunk } from '../backup/chunks.js';
import { createBackup } from '../backup/create.js';
import { diffChunkSource } from '../backup/delta.js';
import type { BackupTarget } from '../backup/layout.js';
import { codecForWriting, type ChunkCodec } from '../backup/codec.js';
import { backupKey } from '../backup/keys.js';
import { listBackups, readCheckedManifest, type Manifest } from '../backup/manifest.js';
import { BACKUP_BASE_PREFIX, hasSnapshots, type SnapshotBackend, type SnapshotInfo } from '../backend/types.js';
import type { Context } from '../context.js';
import { LatchError, errorMessage } from '../errors.js';
import type { VolumeDoc } from '../ledger/types.js';
import { snapshotVolume, type Consistency } from './snapshot.js';

/** The base snapshot a backup is read from: `latch-base-<backup>` (a hash of the name when that would be too long). */
export function baseSnapshotName(backup: string): string {
  const plain = `${BACKUP_BASE_PREFIX}${backup}`;
  return plain.length <= 200 ? plain : `${BACKUP_BASE_PREFIX}${createHash('sha256').update(backup).digest('hex').slice(0, 40)}`;
}

/**
 * The base snapshots among `snapshots` that no backup ticket on the volume (`doc`) names: a shared volume's bases are
 * only ever its running backups', so these were left by backups that failed and could not delete their own.
 */
export function unusedBases(snapshots: string[], doc: Pick<VolumeDoc, 'spec'> | undefined): string[] {
  const named = new Set(
    Object.values(doc?.spec.tickets ?? {}).flatMap((t) => (t.job?.kind === 'backup' ? [baseSnapshotName(t.job.backup)] : [])),
  );
  return snapshots.filter((n) => n.startsWith(BACKUP_BASE_PREFIX) && !named.has(n));
}

/**
 * A snapshot a person (or a ticket) asks for may not take a base's name: a backup would take it for the base of the
 * backup of that name, and carry that backup's chunks over for extents it never compared.
 */
export function refuseBaseName(snapshot: string): void {
  if (snapshot.startsWith(BACKUP_BASE_PREFIX)) {
    throw new LatchError(`snapshot names starting with ${BACKUP_BASE_PREFIX} are kept for the bases of incremental backups`);
  }
}

export interface IncrementalOptions {
  target: BackupTarget;
  volume: string;
  /** The backup's name (fixed by the requester). */
  name: string;
  node: string;
  fsType?: string | undefined;
  /** Read this user snapshot (all its allocated extents) instead of a new base: no base is kept. */
  fromSnapshot?: string | undefined;
  /** The device is set up for jobs only and nothing mounts it (node/jobs/backup.ts): nothing writes the volume. */
  idle?: boolean;
  signal?: AbortSignal | undefined;
}

export interface IncrementalBackup {
  manifest: Manifest;
  consistency: Consistency | 'snapshot';
  note?: string;
  /** Bytes read from the storage (the diff's data). */
  bytesRead: number;
  /** The backup whose chunks it carried over, if any; else why none could be used. */
  base: { parent: string } | { none: string };
}

type DiffingBackend = SnapshotBackend & Required<Pick<SnapshotBackend, 'snapshotDiff' | 'snapshotIds'>>;

/**
 * The backend's snapshot operations when it reports snapshot diffs and its snapshots' IDs; undefined otherwise (backups
 * read whole images).
 */
export function diffingBackend(ctx: Context): DiffingBackend | undefined {
  const backend = ctx.backend;
  if (!hasSnapshots(backend) || typeof backend.snapshotDiff !== 'function' || typeof backend.snapshotIds !== 'function') {
    return undefined;
  }
  return backend as DiffingBackend;
}

/** Backs the volume up through a base snapshot (see above). The caller checked that the backend reports diffs. */
export async function incrementalBackup(ctx: Context, options: IncrementalOptions): Promise<IncrementalBackup> {
  const backend = diffingBackend(ctx);
  if (!backend) throw new Error('incrementalBackup needs a backend that reports snapshot diffs');
  const { target, volume, name } = options;
  if (options.fromSnapshot !== undefined) {
    if ((await ctx.ledger.get(volume)) === undefined)
      throw new LatchError(`volume ${volume} does not exist (latch volume list shows the volumes)`);
    const backup = await readInto(backend, options, { name: options.fromSnapshot }, undefined);
    return { ...backup, consistency: 'snapshot', base: { none: `read from snapshot ${options.fromSnapshot}` } };
  }

  const base = baseSnapshotName(name);
  // The snapshots before this backup's base is taken: every one of them is older (listed once: each rbd listing is a
  // Ceph client of its own, 0.2-0.4 s).
  const before = await backend.snapshotIds(volume);
  // Left by an earlier attempt at this backup (it published nothing: the caller checked): taken again.
  if (before.has(base)) await backend.deleteSnapshot(volume, base);
  const older = new Map([...before].filter(([n]) => n !== base));
  let consistency: Consistency;
  let note: string | undefined;
  let taken: SnapshotInfo;
  if (options.idle) {
    taken = await backend.createSnapshot(volume, base);
    consistency = 'idle';
  } else {
    ({ info: taken, consistency, note } = await snapshotVolume(ctx, volume, base));
  }
  let backup;
  try {
    const parent = await usableParent(target, volume, older);
    backup = await readInto(backend, options, { name: base, id: taken.id }, 'manifest' in parent ? parent : undefined);
    const done = { ...backup, consistency, ...(note !== undefined && { note }) };
    // Published: a base that cannot be removed now is removed by the next success (it is older than that one's).
    await removeBases(backend, volume, [...older.keys()]).catch(() => undefined);
    return { ...done, base: 'manifest' in parent ? { parent: parent.manifest.name } : { none: parent.none } };
  } catch (err) {
    // The previous base stays; this one is of no use without its backup.
    if (backup === undefined) await backend.deleteSnapshot(volume, base).catch(() => undefined);
    throw err;
  }
}

/** Reads `snapshot` into a backup; with its ID, the snapshot is a base, recorded as the manifest's baseSnapshot. */
async function readInto(
  backend: DiffingBackend,
  options: IncrementalOptions,
  snapshot: { name: string; id?: string | undefined },
  parent: { manifest: Manifest; snapshot: string; codec: ChunkCodec } | undefined,
): Promise<{ manifest: Manifest; bytesRead: number }> {
  const { target, volume, name, signal } = options;
  const diff = await backend.snapshotDiff(volume, snapshot.name, parent?.snapshot);
  let source;
  try {
    source = diffChunkSource({
      target,
      sizeBytes: diff.sizeBytes,
      chunkSize: DEFAULT_CHUNK_SIZE,
      records: diff.records,
      parent: parent?.manifest,
      parentCodec: parent?.codec,
      finish: () => diff.finish(),
      cancel: () => diff.cancel(),
    });
  } catch (err) {
    diff.cancel();
    throw err;
  }
  // createBackup lets go of the source when it fails while reading; this covers a failure before (the lock, the name).
  const manifest = await createBackup({
    target,
    source,
    volume,
    name,
    sourceDescription: diff.description,
    node: options.node,
    fsType: options.fsType,
    baseSnapshot: snapshot.id === undefined ? undefined : { name: snapshot.name, id: snapshot.id },
    // Preempted or stopped: stop between chunks, and never publish.
    onChunk: () => signal?.throwIfAborted(),
    beforePublish: async () => signal?.throwIfAborted(),
  }).catch((err: unknown) => {
    source.cancel();
    throw err;
  });
  return { manifest, bytesRead: source.bytesRead() };
}

/**
 * The newest complete backup of the volume in the target, when the very snapshot it was read from is still there
 * (taken before this one: `older`, name to ID) and the backup can be built on; else why not.
 */
async function usableParent(
  target: BackupTarget,
  volume: string,
  older: Map<string, string>,
): Promise<{ manifest: Manifest; snapshot: string; codec: ChunkCodec } | { none: string }> {
  const newest = (await listBackups(target, volume)).filter((b) => b.manifest?.volume === volume).at(-1);
  if (!newest) return { none: 'the first backup of the volume in this target' };
  const snapshot = baseSnapshotName(newest.name);
  const id = older.get(snapshot);
  if (id === undefined) return { none: `the snapshot of the previous backup ${newest.name} is gone` };
  let manifest: Manifest;
  let codec: ChunkCodec;
  try {
    // With a key configured, an unauthenticated manifest is refused: its chunk list is carried over unread.
    ({ manifest, codec } = await readCheckedManifest(target, newest.name));
  } catch (err) {
    return { none: `the previous backup ${newest.name} cannot be built on: ${errorMessage(err)}` };
  }
  // Its chunk IDs are carried over into the new manifest as they are: they must be named and sealed the way the new
  // backup's are (an authenticated manifest is under the configured key, so only encryption on or off can differ).
  const writing = codecForWriting(await backupKey(target), target.encrypt);
  if (codec.encrypted !== writing.encrypted) {
    return {
      none: `the previous backup ${newest.name} is ${codec.encrypted ? 'encrypted' : 'not encrypted'} and this one is ${writing.encrypted ? 'encrypted' : 'not'}`,
    };
  }
  if (manifest.chunkSize !== DEFAULT_CHUNK_SIZE) return { none: `the previous backup ${newest.name} has chunks of another size` };
  if (manifest.baseSnapshot === undefined) {
    return { none: `the previous backup ${newest.name} does not record the ID of the snapshot it was read from (an older latch made it)` };
  }
  if (manifest.baseSnapshot.name !== snapshot || manifest.baseSnapshot.id !== id) {
    return {
      none:
        `snapshot ${snapshot} is not the one the previous backup ${newest.name} was read from (ID ${id}, not ` +
        `${manifest.baseSnapshot.id}): it was taken again since, by a backup of that name to another target`,
    };
  }
  const lacking = await missingChunk(
    target,
    manifest.chunks.filter((hash): hash is string => hash !== null),
  );
  if (lacking !== undefined) return { none: `the previous backup ${newest.name} lacks chunk ${lacking} in the target` };
  return { manifest, snapshot, codec };
}

/** Once a backup is published: the base snapshots taken before its own go. */
async function removeBases(backend: SnapshotBackend, volume: string, older: string[]): Promise<void> {
  for (const old of older) {
    if (old.startsWith(BACKUP_BASE_PREFIX)) await backend.deleteSnapshot(volume, old);
  }
}

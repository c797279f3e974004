// The backup and restore jobs of shared volumes (docs/operations.md, "Backups of shared volumes"): a backup archives
// the files of a CephFS snapshot of the volume as a tar stream into the chunk engine (node/shared-files.ts); a restore
// makes a new shared volume's files from such a backup. Each mounts the subvolume itself, on a node-private path with
// an admin socket of its own (beside any pod's mount of the volume on this node), read-only for a backup.
//
// Everything that touches the mount runs in this process (fs calls on libuv's threads, which nothing can interrupt):
// a ceph-fuse that stops answering would hold them for ever. A watchdog aborts the mount's FUSE connection when no
// progress was made for commandTimeout seconds, or when the job is asked to stop and the mount does not let go in that
// time: every call waiting on it then fails at once (guardFuse's rule, for a job that may run for hours).
import { readdir } from 'node:fs/promises';
import { posix } from 'node:path';
import { createBackup } from '../../backup/create.js';
import { describeTarget, type BackupTarget } from '../../backup/layout.js';
import { manifestExists, readManifest } from '../../backup/manifest.js';
import { openBackupStream } from '../../backup/stream.js';
import { BACKUP_BASE_PREFIX } from '../../backend/types.js';
import { LatchError } from '../../errors.js';
import { formatSize } from '../../size.js';
import { abortFuseConnection, fuseMountsAt, guardFuse } from '../../sys/fuse.js';
import { run } from '../../sys/run.js';
import { baseSnapshotName, unusedBases } from '../backup.js';
import { sharedDeviceId, sharedVolumesOf } from '../shared.js';
import { SHARED_ARCHIVE, emptyDirectory, extractTree, listTree, packTree, streamChunkSource } from '../shared-files.js';
import { attrTools } from '../shared-xattrs.js';
import type { JobOf, JobOutcome, JobRun } from './types.js';

/**
 * A watchdog on a job's FUSE mount: `tick()` on every step of progress; after `timeoutMs` without one (or that long
 * after the job was aborted) the mount's connection is aborted, and `check()` throws from then on.
 */
function stallGuard(mountPoint: string, timeoutMs: number, signal: AbortSignal) {
  let last = Date.now();
  let stalled = false;
  const timer = setInterval(
    () => {
      if (stalled || Date.now() - last < timeoutMs) return;
      stalled = true;
      void fuseMountsAt(mountPoint)
        .then((mounts) => Promise.all(mounts.map((m) => abortFuseConnection(m))))
        .catch(() => undefined);
    },
    Math.min(1000, timeoutMs),
  );
  const onAbort = () => (last = Math.min(last, Date.now()));
  signal.addEventListener('abort', onAbort);
  return {
    tick: () => {
      if (stalled)
        throw new LatchError(`the CephFS mount at ${mountPoint} made no progress for ${timeoutMs} ms; its connection was aborted`);
      if (signal.aborted) throw signal.reason;
      last = Date.now();
    },
    stalled: () => stalled,
    /** The error to throw for `err` (what a call on the aborted mount failed with): the stall, when there was one. */
    explain: (err: unknown): unknown =>
      stalled
        ? new LatchError(`the CephFS mount at ${mountPoint} made no progress for ${timeoutMs} ms; its connection was aborted`, {
            cause: err,
          })
        : err,
    stop: () => {
      clearInterval(timer);
      signal.removeEventListener('abort', onAbort);
    },
  };
}

/** The directory of snapshot `snapshot` inside the subvolume's mount: `.snap/_<name>_<inode>` (how CephFS shows it). */
async function snapshotDir(mount: string, snapshot: string): Promise<string> {
  const names = await readdir(posix.join(mount, '.snap'));
  const escaped = snapshot.replace(/[.]/g, '\\.');
  const found = names.filter((n) => new RegExp(`^_${escaped}_[0-9]+$`).test(n));
  if (found.length !== 1) throw new LatchError(`the snapshot ${snapshot} is not found once in ${mount}/.snap (${found.length} found)`);
  return posix.join(mount, '.snap', found[0] as string);
}

/**
 * Deletes the base snapshots (latch-base-*) of a shared volume that no backup ticket on it names: those a failed backup
 * could not delete itself (its hung client's MDS session held the volume past the deadline). They are listed before
 * the ledger is read, so a backup asked for meanwhile is seen with its snapshot. Returns a note for the job's message;
 * a snapshot that cannot be deleted now is left for the next backup.
 */
async function sweepBaseSnapshots(jobRun: JobRun, volume: string): Promise<string> {
  const shared = await sharedVolumesOf(jobRun.ctx);
  const snapshots = (await shared.listSnapshots(volume)).map((s) => s.name);
  if (!snapshots.some((n) => n.startsWith(BACKUP_BASE_PREFIX))) return '';
  const left = unusedBases(snapshots, await jobRun.ctx.ledger.get(volume));
  let deleted = 0;
  for (const name of left) {
    if (
      await shared.deleteSnapshot(volume, name).then(
        () => true,
        () => false,
      )
    )
      deleted++;
  }
  return left.length === 0 ? '' : `; ${deleted} of ${left.length} base snapshot(s) left by earlier failed backups deleted`;
}

/** The backup job of a shared volume; `run`'s document says it is shared. */
export async function backUpShared(job: JobOf<'backup'>, jobRun: JobRun, target: BackupTarget): Promise<JobOutcome> {
  const { ctx, volume, signal } = jobRun;
  const shared = await sharedVolumesOf(ctx);
  // Its own snapshot when none is named: a base snapshot's name, which nobody else may take (refuseBaseName).
  const own = job.fromSnapshot === undefined ? baseSnapshotName(job.backup) : undefined;
  const snapshot = job.fromSnapshot ?? baseSnapshotName(job.backup);
  if (await manifestExists(target, job.backup)) {
    const manifest = await readManifest(target, job.backup);
    if (manifest.volume !== volume)
      throw new LatchError(`a backup named ${job.backup} already exists in ${describeTarget(target)}, of volume ${manifest.volume}`);
    if (own !== undefined) await shared.deleteSnapshot(volume, own); // left by an attempt killed after publishing
    return {
      message: `backup ${job.backup} of shared volume ${volume} exists (made by an earlier attempt)`,
      result: { backup: job.backup },
    };
  }
  const snapshots = await shared.listSnapshots(volume);
  if (!snapshots.some((s) => s.name === snapshot)) {
    if (own === undefined) throw new LatchError(`volume ${volume} has no snapshot named ${snapshot}`);
    await shared.createSnapshot(volume, own);
  }
  const mount = shared.jobMountPath(volume);
  const timeoutMs = ctx.config.commandTimeout * 1000;
  await shared.mountForJob(volume, mount, { readOnly: true });
  const guard = stallGuard(mount, timeoutMs, signal);
  let made;
  let skipped;
  let xattrEntries;
  const xattrs = attrTools(timeoutMs);
  try {
    const root = await snapshotDir(mount, snapshot);
    const listing = await listTree(root, xattrs, guard.tick);
    skipped = listing.skipped;
    xattrEntries = listing.xattrEntries;
    const source = streamChunkSource(await packTree(root, listing, xattrs, guard.tick), listing.sizeBound);
    made = await createBackup({
      target,
      source,
      volume,
      name: job.backup,
      sourceDescription: `snapshot ${snapshot} of shared volume ${volume}, as a tar archive of its files`,
      node: ctx.config.nodeName,
      fsType: SHARED_ARCHIVE,
      onChunk: () => guard.tick(),
      beforePublish: async () => {
        signal.throwIfAborted();
        if (guard.stalled()) throw new LatchError(`the CephFS mount at ${mount} was aborted: nothing is published`);
      },
    });
  } catch (err) {
    guard.stop();
    await shared.unmountForJob(mount, { hung: guard.stalled() });
    // A failed backup lets go of its own snapshot (or the next backup does, when the MDS still waits on the hung client
    // of this one: sweepBaseSnapshots); an interrupted one keeps it for the attempt that redoes it.
    if (own !== undefined && !signal.aborted) await shared.deleteSnapshot(volume, own).catch(() => undefined);
    throw guard.explain(err);
  } finally {
    guard.stop();
    await shared.unmountForJob(mount);
  }
  if (own !== undefined) await shared.deleteSnapshot(volume, own);
  const swept = await sweepBaseSnapshots(jobRun, volume);
  const s = made.stats;
  const skippedNote = skipped.length === 0 ? '' : `; skipped ${skipped.length} device node(s), FIFO(s), socket(s) or attribute(s)`;
  return {
    message:
      `backup ${made.name} of shared volume ${volume} created (snapshot ${snapshot}, crash-consistent): a tar archive of its files, ` +
      `${formatSize(s.dataBytes)} of data, ${s.newChunks} new chunk(s) (${formatSize(s.newBytesStored)} written), ` +
      `${s.presentChunks} already in the target; extended attributes of ${xattrEntries} entr(ies) kept${skippedNote}${swept}`,
    result: {
      backup: made.name,
      sizeBytes: made.sizeBytes,
      dataChunks: s.dataChunks,
      newChunks: s.newChunks,
      newBytesStored: s.newBytesStored,
      presentChunks: s.presentChunks,
      consistency: 'crash-consistent',
      format: SHARED_ARCHIVE,
      bytesRead: s.dataBytes,
      xattrEntries,
      skipped: skipped.map((k) => `${k.path} (${k.kind})`).slice(0, 20),
    },
  };
}

/** The restore job into a new shared volume; `run`'s document says it is shared. */
export async function restoreShared(job: JobOf<'restore'>, jobRun: JobRun, target: BackupTarget): Promise<JobOutcome> {
  const { ctx, volume, signal } = jobRun;
  const shared = await sharedVolumesOf(ctx);
  const stream = await openBackupStream(target, job.backup, signal);
  if (stream.manifest.fsType !== SHARED_ARCHIVE) {
    throw new LatchError(`backup ${job.backup} is the image of a block volume, not the files of a shared volume`);
  }
  await shared.create(volume, jobRun.doc.spec.sizeBytes);
  const mount = shared.jobMountPath(volume);
  const timeoutMs = ctx.config.commandTimeout * 1000;
  const client = await shared.mountForJob(volume, mount, { readOnly: false });
  // Its writes must be cut off by a fence of this node like a pod's: the ledger knows the client instance.
  await ctx.ledger.recordDevice(volume, ctx.config.nodeName, sharedDeviceId(volume), client);
  const guard = stallGuard(mount, timeoutMs, signal);
  let report;
  try {
    // What an interrupted attempt made goes first: the restore always starts from an empty root.
    await emptyDirectory(mount);
    report = await extractTree(stream.bytes, mount, attrTools(timeoutMs), guard.tick);
    guard.tick();
    await guardFuse(mount, timeoutMs, (childTimeoutMs) => run('sync', ['-f', mount], { timeoutMs: childTimeoutMs }));
  } catch (err) {
    throw guard.explain(err);
  } finally {
    guard.stop();
    await shared.unmountForJob(mount, { hung: guard.stalled() });
  }
  return {
    message:
      `restored backup ${job.backup} (shared volume ${stream.manifest.volume}) into shared volume ${volume}: ${report.files} file(s), ` +
      `${report.directories} director(ies), ${report.symlinks} symbolic link(s), ${report.hardLinks} hard link(s), ` +
      `${formatSize(report.bytes)}, extended attributes of ${report.xattrEntries} entr(ies)` +
      (report.skippedXattrs === 0
        ? ''
        : `, ${report.skippedXattrs} attribute(s) or pax record(s) skipped (only user.* and POSIX ACLs are restored): ` +
          report.skippedXattrsSample.slice(0, 3).join('; ')) +
      ', checksum verified' +
      (stream.authenticated ? '; manifest authenticated' : '; manifest UNAUTHENTICATED (no backup key configured)'),
    result: {
      backup: job.backup,
      sourceVolume: stream.manifest.volume,
      ...report,
      bytesWritten: report.bytes,
      authenticated: stream.authenticated,
    },
  };
}

/**
 * The backup's and restore's cleanUp on a shared volume: the job's own mount goes (one an agent killed midway left,
 * which would otherwise keep the node's hold for ever).
 */
export async function unmountJobMount(ctx: JobRun['ctx'], volume: string): Promise<void> {
  const shared = await sharedVolumesOf(ctx);
  await shared.unmountForJob(shared.jobMountPath(volume));
}

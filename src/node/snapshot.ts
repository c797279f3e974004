// Snapshots and backups of a volume from the node it is on: where the volume is (idle, set up here, or in use on
// another node), a consistent snapshot (the filesystem frozen while the backend cuts its point-in-time copy), and
// what a backup reads. The commands call these for a volume in use on this node; the node agent's snapshot and backup
// jobs (node/jobs/) call them on the node that holds the volume, after their ticket has set the device up.
import { randomBytes } from 'node:crypto';
import { stat } from 'node:fs/promises';
import { join } from 'node:path';
import type { Config } from '../config.js';
import type { Context } from '../context.js';
import { LatchError, NotSupportedError } from '../errors.js';
import { hasSnapshots, type ReadableImage, type SnapshotBackend, type SnapshotInfo } from '../backend/types.js';
import type { VolumeDoc } from '../ledger/types.js';
import { thawLeftover, withFrozenFilesystem } from '../sys/freeze.js';
import { processExists } from '../sys/processes.js';
import { withVolumeLock } from './lock.js';

/** Where a volume is, as far as this node is concerned. */
export type Whereabouts =
  | { kind: 'idle'; doc: VolumeDoc }
  | { kind: 'here'; doc: VolumeDoc; device: string | undefined }
  | { kind: 'elsewhere'; doc: VolumeDoc; nodes: string[] };

/** How consistent a snapshot is. */
export type Consistency =
  | 'frozen' // set up and mounted here: the filesystem was frozen while the copy was cut
  | 'idle' // no device anywhere: nothing was writing
  // set up here but not mounted (a raw block user, or between attach and mount): nothing to freeze; or mounted, but
  // not frozen throughout the copy (freezeSeconds 0, a copy that cannot be cut at once, a freeze past its bound)
  | 'crash-consistent';

async function locateVolume(ctx: Context, volume: string): Promise<Whereabouts> {
  const doc = await ctx.ledger.get(volume);
  if (!doc) throw new LatchError(`volume ${volume} does not exist (latch volume list shows the volumes)`);
  const me = ctx.config.nodeName;
  // A node in any phase but 'granted' has (or may still have) the device set up.
  const holders = Object.entries(doc.status.nodes)
    .filter(([, entry]) => entry.phase !== 'granted')
    .map(([node]) => node);
  const others = holders.filter((n) => n !== me);
  if (others.length > 0) return { kind: 'elsewhere', doc, nodes: others };
  const device = await ctx.backend.findDevice(volume);
  if (holders.includes(me) || device !== undefined) return { kind: 'here', doc, device };
  return { kind: 'idle', doc };
}

function snapshotsOf(ctx: Context): SnapshotBackend {
  if (!hasSnapshots(ctx.backend)) throw new NotSupportedError(`${ctx.backend.storage} cannot take snapshots`);
  return ctx.backend;
}

/** The refusal for a volume in use on another node: where to run the command instead. */
function inUseElsewhere(volume: string, nodes: string[], command: string): LatchError {
  return new LatchError(
    `volume ${volume} is in use on node ${nodes.join(', ')}: run "${command}" on node ${nodes[0]}, where its filesystem can be ` +
      'frozen for a consistent copy (the command run anywhere else asks the node agent there, through a ticket)',
  );
}

/** Where latch records the freezes it holds (sys/freeze.ts): root-only marker files under the state dir. */
export function freezeMarkerDir(config: Pick<Config, 'stateDir'>): string {
  return join(config.stateDir, 'freezes');
}

/** A snapshot made, how consistent it is, and (when it is crash-consistent) why, for people. */
export interface SnapshotTaken {
  info: SnapshotInfo;
  consistency: Consistency;
  note?: string;
}

/**
 * Takes snapshot `name` of the volume, consistently: holding this node's volume lock; with the filesystem frozen
 * when it is mounted here, for at most freezeSeconds, and only when the backend cuts the copy at once (a whole-image
 * copy never runs under freeze: the snapshot is then crash-consistent, and says why); refused when the volume is in
 * use on another node; abandoned (and removed) when an idle volume was attached while it was being copied.
 */
export async function snapshotVolume(ctx: Context, volume: string, name: string): Promise<SnapshotTaken> {
  const backend = snapshotsOf(ctx);
  return withVolumeLock(ctx.config, volume, async (): Promise<SnapshotTaken> => {
    const where = await locateVolume(ctx, volume);
    if (where.kind === 'elsewhere') throw inUseElsewhere(volume, where.nodes, `latch snapshot create ${volume} ${name}`);
    if (where.kind === 'idle') {
      const info = await backend.createSnapshot(volume, name);
      const after = await locateVolume(ctx, volume);
      if (after.kind !== 'idle' || after.doc.spec.generationCounter !== where.doc.spec.generationCounter) {
        await backend.deleteSnapshot(volume, name);
        throw new LatchError(`volume ${volume} was asked for while snapshot ${name} was being taken; it was removed: try again`);
      }
      return { info, consistency: 'idle' };
    }
    const mount = where.device === undefined ? undefined : await writableMountOf(ctx, where.device);
    if (mount === undefined) return { info: await backend.createSnapshot(volume, name), consistency: 'crash-consistent' };
    const unfrozen = async (note: string): Promise<SnapshotTaken> => ({
      info: await backend.createSnapshot(volume, name),
      consistency: 'crash-consistent',
      note,
    });
    if (ctx.config.freezeSeconds === 0) return unfrozen('not frozen: freezeSeconds is 0');
    if (backend.instantSnapshots && !(await backend.instantSnapshots(volume))) {
      return unfrozen('not frozen: the pool cannot reflink, and a whole-image copy is never made under freeze');
    }
    // A snapshot call killed while the filesystem was frozen leaves it frozen (the kernel does not thaw it): we
    // hold the volume lock, so a frozen filesystem now is such a leftover.
    await thawLeftover(mount);
    const frozen = await withFrozenFilesystem(
      mount,
      { boundMs: ctx.config.freezeSeconds * 1000, markerDir: freezeMarkerDir(ctx.config) },
      () => backend.createSnapshot(volume, name),
    );
    if (!frozen.frozen) return { info: frozen.value, consistency: 'crash-consistent', note: `not frozen throughout: ${frozen.why}` };
    return { info: frozen.value, consistency: 'frozen' };
  });
}

// A backup (or a clone) of a volume in use reads a temporary snapshot `latch-backup-<node>-<pid>-<random>`, removed when
// it ends. One killed before that leaves it behind: the next backup or clone of the volume on that node removes those
// whose process is gone.
const TEMP_SNAPSHOT_PREFIX = 'latch-backup-';

async function removeLeftoverSnapshots(ctx: Context, backend: SnapshotBackend, volume: string): Promise<void> {
  const mine = `${TEMP_SNAPSHOT_PREFIX}${ctx.config.nodeName}-`;
  for (const snap of await backend.listSnapshots(volume)) {
    if (!snap.name.startsWith(mine)) continue;
    const pid = Number(/^(\d+)-[0-9a-f]+$/.exec(snap.name.slice(mine.length))?.[1]);
    if (Number.isSafeInteger(pid) && pid > 0 && !processExists(pid)) await backend.deleteSnapshot(volume, snap.name);
  }
}

/** Where the device's filesystem is mounted read-write on this node (any of its mounts freezes the filesystem). */
async function writableMountOf(ctx: Context, device: string): Promise<string | undefined> {
  const mine = (await ctx.system.readMountInfo()).filter((m) => m.source === device && !m.options.includes('ro'));
  return (mine.find((m) => m.root === '/') ?? mine[0])?.mountPoint;
}

export interface BackupSource {
  image: ReadableImage;
  consistency: Consistency | 'snapshot';
  /** Why a snapshot of a mounted volume is only crash-consistent, for people. */
  note?: string;
  /** Throws when what was read may have changed meanwhile: the backup must then not be published. */
  beforePublish?: () => Promise<void>;
  /** Lets go of the source (removes the temporary snapshot a backup of a volume in use is read from). */
  release(): Promise<void>;
}

/**
 * What a backup of the volume reads: the given snapshot; else, for an idle volume whose backend can read its storage
 * directly, that (checked unchanged before the backup is published); else a temporary consistent snapshot, removed
 * on release.
 */
export async function openBackupSource(ctx: Context, volume: string, fromSnapshot?: string): Promise<BackupSource> {
  const backend = snapshotsOf(ctx);
  if (fromSnapshot !== undefined) {
    if ((await ctx.ledger.get(volume)) === undefined)
      throw new LatchError(`volume ${volume} does not exist (latch volume list shows the volumes)`);
    const image = await backend.openSnapshot(volume, fromSnapshot);
    return { image, consistency: 'snapshot', release: () => image.release() };
  }
  const where = await locateVolume(ctx, volume);
  if (where.kind === 'elsewhere') throw inUseElsewhere(volume, where.nodes, `latch backup create ${volume}`);
  if (where.kind === 'idle' && backend.idleImage) {
    const image = await backend.idleImage(volume);
    if (image) {
      const before = await stat(image.path);
      return {
        image,
        consistency: 'idle',
        release: () => image.release(),
        beforePublish: async () => {
          const after = await stat(image.path);
          const again = await locateVolume(ctx, volume);
          if (
            after.mtimeMs !== before.mtimeMs ||
            after.size !== before.size ||
            again.kind !== 'idle' ||
            again.doc.spec.generationCounter !== where.doc.spec.generationCounter
          ) {
            throw new LatchError(
              `volume ${volume} was asked for or written while it was being read; this backup was abandoned (nothing was ` +
                'published): run it again',
            );
          }
        },
      };
    }
  }
  const temporary = await takeTemporarySnapshot(ctx, volume);
  let image: ReadableImage;
  try {
    image = await backend.openSnapshot(volume, temporary.name);
  } catch (err) {
    await temporary.remove().catch(() => undefined);
    throw err;
  }
  return {
    image,
    consistency: temporary.consistency,
    ...(temporary.note !== undefined && { note: temporary.note }),
    release: async () => {
      await image.release();
      await temporary.remove();
    },
  };
}

/** A temporary consistent snapshot of a volume in use here, to read and then remove (or leave to the next one's clean-up). */
export interface TemporarySnapshot {
  name: string;
  consistency: Consistency;
  note?: string;
  remove(): Promise<void>;
}

/**
 * Cuts the temporary snapshot a backup or a clone of a volume in use reads (snapshotVolume: frozen when mounted here),
 * after removing those that killed processes of this node left behind. The caller removes it when done.
 */
export async function takeTemporarySnapshot(ctx: Context, volume: string): Promise<TemporarySnapshot> {
  const backend = snapshotsOf(ctx);
  await removeLeftoverSnapshots(ctx, backend, volume);
  const name = `${TEMP_SNAPSHOT_PREFIX}${ctx.config.nodeName}-${process.pid}-${randomBytes(3).toString('hex')}`;
  const { consistency, note } = await snapshotVolume(ctx, volume, name);
  return { name, consistency, ...(note !== undefined && { note }), remove: () => backend.deleteSnapshot(volume, name) };
}

// Volumes as RBD images in a Ceph pool: the data follows the pod, since every node reaches the same image. The image
// is named after the volume's stable name; the control plane (create, size, grow, delete) is the `rbd` tool as this
// node's own cephx identity, and the data plane (a block device on this node) is a NodeClient.
//
// The node clients (rbd-fuse + loop, krbd), and the one still to come, are described in node-client.ts.
// Fencing is the fencer's (rbd-fencer.ts); this side records which client instance serves each mapping, so that a
// fence can name it even after the node lost contact with the cluster, and refuses a read-write map while a client
// the ledger does not know of has the image open or locked.
import { mkdir, readFile, rm, unlink } from 'node:fs/promises';
import { createInterface } from 'node:readline';
import { writeFileAtomic } from '../atomic-file.js';
import type { RbdClientKind } from '../config.js';
import { LatchError } from '../errors.js';
import { checkVolumeName } from '../names.js';
import { formatSize } from '../size.js';
import { withHostLock } from '../sys/lock.js';
import {
  isClientInstance,
  rbdAllocation,
  rbdClones,
  rbdCreate,
  rbdExportDiff,
  rbdExportSnapshot,
  rbdInfo,
  rbdLockRemove,
  rbdLocks,
  rbdRemove,
  rbdResize,
  rbdSnapCreate,
  rbdSnapList,
  rbdSnapRemove,
  rbdSnapshots,
  rbdUsage,
  rbdWatchers,
  type CephIdentity,
  type RbdSnapshot,
} from '../sys/rbd.js';
import { KernelRbdClient } from './krbd.js';
import { RbdFuseLoopClient } from './rbd-fuse-loop.js';
import type { NodeClient } from './node-client.js';
import { parseExportDiff, type DiffRecord } from '../sys/rbd-diff.js';
import { CommandError } from '../sys/run.js';
import { BACKUP_BASE_PREFIX, type AttachAccess, type Backend, type ReadableImage, type SnapshotDiff, type SnapshotInfo } from './types.js';
import { clientRecordDir, clientRecordFile, snapshotExportFile } from './rbd-layout.js';

export interface RbdBackendOptions extends CephIdentity {
  pool: string;
  /** Node-private directory for the node client's mounts, the recorded client instances and exported snapshots. */
  mountDir: string;
  /** How this node maps images (node-client.ts); rbd-fuse + loop when not given. */
  client?: RbdClientKind;
  /** Largest size a volume may be created with or grown to, in bytes. */
  maxSize: number;
  /** Deadline for one step that touches a FUSE mount or starts a client (the config's commandTimeout). */
  timeoutMs: number;
}

// How long a call waits for another latch process working on the same volume's mapping on this node.
const MAPPING_LOCK_WAIT_MS = 4 * 60 * 1000;

export class RbdBackend implements Backend {
  readonly pool: string;
  readonly maxSize: number;
  readonly client: NodeClient;
  private readonly identity: CephIdentity;
  private readonly mountDir: string;

  get storage(): string {
    return `the rbd pool ${this.pool}`;
  }

  constructor(options: RbdBackendOptions) {
    if (!Number.isSafeInteger(options.maxSize) || options.maxSize < 1) {
      throw new LatchError(`maxSize must be a positive whole number of bytes, got ${options.maxSize}`);
    }
    this.pool = options.pool;
    this.maxSize = options.maxSize;
    this.mountDir = options.mountDir;
    this.identity = {
      cephConf: options.cephConf,
      clientId: options.clientId,
      keyring: options.keyring,
      commandTimeoutMs: options.timeoutMs,
    };
    const { pool, timeoutMs } = options;
    this.client =
      options.client === 'krbd'
        ? new KernelRbdClient({ identity: this.identity, pool, timeoutMs })
        : new RbdFuseLoopClient({ identity: this.identity, pool, mountDir: options.mountDir, timeoutMs });
  }

  async create(volume: string, sizeBytes: number): Promise<void> {
    const image = checkVolumeName(volume);
    this.checkSize(volume, sizeBytes);
    // Ceph images are thin: there is no free-space check to make here (the cluster's quotas and fullness apply).
    if (await rbdCreate(this.identity, this.pool, image, sizeBytes)) return;
    const existing = await rbdInfo(this.identity, this.pool, image);
    if (existing === undefined)
      throw new LatchError(`rbd create ${this.spec(image)} reported that it exists, but rbd info does not find it`);
    if (existing.size < sizeBytes) {
      throw new LatchError(
        `volume ${volume} already exists with ${formatSize(existing.size)}, less than the requested ${formatSize(sizeBytes)} ` +
          `(${this.spec(image)}); expand it instead`,
      );
    }
  }

  async delete(volume: string): Promise<void> {
    const image = checkVolumeName(volume);
    await this.withMappingLock(image, async () => {
      if (await this.client.isMapped(image)) {
        const device = await this.client.deviceOf(image);
        throw new LatchError(`volume ${volume} is still attached on this node${device ? ` (${device})` : ''}; release it first`);
      }
      if ((await rbdInfo(this.identity, this.pool, image)) === undefined) return;
      let snapshots = await rbdSnapshots(this.identity, this.pool, image);
      // The bases of incremental backups go with the volume (nothing else uses them), once no other snapshot is left.
      if (snapshots.length > 0 && snapshots.every((s) => s.startsWith(BACKUP_BASE_PREFIX))) {
        for (const base of snapshots) await rbdSnapRemove(this.identity, this.pool, image, base);
        snapshots = await rbdSnapshots(this.identity, this.pool, image);
      }
      if (snapshots.length > 0) {
        const clones = await rbdClones(this.identity, this.pool, image);
        throw new LatchError(
          `volume ${volume} (${this.spec(image)}) has snapshot(s) ${snapshots.join(', ')}` +
            (clones.length > 0 ? ` and clone(s) ${clones.join(', ')} that depend on it` : '') +
            `; refusing to delete it while they exist`,
        );
      }
      await rbdRemove(this.identity, this.pool, image);
    });
  }

  async size(volume: string): Promise<number | undefined> {
    return (await rbdInfo(this.identity, this.pool, checkVolumeName(volume)))?.size;
  }

  async attach(volume: string, access?: AttachAccess): Promise<string> {
    const image = checkVolumeName(volume);
    return this.withMappingLock(image, async () => {
      const mapped = await this.client.isMapped(image);
      if (!mapped && access && !access.readOnly) {
        // This node's own record counts too: an attach that crashed after it and before the ledger's recordDevice.
        const own = await this.recordedClient(image);
        await this.refuseUnknownClients(image, [...access.knownClients, ...(own !== undefined ? [own] : [])]);
      }
      const device = await this.client.map(image, { readOnly: access?.readOnly ?? false });
      // The instance serving the mapping is recorded before the device is handed out (and so before the ledger's
      // recordDevice): a fence must be able to name it even once the node has lost contact with the cluster. Asked
      // again for a mapping found in place: the client may have replaced a dead one (a new instance).
      let client: string | undefined;
      try {
        client = await this.client.clientAddress(image);
        if (client !== undefined && client !== (await this.recordedClient(image))) await this.rememberClient(image, client);
      } catch (err) {
        await this.undoMapping(image, mapped);
        throw err;
      }
      if (client === undefined) {
        await this.undoMapping(image, mapped);
        throw new LatchError(
          `${this.client.kind} mapped ${this.spec(image)}, but cannot tell which Ceph client instance serves the mapping: ` +
            `a mapping that a fence could not name is not handed out${mapped ? '' : ', and it was undone'}`,
        );
      }
      return device;
    });
  }

  /**
   * Defence in depth before a read-write map (the ledger's grant is the rule): nothing but this node's recorded client
   * and fenced clients may have the image open or hold its lock. Anything else is a writer the ledger does not know
   * of: a node cut off from the ledger but not from the cluster, or a client outside latch. A failing listing fails.
   */
  private async refuseUnknownClients(image: string, knownClients: string[]): Promise<void> {
    const known = new Set(knownClients);
    const [watchers, locks] = await Promise.all([rbdWatchers(this.identity, this.pool, image), rbdLocks(this.identity, this.pool, image)]);
    const unknown = [
      ...watchers.filter((w) => !known.has(w)).map((w) => `${w} (watcher)`),
      ...locks.filter((l) => !known.has(l.address)).map((l) => `${l.address} (lock holder ${l.locker})`),
    ];
    if (unknown.length > 0) {
      throw new LatchError(
        `refusing to map ${this.spec(image)} read-write on this node: the image is open or locked by ${unknown.join(', ')}, ` +
          'which the ledger does not record for this node. Another client may still write to it: find its node ' +
          '(rbd status, latch node check) and release or fence it (latch node fence NODE) first',
      );
    }
  }

  /** After an attach that cannot be finished: a mapping this call made goes; one found in place stays (in use). */
  private async undoMapping(image: string, foundInPlace: boolean): Promise<void> {
    if (!foundInPlace) await this.client.unmap(image).catch(() => undefined);
  }

  async hasMapping(volume: string): Promise<boolean> {
    return this.client.isMapped(checkVolumeName(volume));
  }

  async cutOff(volume: string): Promise<void> {
    await this.client.abort(checkVolumeName(volume));
  }

  /** The instance recorded when this node mapped the image (a mapping found after a crash may have none). */
  async clientOf(volume: string): Promise<string | undefined> {
    const image = checkVolumeName(volume);
    if (!(await this.client.isMapped(image))) return undefined;
    return this.recordedClient(image);
  }

  private async recordedClient(image: string): Promise<string | undefined> {
    const recorded = (await readFile(this.clientFile(image), 'utf8').catch(() => '')).trim();
    return isClientInstance(recorded) ? recorded : undefined;
  }

  async findDevice(volume: string): Promise<string | undefined> {
    return this.client.deviceOf(checkVolumeName(volume));
  }

  async volumeOfDevice(device: string): Promise<string | undefined> {
    if (typeof device !== 'string' || !device.startsWith('/dev/')) return undefined;
    const image = await this.client.imageOf(device);
    if (image === undefined) return undefined;
    try {
      return checkVolumeName(image);
    } catch {
      return undefined;
    }
  }

  async release(volume: string): Promise<void> {
    const image = checkVolumeName(volume);
    await this.withMappingLock(image, async () => {
      const client = await this.recordedClient(image);
      await this.client.unmap(image);
      // A client that died (killed, crashed) leaves its exclusive lock in the image header: it is gone now, and the lock
      // goes too, or the next node's read-write map would find an unknown lock holder and refuse. The record goes last.
      if (client !== undefined) {
        for (const lock of await rbdLocks(this.identity, this.pool, image)) {
          if (lock.address === client) await rbdLockRemove(this.identity, this.pool, image, lock);
        }
      }
      await rm(this.clientFile(image), { force: true });
    });
  }

  async grow(volume: string, sizeBytes: number): Promise<void> {
    const image = checkVolumeName(volume);
    this.checkSize(volume, sizeBytes);
    const info = await rbdInfo(this.identity, this.pool, image);
    if (info === undefined) throw new LatchError(`volume ${volume} has no image ${this.spec(image)}`);
    if (sizeBytes < info.size) {
      throw new LatchError(`volume ${volume}: cannot shrink from ${formatSize(info.size)} to ${formatSize(sizeBytes)}; volumes only grow`);
    }
    if (sizeBytes > info.size) await rbdResize(this.identity, this.pool, image, sizeBytes);
    // Also on a repeated call: a previous one may have resized the image and failed before the refresh.
    await this.withMappingLock(image, () => this.client.refreshSize(image, sizeBytes));
  }

  private checkSize(volume: string, sizeBytes: number): void {
    if (!Number.isSafeInteger(sizeBytes) || sizeBytes < 1) {
      throw new LatchError(`volume ${volume}: size must be a positive whole number of bytes, got ${sizeBytes}`);
    }
    if (sizeBytes > this.maxSize) {
      throw new LatchError(
        `volume ${volume}: requested size ${formatSize(sizeBytes)} is above the limit of ${formatSize(this.maxSize)} (maxSize)`,
      );
    }
  }

  /** Where the instance that serves the image's mapping is kept: beside the mount points, never below one. */
  private clientFile(image: string): string {
    return clientRecordFile(this.mountDir, image);
  }

  private async rememberClient(image: string, client: string): Promise<void> {
    await mkdir(clientRecordDir(this.mountDir), { recursive: true, mode: 0o700 });
    await writeFileAtomic(this.clientFile(image), `${client}\n`);
  }

  private spec(image: string): string {
    return `${this.pool}/${image}`;
  }

  /**
   * Mapping and unmapping one image on this node are serialised across processes: waitforattach and unmountdevice
   * run outside the ops' volume lock, and two rbd-fuse daemons started for one mount point would stack two mounts.
   */
  private withMappingLock<T>(image: string, fn: () => Promise<T>): Promise<T> {
    return withHostLock(
      ['rbd', this.mountDir, this.pool, image],
      MAPPING_LOCK_WAIT_MS,
      () => `another latch call has been mapping or unmapping ${this.spec(image)} on this node for over ${MAPPING_LOCK_WAIT_MS / 1000} s`,
      fn,
    );
  }

  // Snapshots (issue 14): Ceph's own, so taking one costs nothing until the image changes. Backups and clones read a
  // snapshot's extents as a stream (snapshotDiff); openSnapshot, the whole snapshot exported to a sparse file in the
  // node's mountDir (the rbd-fuse client maps images, not snapshots), removed on release, serves what needs a file.
  // Kept at the end of the class, in one block.

  async createSnapshot(volume: string, name: string): Promise<SnapshotInfo> {
    const image = checkVolumeName(volume);
    checkVolumeName(name, 'snapshot name', 200);
    const info = await rbdInfo(this.identity, this.pool, image);
    if (info === undefined) throw new LatchError(`volume ${volume} has no image ${this.spec(image)}`);
    if (!(await rbdSnapCreate(this.identity, this.pool, image, name)))
      throw new LatchError(`volume ${volume} already has a snapshot named ${name}`);
    // Without its space (rbd du, a Ceph client of its own): a snapshot just taken shares every object with the image.
    const made = (await rbdSnapList(this.identity, this.pool, image)).find((s) => s.name === name);
    if (!made) throw new LatchError(`rbd snap create ${this.spec(image)}@${name} succeeded, but rbd snap ls does not show it`);
    return { ...snapshotInfo(volume, made), ...(info.id !== undefined && made.id >= 0 && { id: `${info.id}@${made.id}` }) };
  }

  async listSnapshots(volume: string): Promise<SnapshotInfo[]> {
    const image = checkVolumeName(volume);
    const snaps = await rbdSnapList(this.identity, this.pool, image);
    const used = snaps.length > 0 ? await rbdUsage(this.identity, this.pool, image) : new Map<string, number>();
    return snaps.map((s) => {
      const usedBytes = used.get(s.name);
      return { ...snapshotInfo(volume, s), ...(usedBytes !== undefined && { allocatedBytes: usedBytes, exclusiveBytes: usedBytes }) };
    });
  }

  /** `rbd du` of the image itself: no object written, nothing used. */
  async isUnwritten(volume: string): Promise<boolean> {
    return (await rbdUsage(this.identity, this.pool, checkVolumeName(volume))).get('') === 0;
  }

  /**
   * The image's allocated extents, in order (`rbd diff --whole-object`, streamed: a line at a time, whatever the size);
   * everything else reads as zeros. Refuses a listing out of order or past the image's size.
   */
  async *allocatedExtents(volume: string): AsyncGenerator<{ offset: number; length: number }> {
    const image = checkVolumeName(volume);
    const info = await rbdInfo(this.identity, this.pool, image);
    if (info === undefined) throw new LatchError(`volume ${volume} has no image ${this.spec(image)}`);
    const child = rbdAllocation(this.identity, this.pool, image, Math.max(600_000, info.size / 1_000_000));
    try {
      let end = 0;
      for await (const line of createInterface({ input: child.stdout, crlfDelay: Infinity })) {
        const text = line.trim();
        if (text === '' || /^Offset\s+Length\s+Type$/.test(text)) continue;
        const m = /^(\d{1,16})\s+(\d{1,16})\s+(data|zero)$/.exec(text);
        const offset = Number(m?.[1]);
        const length = Number(m?.[2]);
        if (!m || offset < end || offset + length > info.size || !Number.isSafeInteger(offset + length)) {
          throw new LatchError(
            `rbd diff of ${this.spec(image)} listed ${JSON.stringify(text.slice(0, 80))}, not an extent in order within its size`,
          );
        }
        end = offset + length;
        // A `zero` extent (discarded) reads as zeros.
        if (m[3] === 'data' && length > 0) yield { offset, length };
      }
      await child.done;
    } finally {
      child.kill();
    }
  }

  /**
   * Each snapshot's name with `<image ID>@<snapshot ID>`: Ceph gives a snapshot ID once per pool, and an image ID once,
   * so no other snapshot, here or after the image was made again, has that pair (a snapshot without an ID is left out).
   */
  async snapshotIds(volume: string): Promise<Map<string, string>> {
    const image = checkVolumeName(volume);
    const [info, snaps] = await Promise.all([rbdInfo(this.identity, this.pool, image), rbdSnapList(this.identity, this.pool, image)]);
    const ids = new Map<string, string>();
    if (info?.id === undefined) return ids;
    for (const s of snaps) if (s.id >= 0) ids.set(s.name, `${info.id}@${s.id}`);
    return ids;
  }

  async deleteSnapshot(volume: string, name: string): Promise<void> {
    await rbdSnapRemove(this.identity, this.pool, checkVolumeName(volume), checkVolumeName(name, 'snapshot name', 200));
  }

  async openSnapshot(volume: string, name: string): Promise<ReadableImage> {
    const image = checkVolumeName(volume);
    checkVolumeName(name, 'snapshot name', 200);
    const snap = (await rbdSnapList(this.identity, this.pool, image)).find((s) => s.name === name);
    if (!snap) throw new LatchError(`volume ${volume} has no snapshot named ${name} (latch snapshot list ${volume})`);
    await mkdir(this.mountDir, { recursive: true, mode: 0o700 });
    const file = snapshotExportFile(this.mountDir, image, name);
    // An export reads the whole snapshot: allow it about 20 MB/s, and never less than 10 minutes.
    await rbdExportSnapshot(this.identity, this.pool, image, name, file, Math.max(600_000, snap.size / 20_000)).catch(
      async (err: unknown) => {
        await unlink(file).catch(() => undefined);
        throw err;
      },
    );
    return {
      path: file,
      description: `snapshot ${name} of volume ${volume} (${this.spec(image)}@${name}, exported)`,
      release: () => unlink(file).catch(() => undefined),
    };
  }

  /**
   * `rbd export-diff` of the snapshot (from `from`), streamed and parsed as it comes: librbd reads only the extents
   * the object map (or, without fast-diff, the objects' own listing) says are allocated or changed, straight from the
   * OSDs, and nothing is written on this node. Chosen over reads of those extents through the node's mapping: the
   * rbd-fuse client maps images, not snapshots, and one tool per backup costs no mapping to set up and tear down.
   */
  async snapshotDiff(volume: string, name: string, from: string | undefined): Promise<SnapshotDiff> {
    const image = checkVolumeName(volume);
    // Names from the ledger (a clone's snapshot) are checked as createSnapshot checked those it made.
    checkVolumeName(name, 'snapshot name', 200);
    if (from !== undefined) checkVolumeName(from, 'snapshot name', 200);
    const snap = (await rbdSnapList(this.identity, this.pool, image)).find((s) => s.name === name);
    if (!snap) throw new LatchError(`volume ${volume} has no snapshot named ${name} (latch snapshot list ${volume})`);
    // Bounded like an export of the whole snapshot: about 20 MB/s, and never less than 10 minutes.
    const child = rbdExportDiff(this.identity, this.pool, image, name, from, Math.max(600_000, snap.size / 20_000));
    let killed = false;
    const cancel = () => {
      killed = true;
      child.kill();
    };
    // A stream that ends early or makes no sense is most often the tool's failure: its error (redacted) comes first.
    const toolError = async (err: unknown): Promise<never> => {
      if (!killed) cancel();
      const failed = await child.done.then(
        () => undefined,
        (e: unknown) => e,
      );
      throw failed instanceof CommandError && failed.signal !== 'SIGKILL' ? failed : err;
    };
    const diff = await parseExportDiff(child.stdout).catch(toolError);
    if (diff.toSnap !== undefined && diff.toSnap !== name) {
      cancel();
      throw new LatchError(`rbd export-diff of ${this.spec(image)}@${name} reported snapshot ${diff.toSnap}`);
    }
    // A diff of another size, or from another start, describes some other image: whatever it says is not this snapshot.
    if (diff.sizeBytes !== snap.size || diff.fromSnap !== from) {
      cancel();
      throw new LatchError(
        `rbd export-diff of ${this.spec(image)}@${name} reported ${diff.sizeBytes} bytes` +
          (diff.fromSnap === undefined ? '' : ` from snapshot ${diff.fromSnap}`) +
          `, where the snapshot has ${snap.size}${from === undefined ? '' : ` and the diff starts at ${from}`}`,
      );
    }
    async function* records(): AsyncGenerator<DiffRecord> {
      try {
        yield* diff.records;
      } catch (err) {
        await toolError(err);
      }
    }
    return {
      sizeBytes: diff.sizeBytes,
      records: records(),
      description:
        `snapshot ${name} of volume ${volume} (${this.spec(image)}@${name}, ` +
        (from === undefined ? 'its allocated extents' : `the extents changed since ${from}`) +
        ', read with rbd export-diff)',
      finish: async () => {
        await child.done;
      },
      cancel,
    };
  }
}

/** A snapshot as `rbd snap ls` lists it, without its space. */
function snapshotInfo(volume: string, s: RbdSnapshot): SnapshotInfo {
  return {
    volume,
    name: s.name,
    createdAt: s.timestamp ? new Date(s.timestamp).toISOString() : '',
    sizeBytes: s.size,
    sharing: 'native',
  };
}

// The data plane on one node: where a volume's bytes live and how it becomes a block device.
// The ledger never calls this; the ops do, after the ledger says this node may.
import type { DiffRecord } from '../sys/rbd-diff.js';

export interface Backend {
  /** Where this backend keeps volumes' bytes, for messages: "the pool (/var/lib/latch/pool)", "the rbd pool latch". */
  readonly storage: string;
  /**
   * Where the images live when only this node reaches them (loop: the pool directory), so that the ledger records each
   * volume's home there (node/home.ts); undefined for storage every node reaches (rbd).
   */
  readonly localPool?: string;
  /** Creates the volume's storage of `sizeBytes`; Success if it already exists with at least that size. Refuses above maxSize or the pool's free space. */
  create(volume: string, sizeBytes: number): Promise<void>;
  /** Removes the volume's storage; refuses while a device is set up for it. Missing volume: no-op. */
  delete(volume: string): Promise<void>;
  /** Size in bytes, or undefined if the volume has no storage here. */
  size(volume: string): Promise<number | undefined>;
  /**
   * Sets up (or finds the already set up) block device of the volume and returns its path, e.g. /dev/loop3. Never two
   * devices for one volume. `access` is what the ledger granted this node; a backend on shared storage refuses a
   * read-write set-up while a client the ledger does not know of has the volume open.
   */
  attach(volume: string, access?: AttachAccess): Promise<string>;
  /** The device currently set up for the volume, if any. Reads the kernel's state, spawns nothing. */
  findDevice(volume: string): Promise<string | undefined>;
  /** Which volume a device belongs to (undefined when it is not one of ours). */
  volumeOfDevice(device: string): Promise<string | undefined>;
  /**
   * Whether anything of the volume's data path is left on this node: its device, and for a network backend the
   * client that serves it (a daemon, a mount), also a dead or hung one. Reads kernel state only.
   */
  hasMapping(volume: string): Promise<boolean>;
  /**
   * The storage client instance that serves the volume's device on this node, as the storage's fence names it
   * (Ceph: IP:PORT/NONCE), where the backend has such a thing and knows it. Recorded in the ledger at attach, so that
   * a fence can name it even after the client lost contact with the storage.
   */
  clientOf?(volume: string): Promise<string | undefined>;
  /**
   * The storage refuses this node's client of the volume (it was fenced): make everything that waits on that client
   * fail at once (for rbd-fuse, abort its FUSE connection), so that unmounting and releasing cannot hang on it.
   */
  cutOff?(volume: string): Promise<void>;
  /**
   * True only when the volume's set-up `device` provably reads as zeros from start to end, so that it holds no
   * filesystem, partition table or other signature, proven from kernel and file state without reading the device;
   * false when that is not proven (the caller then probes with blkid). Optional: a backend without it is probed.
   */
  isBlank?(volume: string, device: string): Promise<boolean>;
  /** Tears down the volume's device if it has one. Idempotent. Only ever touches devices backed by this pool. */
  release(volume: string): Promise<void>;
  /**
   * The volume's device is a loop device and nothing else: `umount -d` may free it with its last mount, in the
   * unmount's own child, and release() then finds nothing left to do.
   */
  readonly freedByUnmount?: boolean;
  /** Grows the storage to `sizeBytes` and refreshes the device's capacity if one is set up. Refuses to shrink. */
  grow(volume: string, sizeBytes: number): Promise<void>;
  /**
   * Whether nothing was ever written to the volume's storage (a volume just made reads zeros everywhere): a restore
   * onto it then writes only the data, and the storage stays thin. Absent or false: the restore zeroes the holes too.
   */
  isUnwritten?(volume: string): Promise<boolean>;
  /**
   * The volume's allocated extents, in order of offset (everything else reads as zeros), when the storage can tell:
   * a clone onto a volume already written zeroes only what is there (node/jobs/clone-copy.ts). Absent: all of it.
   */
  allocatedExtents?(volume: string): AsyncGenerator<{ offset: number; length: number }>;
}

/** What the ledger granted a node for one attach, as a backend on shared storage checks it (rbd.ts). */
export interface AttachAccess {
  readOnly: boolean;
  /**
   * Client instances that may still show on the volume without another writer being there: the one the ledger recorded
   * for this node (from before a crash), and those fenced off it (the storage refuses them).
   */
  knownClients: string[];
}

/**
 * The storage's side of a fence (docs/ledger.md, "Fences"): it makes the storage refuse every operation of a node's
 * client instances, so nothing that node still has can write once a volume moves away from it. Only the machines that
 * fence hold the rights it needs; nodes never do.
 */
export interface Fencer {
  /** What refuses the clients, for messages: "the Ceph cluster's OSD blocklist". */
  readonly kind: string;
  /**
   * The clients `fence` would make the storage refuse, without changing anything: `known` and every other client that
   * has the volume open or locked, except `spare`. Throws when the storage cannot say, or names a client in a form that
   * cannot be fenced.
   */
  find(volume: string, known: string[], spare: string[]): Promise<string[]>;
  /**
   * Makes the storage refuse the clients `known` (recorded in the ledger for the node) and every other client that has
   * the volume open or locked, except `spare` (the recorded clients of the other nodes that legitimately hold it).
   * Returns every client it made the storage refuse, each confirmed; throws as `find` does. Repeating it is harmless.
   */
  fence(volume: string, known: string[], spare: string[]): Promise<string[]>;
  /** Lets the storage serve those clients again (after the node has cleared its mapping). Repeating it is harmless. */
  lift(clients: string[]): Promise<void>;
}

/** A point-in-time copy of a volume, as `latch snapshot list` shows it. */
export interface SnapshotInfo {
  volume: string;
  name: string;
  createdAt: string;
  /** The volume's size when the snapshot was taken. */
  sizeBytes: number;
  /**
   * How it shares space with the volume: 'reflink' (a copy-on-write clone of the image: costs only what changes
   * afterwards), 'copy' (a sparse full copy: the pool's filesystem cannot clone), 'native' (the storage's own).
   */
  sharing: 'reflink' | 'copy' | 'native';
  /** Bytes it occupies, shared ones included (loop: st_blocks), when known. */
  allocatedBytes?: number;
  /** Of those, bytes no other file shares (what deleting it frees), when known. */
  exclusiveBytes?: number;
  /** The storage's own ID of the snapshot, when createSnapshot knows it (see SnapshotBackend.snapshotIds). */
  id?: string;
}

/** A readable file or device with a snapshot's (or an idle volume's) bytes, and how to let go of it. */
export interface ReadableImage {
  path: string;
  /** What it is, in words, for a backup's manifest. */
  description: string;
  release(): Promise<void>;
}

/**
 * Snapshots: optional, a backend without them cannot take snapshots or back up a volume in use. Point-in-time only at
 * the storage level: making the filesystem consistent (fsfreeze) is the caller's (node/snapshot.ts).
 */
export interface SnapshotBackend {
  /** Takes snapshot `name` of the volume; refuses a name that is taken. Never leaves a half-made snapshot visible. */
  createSnapshot(volume: string, name: string): Promise<SnapshotInfo>;
  /**
   * Whether createSnapshot cuts its point-in-time copy at once (a reflink, the storage's own snapshot) rather than by
   * copying the whole image; absent: always at once. Only such a snapshot is taken with the filesystem frozen.
   */
  instantSnapshots?(volume: string): Promise<boolean>;
  /** The volume's snapshots, oldest first, with their real space. */
  listSnapshots(volume: string): Promise<SnapshotInfo[]>;
  /** Removes it; a missing snapshot is fine. */
  deleteSnapshot(volume: string, name: string): Promise<void>;
  /** Its bytes as a readable file or device, for a backup. */
  openSnapshot(volume: string, name: string): Promise<ReadableImage>;
  /**
   * The volume's own storage as a readable file while no device is set up for it, when the backend has one (loop:
   * the image file); undefined when it has not (then back up through a snapshot).
   */
  idleImage?(volume: string): Promise<ReadableImage | undefined>;
  /**
   * The extents of snapshot `name` that changed since snapshot `from` (or, without `from`, that are allocated), read
   * from the storage as a stream: a backend that can (rbd) backs volumes up incrementally without a local copy
   * (node/backup.ts). Absent: backups read the whole snapshot (openSnapshot).
   */
  snapshotDiff?(volume: string, name: string, from: string | undefined): Promise<SnapshotDiff>;
  /**
   * The volume's snapshots, oldest first, each name with the storage's own ID of the snapshot: never the ID of
   * another snapshot, nor of one taken again under the same name (rbd: the image's ID and the snapshot's). Without
   * their space (listSnapshots asks for that too). An incremental backup is built only on the very snapshot its
   * previous backup was read from (node/backup.ts).
   */
  snapshotIds?(volume: string): Promise<Map<string, string>>;
}

/**
 * The names of the snapshots incremental backups keep as the base of a volume's next backup (node/backup.ts): they
 * serve nothing else, so deleting the volume deletes them with it.
 */
export const BACKUP_BASE_PREFIX = 'latch-base-';

/** A snapshot's extents as the storage reports them (SnapshotBackend.snapshotDiff). */
export interface SnapshotDiff {
  sizeBytes: number;
  /** In order of offset; throws when the storage's tool failed. */
  records: AsyncGenerator<DiffRecord>;
  /** What is read, in words, for a backup's manifest. */
  description: string;
  /** After the last record: waits for the tool to exit, and throws when it failed. */
  finish(): Promise<void>;
  /** Stops reading early. */
  cancel(): void;
}

/** Whether the backend can take snapshots. */
export function hasSnapshots(backend: Backend): backend is Backend & SnapshotBackend {
  const b = backend as Partial<SnapshotBackend>;
  return typeof b.createSnapshot === 'function' && typeof b.listSnapshots === 'function';
}

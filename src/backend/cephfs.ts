// Shared (ReadWriteMany) volumes: CephFS subvolumes of latch's group, each with its size as the subvolume's quota
// (ceph.quota.max_bytes), mounted on a node by its own cephx identity. Not a Backend: a shared volume has no block
// device, no filesystem of latch's making and no exclusive owner; the ledger grants it to every node that asks
// (ledger/shared.ts) and each node mounts the subvolume itself.
//
// A node's mount is found from kernel state only, as the block backends' mappings are:
//  - ceph-fuse (CephFuseClient): the FUSE mount in mountinfo (fsType fuse.ceph-fuse) and the ceph-fuse process whose
//    command line ends with that mount point and names the subvolume's path (--client_mountpoint). A ceph-fuse that
//    no longer answers (SIGSTOPped, partitioned) hangs whatever stats its mount: nothing here does so outside
//    guardFuse, and unmounting aborts the FUSE connection through fusectl when umount does not finish in time.
//  - the kernel client (KernelCephClient in cephfs-kernel.ts, where the kernel has the ceph module; tested against a
//    fake here): `mount -t ceph :PATH TARGET -o name=ID,secretfile=F,mds_namespace=FS,conf=C`, found in mountinfo as
//    fsType ceph whose source ends with the subvolume's path and whose options name the node's identity.
import { mkdir, readdir, readFile, rm, rmdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { readFileSync } from 'node:fs';
import type { CephFsClientKind, CephFsClientSetting, CephFsConfig, Config } from '../config.js';
import { LatchError } from '../errors.js';
import {
  cephFuseClientAddress,
  cloneCancel,
  cloneStatus,
  subvolumeSnapshotClone,
  type CloneStatus,
  isSubvolumePath,
  readClientRecord,
  startCephFuse,
  subvolumeCreate,
  subvolumeInfo,
  subvolumeRemove,
  subvolumeResize,
  subvolumeSnapshotCreate,
  subvolumeSnapshotRemove,
  subvolumeSnapshots,
  type SubvolumeRef,
} from '../sys/cephfs.js';
import type { SharedClient, SharedMount } from './cephfs-client.js';
import { KernelCephClient } from './cephfs-kernel.js';
import { sharedClientRecord } from './cephfs-sessions.js';
import { abortFuseConnection, fuseMountsAt, guardFuse, killAndWait, waitForExit } from '../sys/fuse.js';
import { readMountInfo, type MountInfo } from '../sys/mounts.js';
import type { CephIdentity } from '../sys/rbd.js';
import { run } from '../sys/run.js';
import type { SnapshotInfo } from './types.js';

export interface SharedVolumesOptions {
  identity: CephIdentity;
  cephfs: CephFsConfig;
  client: SharedClient;
  maxSize: number;
  timeoutMs: number;
}

export class SharedVolumes {
  constructor(private readonly options: SharedVolumesOptions) {}

  get storage(): string {
    return `the CephFS file system ${this.options.cephfs.fsName} (subvolume group ${this.options.cephfs.group})`;
  }

  private ref(volume: string): SubvolumeRef {
    return { fsName: this.options.cephfs.fsName, group: this.options.cephfs.group, volume };
  }

  /** Creates the subvolume with its quota; an existing one is fine when its quota is at least `sizeBytes`. */
  async create(volume: string, sizeBytes: number): Promise<void> {
    if (sizeBytes > this.options.maxSize) {
      throw new LatchError(`volume ${volume}: ${sizeBytes} bytes is above the configured maxSize of ${this.options.maxSize} bytes`);
    }
    const existing = await subvolumeInfo(this.options.identity, this.ref(volume));
    if (existing === undefined) await subvolumeCreate(this.options.identity, this.ref(volume), sizeBytes);
    const info = await subvolumeInfo(this.options.identity, this.ref(volume));
    if (info === undefined) throw new LatchError(`the subvolume of volume ${volume} vanished right after it was created; try again`);
    if (info.quotaBytes !== undefined && info.quotaBytes < sizeBytes) {
      throw new LatchError(`volume ${volume} exists in ${this.storage} with a quota of ${info.quotaBytes} bytes, below ${sizeBytes}`);
    }
  }

  /** The quota in bytes, or undefined when the subvolume does not exist. */
  async size(volume: string): Promise<number | undefined> {
    return (await subvolumeInfo(this.options.identity, this.ref(volume)))?.quotaBytes;
  }

  /** Bytes used and the quota, for metrics and doctor. */
  async usage(volume: string): Promise<{ usedBytes: number; quotaBytes: number | undefined } | undefined> {
    const info = await subvolumeInfo(this.options.identity, this.ref(volume));
    return info && { usedBytes: info.usedBytes, quotaBytes: info.quotaBytes };
  }

  /** Raises the quota to `sizeBytes` (never lowers it): every node's mount sees the new size at once. */
  async grow(volume: string, sizeBytes: number): Promise<void> {
    if (sizeBytes > this.options.maxSize) {
      throw new LatchError(`volume ${volume}: ${sizeBytes} bytes is above the configured maxSize of ${this.options.maxSize} bytes`);
    }
    const info = await subvolumeInfo(this.options.identity, this.ref(volume));
    if (info === undefined) throw new LatchError(`volume ${volume} has no subvolume in ${this.storage}`);
    if (info.quotaBytes !== undefined && info.quotaBytes > sizeBytes) {
      throw new LatchError(`volume ${volume} is ${info.quotaBytes} bytes; latch never shrinks a volume`);
    }
    if (info.quotaBytes !== sizeBytes) await subvolumeResize(this.options.identity, this.ref(volume), sizeBytes);
  }

  /** Removes the subvolume and its data; a missing one is fine. Refused while this node has it mounted. */
  async delete(volume: string): Promise<void> {
    if (await this.mountedHere(volume)) throw new LatchError(`volume ${volume} is mounted on this node; unmount it first`);
    await subvolumeRemove(this.options.identity, this.ref(volume));
  }

  // ---- snapshots: CephFS subvolume snapshots, cut by the MDS whatever mounts the volume (no freeze, no device) ----

  /** Takes snapshot `name`; refuses a name that is taken. */
  async createSnapshot(volume: string, name: string): Promise<SnapshotInfo> {
    const ref = this.ref(volume);
    const size = await this.size(volume);
    if (size === undefined && (await subvolumeInfo(this.options.identity, ref)) === undefined) {
      throw new LatchError(`volume ${volume} has no subvolume in ${this.storage}`);
    }
    // The volumes module answers success for a name that is taken: look first.
    const taken = (await this.listSnapshots(volume)).some((s) => s.name === name);
    if (taken || !(await subvolumeSnapshotCreate(this.options.identity, ref, name))) {
      throw new LatchError(`volume ${volume} already has a snapshot named ${name}`);
    }
    const made = (await this.listSnapshots(volume)).find((s) => s.name === name);
    if (!made) throw new LatchError(`snapshot ${name} of volume ${volume} is not listed right after it was taken`);
    return made;
  }

  async listSnapshots(volume: string): Promise<SnapshotInfo[]> {
    const quota = await this.size(volume);
    return (await subvolumeSnapshots(this.options.identity, this.ref(volume))).map((s) => ({
      volume,
      name: s.name,
      createdAt: s.createdAt,
      sizeBytes: quota ?? s.sizeBytes,
      sharing: 'native' as const,
      allocatedBytes: s.sizeBytes,
    }));
  }

  async deleteSnapshot(volume: string, name: string): Promise<void> {
    await subvolumeSnapshotRemove(this.options.identity, this.ref(volume), name);
  }

  // ---- clones: the manager copies a snapshot into a new subvolume of the group, in the background ----------------

  /** Starts cloning snapshot `snap` of `source` into new subvolume `target`; false when `target` exists already. */
  startClone(source: string, snap: string, target: string): Promise<boolean> {
    return subvolumeSnapshotClone(this.options.identity, this.ref(source), snap, target);
  }

  /** How the clone into `target` goes; undefined when no subvolume `target` exists; throws when it is no clone. */
  cloneStatus(target: string): Promise<CloneStatus | undefined> {
    return cloneStatus(this.options.identity, this.ref(target));
  }

  /** Cancels the clone into `target` (a clone past its deadline). */
  cancelClone(target: string): Promise<void> {
    return cloneCancel(this.options.identity, this.ref(target));
  }

  /** Removes what a failed or canceled clone left under `target` (the manager wants --force for it). */
  removeFailedClone(target: string): Promise<void> {
    return subvolumeRemove(this.options.identity, this.ref(target), { force: true });
  }

  // ---- a job's own mount (backup, restore): beside any mount of a pod, with an admin socket of its own ------------

  /**
   * Mounts the volume's subvolume at `target` for a job of this node (read-only for a backup) and returns its client
   * as the ledger records it (recordOf), so that a fence can cut a restore's writes off. A mount of it left at `target`
   * by an interrupted job is taken down first.
   */
  async mountForJob(volume: string, target: string, options: { readOnly: boolean }): Promise<string | undefined> {
    const info = await subvolumeInfo(this.options.identity, this.ref(volume));
    if (info === undefined) throw new LatchError(`volume ${volume} has no subvolume in ${this.storage}`);
    if (await this.options.client.mountAt(target)) await this.options.client.unmount(target);
    await mkdir(this.options.cephfs.mountDir, { recursive: true, mode: 0o700 });
    await mkdir(target, { recursive: true, mode: 0o700 });
    const adminSocket = join(this.options.cephfs.mountDir, `${volume}.job.asok`);
    await this.options.client.mount(info.path, target, { readOnly: options.readOnly, adminSocket });
    if (this.options.client.kind !== 'ceph-fuse') return this.recordOf(undefined);
    return this.recordOf(await cephFuseClientAddress(adminSocket, Math.min(this.options.timeoutMs, 10_000)));
  }

  /**
   * A client of this node as the ledger records it for a fence (status.nodes.<node>.client): the node's cephx entity,
   * which names every session of its on the MDS (the kernel client's too), with the client instance where the client
   * names it (`entity:ID@IP:PORT/NONCE`, cephfs-sessions.ts).
   */
  private recordOf(address: string | undefined): string | undefined {
    return sharedClientRecord(this.options.identity.clientId, address);
  }

  /**
   * Takes a job's mount down (a hung or fenced one too: its FUSE connection is aborted). `hung`: the job's watchdog
   * aborted it, so its client is killed at once instead of being given commandTimeout to end cleanly.
   */
  async unmountForJob(target: string, options: { hung?: boolean } = {}): Promise<void> {
    await this.options.client.unmount(target, options);
    await rmdir(target).catch(() => undefined);
  }

  /** Where this node mounts the volume for its jobs: node-private, beside the admin sockets. */
  jobMountPath(volume: string): string {
    return join(this.options.cephfs.mountDir, 'jobs', volume);
  }

  private clientFile(volume: string): string {
    return join(this.options.cephfs.mountDir, `${volume}.client`);
  }

  private adminSocket(volume: string): string {
    return join(this.options.cephfs.mountDir, `${volume}.asok`);
  }

  /**
   * Mounts the volume's subvolume at `target` (or finds it mounted there) and returns its client as the ledger records
   * it for a fence (recordOf: the node's entity, and the client instance where the client names one, ceph-fuse from
   * its admin socket).
   * Refuses a target where something else is mounted. A dead client's mount there is taken down first.
   */
  async mountAt(volume: string, target: string, options: { readOnly: boolean }): Promise<string | undefined> {
    const ref = this.ref(volume);
    const found = await this.options.client.mountAt(target);
    if (found?.root !== undefined) {
      if (!isSubvolumePath(found.root, ref)) throw new LatchError(`${target} has ${found.root} mounted, not volume ${volume}`);
      // A call killed after its mount and before it noted the client left no note: the live client is asked again, so
      // that the ledger's record names its instance, as after a whole call.
      if ((await readClientRecord(this.clientFile(volume))) === undefined) {
        const address = await this.clientAddressNow(volume).catch(() => undefined);
        if (address !== undefined) await writeFile(this.clientFile(volume), `${address}\n`, { mode: 0o600 });
      }
      return this.clientOf(volume);
    }
    if (found) await this.options.client.unmount(target); // its client died: nothing serves that mount any more
    const info = await subvolumeInfo(this.options.identity, ref);
    if (info === undefined) throw new LatchError(`volume ${volume} has no subvolume in ${this.storage}`);
    await mkdir(this.options.cephfs.mountDir, { recursive: true, mode: 0o700 });
    await mkdir(target, { recursive: true, mode: 0o700 });
    await rm(this.clientFile(volume), { force: true });
    await this.options.client.mount(info.path, target, { readOnly: options.readOnly, adminSocket: this.adminSocket(volume) });
    const address = await this.clientAddressNow(volume);
    if (address !== undefined) await writeFile(this.clientFile(volume), `${address}\n`, { mode: 0o600 });
    return this.recordOf(address);
  }

  private async clientAddressNow(volume: string): Promise<string | undefined> {
    if (this.options.client.kind !== 'ceph-fuse') return undefined;
    return cephFuseClientAddress(this.adminSocket(volume), Math.min(this.options.timeoutMs, 10_000));
  }

  /** This node's client as the ledger records it before any mount: its cephx entity alone (`entity:ID`). */
  entityRecord(): string | undefined {
    return this.recordOf(undefined);
  }

  /** This node's client of the volume as the ledger records it, with the instance noted when it was mounted here. */
  async clientOf(volume: string): Promise<string | undefined> {
    return this.recordOf(await readClientRecord(this.clientFile(volume)));
  }

  /** The shared volume mounted at `target` on this node (mountinfo and /proc only), or undefined. */
  async volumeAt(target: string, table?: MountInfo[]): Promise<{ volume: string | undefined; mount: MountInfo } | undefined> {
    const found = await this.options.client.mountAt(target, table);
    if (!found) return undefined;
    const prefix = `/volumes/${this.options.cephfs.group}/`;
    const volume = found.root?.startsWith(prefix) ? found.root.slice(prefix.length).split('/')[0] : undefined;
    return { volume, mount: found.mount };
  }

  /** This node's own mounts of shared volumes (its identity's), with the volume each serves: what doctor compares. */
  async ownMounts(): Promise<{ target: string; volume: string | undefined }[]> {
    const prefix = `/volumes/${this.options.cephfs.group}/`;
    return (await this.options.client.mounts()).map((m) => ({
      target: m.target,
      volume: m.root.startsWith(prefix) ? m.root.slice(prefix.length).split('/')[0] : undefined,
    }));
  }

  /** Which client this node mounts with. */
  get clientKind(): CephFsClientKind {
    return this.options.client.kind;
  }

  /** Whether this node has any mount of the volume's subvolume (its client's own mount point, not the binds). */
  async mountedHere(volume: string): Promise<boolean> {
    return (await this.options.client.mounts()).some((m) => isSubvolumePath(m.root, this.ref(volume)));
  }

  /** Unmounts the client's mount at `target` (hung or dead ones too) and forgets its client record. */
  async unmountAt(volume: string, target: string): Promise<void> {
    await this.options.client.unmount(target);
    if (!(await this.mountedHere(volume))) await rm(this.clientFile(volume), { force: true });
  }

  /** Unmounts every bind of a shared volume stacked at `path` (a pod dir): never the client's own mount. */
  async unmountBind(path: string): Promise<void> {
    for (let i = 0; i < 16; i++) {
      const top = (await readMountInfo()).filter((m) => m.mountPoint === path).at(-1);
      if (!top || (top.fsType !== 'fuse.ceph-fuse' && top.fsType !== 'ceph')) return;
      try {
        await guardFuse(path, this.options.timeoutMs, (childTimeoutMs) => run('umount', [path], { timeoutMs: childTimeoutMs }));
      } catch (err) {
        // A hung client: its connection is aborted now (which may have let the umount through); what is left goes lazily.
        const still = (await readMountInfo()).some((m) => m.mountPoint === path && m.majorMinor === top.majorMinor);
        if (!still) continue;
        try {
          await run('umount', ['--lazy', path], { timeoutMs: 10_000 });
        } catch {
          throw err;
        }
      }
    }
  }

  /** The cluster refuses this node's client (fenced): waits on its mount at `target` end at once. */
  async cutOff(target: string): Promise<void> {
    await this.options.client.abort(target);
  }
}

// ---- ceph-fuse ---------------------------------------------------------------------------------------------------

/** The live ceph-fuse processes, each with its mount point (its last argument) and the path it mounts. */
async function cephFuseProcesses(): Promise<{ pid: number; mountPoint: string; root: string | undefined; id: string | undefined }[]> {
  const found: { pid: number; mountPoint: string; root: string | undefined; id: string | undefined }[] = [];
  for (const entry of await readdir('/proc')) {
    if (!/^[0-9]+$/.test(entry) || Number(entry) === process.pid) continue;
    let argv: string[];
    try {
      argv = (await readFile(`/proc/${entry}/cmdline`, 'utf8')).split('\0').filter((a) => a !== '');
    } catch {
      continue;
    }
    if (!(argv[0] ?? '').endsWith('ceph-fuse')) continue;
    const state = await readFile(`/proc/${entry}/stat`, 'utf8').catch(() => '');
    const s = state.slice(state.lastIndexOf(')') + 2).split(' ')[0];
    if (s === undefined || s === 'Z' || s === 'X' || s === '') continue;
    const at = argv.indexOf('--client_mountpoint');
    const id = argv.indexOf('--id');
    found.push({
      pid: Number(entry),
      mountPoint: argv.at(-1) ?? '',
      root: at >= 0 ? argv[at + 1] : undefined,
      id: id >= 0 ? argv[id + 1] : undefined,
    });
  }
  return found;
}

class CephFuseClient implements SharedClient {
  readonly kind = 'ceph-fuse';

  constructor(
    private readonly identity: CephIdentity,
    private readonly fsName: string,
    private readonly timeoutMs: number,
  ) {}

  async mount(root: string, target: string, options: { readOnly: boolean; adminSocket: string }): Promise<void> {
    await rm(options.adminSocket, { force: true });
    await startCephFuse({ identity: this.identity, fsName: this.fsName, root, mountPoint: target, ...options, timeoutMs: this.timeoutMs });
    if (!(await this.mountAt(target)))
      throw new LatchError(`ceph-fuse exited as if it had mounted ${target}, but mountinfo shows no mount there`);
  }

  async mountAt(target: string, table?: MountInfo[]): Promise<SharedMount | undefined> {
    const mounts = (await fuseMountsAt(target, table)).filter((m) => m.fsType === 'fuse.ceph-fuse');
    const mount = mounts[0];
    if (!mount) return undefined;
    // A bind of the client's mount (a pod dir) has the same device: the process is the one at the client's mount point.
    const all = table ?? (await readMountInfo());
    for (const p of await cephFuseProcesses()) {
      const own = all.find((m) => m.mountPoint === p.mountPoint && m.fsType === 'fuse.ceph-fuse');
      if (own && own.majorMinor === mount.majorMinor) return { mount, root: p.root, pid: p.pid };
    }
    return { mount, root: undefined };
  }

  async unmount(target: string, options: { hung?: boolean } = {}): Promise<void> {
    for (let i = 0; i < 8; i++) {
      const found = await this.mountAt(target);
      if (!found) break;
      // A hung client would not end by itself after even a clean unmount: it is not waited for.
      let clean = options.hung !== true;
      try {
        await guardFuse(target, this.timeoutMs, (childTimeoutMs) => run('umount', [target], { timeoutMs: childTimeoutMs }));
      } catch {
        // Hung or fenced: abort its connection, so that nothing waits on it, then unmount what is left.
        clean = false;
        await abortFuseConnection(found.mount).catch(() => undefined);
        await run('umount', [target], { timeoutMs: 10_000 })
          .catch(() => run('umount', ['--lazy', target], { timeoutMs: 10_000 }))
          .catch(async (err: unknown) => {
            // Gone meanwhile (a dying ceph-fuse takes its own mount down: CI saw "not mounted" here): nothing is left.
            if ((await fuseMountsAt(target)).some((m) => m.majorMinor === found.mount.majorMinor)) throw err;
          });
      }
      if (found.pid === undefined) continue;
      // After a clean unmount ceph-fuse writes back what it still holds and exits by itself: it is given the time.
      const left = clean ? await waitForExit([found.pid], this.timeoutMs) : [found.pid];
      if (left.length > 0) await killAndWait(left, 5_000);
    }
    // A client whose mount is gone but that still runs (killed midway): it serves nothing.
    const stale = (await cephFuseProcesses()).filter((p) => p.mountPoint === target).map((p) => p.pid);
    if (stale.length > 0) await killAndWait(stale, 5_000);
  }

  async abort(target: string): Promise<void> {
    for (const m of await fuseMountsAt(target)) await abortFuseConnection(m);
  }

  async mounts(): Promise<{ target: string; root: string }[]> {
    // By this node's identity: simulated nodes on one host (tests, demo) each mount as their own.
    const table = await readMountInfo();
    return (await cephFuseProcesses())
      .filter((p) => p.id === this.identity.clientId && p.root !== undefined)
      .filter((p) => table.some((m) => m.mountPoint === p.mountPoint && m.fsType === 'fuse.ceph-fuse'))
      .map((p) => ({ target: p.mountPoint, root: p.root ?? '' }));
  }
}

// ---- the configured shared volumes ---------------------------------------------------------------------------------

/** The shared volumes of the configuration, or undefined where it configures none (no backend.cephfs). */
export function sharedVolumesFor(config: Pick<Config, 'backend' | 'maxSize' | 'commandTimeout'>): SharedVolumes | undefined {
  const rbd = config.backend;
  if (rbd.type !== 'rbd' || rbd.cephfs === undefined) return undefined;
  const timeoutMs = config.commandTimeout * 1000;
  // Every ceph call as this identity (subvolume info, create, resize, snapshots) gets the configured deadline.
  const identity = { cephConf: rbd.cephConf, clientId: rbd.clientId, keyring: rbd.keyring, commandTimeoutMs: timeoutMs };
  const kind = chooseCephFsClient(rbd.cephfs.client);
  const client =
    kind === 'kernel'
      ? new KernelCephClient({ identity, fsName: rbd.cephfs.fsName, mountDir: rbd.cephfs.mountDir, timeoutMs })
      : new CephFuseClient(identity, rbd.cephfs.fsName, timeoutMs);
  return new SharedVolumes({ identity, cephfs: rbd.cephfs, client, maxSize: config.maxSize, timeoutMs });
}

/** "auto": the kernel client where the kernel has CephFS (loaded: /proc/filesystems), else ceph-fuse. */
export function chooseCephFsClient(setting: CephFsClientSetting, filesystems = '/proc/filesystems'): CephFsClientKind {
  if (setting !== 'auto') return setting;
  let text = '';
  try {
    text = readFileSync(filesystems, 'utf8');
  } catch {
    // no procfs: ceph-fuse
  }
  return /^\S*\s+ceph$/m.test(text) ? 'kernel' : 'ceph-fuse';
}

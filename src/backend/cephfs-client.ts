// How a node mounts a shared volume's subvolume (backend/cephfs.ts): the interface ceph-fuse (cephfs.ts) and the
// kernel client (cephfs-kernel.ts) implement, each finding its mounts from kernel state only.
import type { CephFsClientKind } from '../config.js';
import type { MountInfo } from '../sys/mounts.js';

/** A shared volume's mount on this node, as the kernel shows it. */
export interface SharedMount {
  mount: MountInfo;
  /** The subvolume's path it mounts; undefined when its client is gone (a dead ceph-fuse leaves its mount). */
  root: string | undefined;
  /** The client's process, for ceph-fuse. */
  pid?: number;
}

/** How a node mounts a subvolume: ceph-fuse here, the kernel client where the ceph module is. */
export interface SharedClient {
  readonly kind: CephFsClientKind;
  /**
   * Mounts the subvolume at `root` on `target`. Every mount shows, sets and checks POSIX ACLs, a pod's as a job's
   * (a backup keeps them, a restore sets them): the kernel client does by default (its `acl` option), ceph-fuse is
   * told to.
   */
  mount(root: string, target: string, options: { readOnly: boolean; adminSocket: string }): Promise<void>;
  /** The client's mount at `target` (the bottom one), from mountinfo and /proc only. */
  mountAt(target: string, table?: MountInfo[]): Promise<SharedMount | undefined>;
  /**
   * Unmounts `target`, also when its client is dead or hung. Idempotent. `hung`: the caller found the client hung (a
   * job's stall watchdog aborted its connection), so it is not given time to end cleanly.
   */
  unmount(target: string, options?: { hung?: boolean }): Promise<void>;
  /** Every wait on the mount fails at once from now on (fenced: the cluster refuses the client). */
  abort(target: string): Promise<void>;
  /** The live mounts of this node's identity: where, and which path of the file system. */
  mounts(): Promise<{ target: string; root: string }[]>;
}

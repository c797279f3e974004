// What the node services need of this host's kernel, as one interface: the mount table, mount and unmount,
// filesystems on devices, and the process's capabilities. `hostSystem` is the real one; unit tests pass a fake, so
// every op's decisions run without root.
import { growFs, makeFs, probeFsType } from './blockdev.js';
import { effectiveCapabilities } from './capabilities.js';
import { bindMount, isDeviceMounted, mount, mountsAt, readMountInfo, umount, type MountInfo, type MountOptions } from './mounts.js';

export interface System {
  readMountInfo(): Promise<MountInfo[]>;
  /** The mounts stacked exactly at `path`, bottom first (from `table` when given). */
  mountsAt(path: string, table?: MountInfo[]): Promise<MountInfo[]>;
  mount(device: string, path: string, options: MountOptions): Promise<void>;
  bindMount(source: string, target: string, readOnly: boolean): Promise<void>;
  /**
   * Unmounts the topmost mount at `path`; false when nothing was mounted there. With freeLoopDevice, a loop device
   * mounted there is detached too (`umount -d`; the kernel defers that while anything else has it open).
   */
  umount(path: string, options?: { freeLoopDevice?: boolean }): Promise<boolean>;
  isDeviceMounted(device: string): Promise<boolean>;
  probeFsType(device: string): Promise<string | undefined>;
  makeFs(device: string, fsType: string): Promise<void>;
  growFs(device: string, mountPoint: string, fsType: string): Promise<void>;
  effectiveCapabilities(): Promise<bigint | undefined>;
}

/** This host's system, each child it runs bounded by `commandTimeoutMs` (the configuration's commandTimeout). */
export function hostSystem(commandTimeoutMs: number): System {
  const timeout = { timeoutMs: commandTimeoutMs };
  return {
    readMountInfo,
    mountsAt,
    mount: (device, path, options) => mount(device, path, options, timeout),
    bindMount: (source, target, readOnly) => bindMount(source, target, readOnly, timeout),
    umount: (path, options) => umount(path, { ...options, ...timeout }),
    isDeviceMounted,
    probeFsType: (device) => probeFsType(device, timeout),
    makeFs: (device, fsType) => makeFs(device, fsType, timeout),
    growFs: (device, mountPoint, fsType) => growFs(device, mountPoint, fsType, timeout),
    effectiveCapabilities,
  };
}

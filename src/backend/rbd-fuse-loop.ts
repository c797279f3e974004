// The rbd-fuse + loop node client: one `rbd-fuse -r IMAGE` daemon per volume, mounted at <mountDir>/<image> (so the
// instance opens and watches that image alone, and a fence of it touches no other volume), and a loop device with
// --direct-io=on over <mountDir>/<image>/<image> (no second copy of the data in the page cache).
//
// What is mapped is read from the kernel, never remembered: the FUSE mount from /proc/self/mountinfo, the daemon from
// /proc/PID/cmdline, the loop device from /sys/block/loopN/loop/backing_file. deviceOf and imageOf read nothing
// else: a fenced rbd-fuse hangs every stat of its mount, beyond any signal. Whatever must touch the mount (the stat
// that waits for the image file, losetup, umount) runs in a child under guardFuse, which aborts the connection
// through fusectl when it overruns, so no driver call hangs on it.
import { mkdir, realpath, rm, rmdir } from 'node:fs/promises';
import { basename } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { LatchError, errorMessage } from '../errors.js';
import { waitNoFilesystemLeft } from '../sys/blockdev.js';
import {
  abortFuseConnection,
  fuseMountsAt,
  rbdFuseGlobalIds,
  guardFuse,
  guardedFileSize,
  guardedUnmount,
  killAndWait,
  rbdFusePids,
  startRbdFuse,
  waitForExit,
} from '../sys/fuse.js';
import {
  detachLoop,
  listLoopDevices,
  loopDeviceInfo,
  loopNumber,
  loopSizeBytes,
  refreshLoopCapacity,
  setupLoop,
  type LoopDevice,
} from '../sys/loop.js';
import { mountedSources } from '../sys/mounts.js';
import { isClientInstance, rbdConfigOverride, rbdWatcherList, type CephIdentity } from '../sys/rbd.js';
import { run } from '../sys/run.js';
import { deviceToUse, keepOneDevice } from './devices.js';
import type { NodeClient } from './node-client.js';
import { fuseImageFile, fuseLogDir, fuseLogFile, fuseMountPoint, imageOfFuseFile } from './rbd-layout.js';

export interface RbdFuseLoopOptions {
  identity: CephIdentity;
  pool: string;
  mountDir: string;
  timeoutMs: number;
}

// A healthy rbd-fuse answers in milliseconds; one that has not answered in this long is dead or fenced, and the call
// should fail (and abort it) well before kubelet's own limits. One legitimate wait is longer: after a client holding
// the image's exclusive lock died unfenced, a new one's first I/O waits until the OSD drops the dead one's watch
// (osd_client_watch_timeout, 30 s; docs/design/rbd-backend.md h). A shorter guard kills the new daemon just as the
// lock frees, and the next call waits all over again.
const MAX_FUSE_WAIT_MS = 45_000;
// After a clean umount rbd-fuse exits by itself, in 0.2-1.2 s here; a killed one takes up to ~1.4 s to go.
const EXIT_WAIT_MS = 5_000;
const LOOP_GONE_WAIT_MS = 5_000;
// rbd-fuse's log thread writes its lines within milliseconds; the image's watch is there once its file showed.
const CLIENT_REPORT_WAIT_MS = 5_000;

export class RbdFuseLoopClient implements NodeClient {
  readonly kind = 'rbd-fuse+loop';
  private readonly fuseTimeoutMs: number;
  private canonicalDir: string | undefined;

  constructor(private readonly options: RbdFuseLoopOptions) {
    this.fuseTimeoutMs = Math.min(options.timeoutMs, MAX_FUSE_WAIT_MS);
  }

  async map(image: string, _mode?: { readOnly: boolean }): Promise<string> {
    const dir = await this.mountDir(true);
    if (dir === undefined) throw new LatchError(`cannot create the rbd mount directory ${this.options.mountDir}`);
    const mountPoint = fuseMountPoint(dir, image);
    const file = fuseImageFile(dir, image);
    const existing = await this.devicesOf(file);
    if (existing.length > 0) {
      if ((await rbdFusePids(mountPoint)).length === 1 && (await fuseMountsAt(mountPoint)).length === 1) return this.keepOne(existing);
      const mounted = await mountedSources();
      if (existing.some((d) => mounted.has(d.device))) return this.keepOne(existing); // in use: not this call's to judge
      // A device over a mount whose daemon is gone (killed, crashed, or aborted by a call that died before cleaning
      // up) answers nothing but errors: start over.
      await this.unmap(image);
    }

    await this.ensureMount(dir, image);
    try {
      await this.waitForImageFile(mountPoint, file);
      // Another process may have set one up meanwhile only if it ignored the mapping lock; check again anyway.
      if ((await this.devicesOf(file)).length === 0) {
        await guardFuse(mountPoint, this.fuseTimeoutMs, (timeoutMs) => setupLoop(file, { directIo: true, timeoutMs }));
      }
      const devices = await this.devicesOf(file);
      if (devices.length === 0) throw new LatchError(`losetup set up ${file}, but no loop device backed by it is visible in /sys`);
      return await this.keepOne(devices);
    } catch (err) {
      // Leave nothing half-made behind. No device existed when this call began (under the mapping lock), so any there
      // now is this call's and mounted nowhere; and after an abort (the guard's) the mapping is dead: a later call
      // must not find its loop device and reuse it. unmap refuses to touch a device that something mounted.
      await this.unmap(image).catch(() => undefined);
      throw err;
    }
  }

  async deviceOf(image: string): Promise<string | undefined> {
    const dir = await this.mountDir(false);
    if (dir === undefined) return undefined;
    return (await deviceToUse(await this.devicesOf(fuseImageFile(dir, image))))?.device;
  }

  /**
   * The instance serving the image's mapping: the image's watcher whose session is one the mount's own rbd-fuse
   * logged (its global id, startRbdFuse). Exactly one must match; a failing `rbd status` throws.
   */
  async clientAddress(image: string): Promise<string | undefined> {
    const dir = await this.mountDir(false);
    if (dir === undefined || (await rbdFusePids(fuseMountPoint(dir, image))).length !== 1) return undefined;
    const { identity, pool } = this.options;
    const deadline = Date.now() + CLIENT_REPORT_WAIT_MS;
    for (;;) {
      const ids = await rbdFuseGlobalIds(fuseLogFile(dir, image));
      const own = (await rbdWatcherList(identity, pool, image)).filter((w) => w.globalId !== undefined && ids.has(w.globalId));
      if (own.length > 1)
        throw new LatchError(
          `${this.spec(image)} has several watchers of this node's one rbd-fuse: ${own.map((w) => w.address).join(', ')}`,
        );
      const address = own[0]?.address;
      if (address !== undefined) return isClientInstance(address) ? address : undefined;
      if (Date.now() >= deadline) return undefined;
      await sleep(100);
    }
  }

  async imageOf(device: string): Promise<string | undefined> {
    const dir = await this.mountDir(false);
    if (dir === undefined) return undefined;
    let real = device;
    try {
      real = await realpath(device); // a /dev path: never below a FUSE mount
    } catch {
      // gone: the /sys lookup decides
    }
    if (loopNumber(real) === undefined) return undefined;
    const info = await loopDeviceInfo(real);
    if (!info) return undefined;
    return imageOfFuseFile(dir, info.backingFile);
  }

  async isMapped(image: string): Promise<boolean> {
    const dir = await this.mountDir(false);
    if (dir === undefined) return false;
    const mountPoint = fuseMountPoint(dir, image);
    if ((await this.devicesOf(fuseImageFile(dir, image))).length > 0) return true;
    if ((await fuseMountsAt(mountPoint)).length > 0) return true;
    return (await rbdFusePids(mountPoint)).length > 0;
  }

  async unmap(image: string): Promise<void> {
    const dir = await this.mountDir(false);
    if (dir === undefined) return;
    const mountPoint = fuseMountPoint(dir, image);
    const file = fuseImageFile(dir, image);

    const devices = await this.devicesOf(file);
    const mounted = await mountedSources();
    const busy = devices.filter((d) => mounted.has(d.device));
    if (busy.length > 0) {
      throw new LatchError(`${busy.map((d) => d.device).join(', ')} of ${this.spec(image)} is still mounted; unmount it first`);
    }
    // A filesystem can outlive its mount: a umount that gave up at its deadline (the cluster stalled, or this
    // rbd-fuse stopped answering) is gone from mountinfo, but the filesystem is still writing back through the
    // device. Aborting the connection now would throw those writes away; once the cluster answers they land and the
    // device is free, so the call fails and its repeat finishes the job.
    for (const dev of devices) await waitNoFilesystemLeft(dev.device, `${dev.device} of ${this.spec(image)}`);
    // losetup -d is an ioctl on the loop device and answers also when the FUSE mount does not; the kernel then
    // frees the device only once the FUSE connection is gone (which the abort below makes sure of).
    let detached = true;
    for (const dev of devices) {
      try {
        await detachLoop(dev.device, dev.backingFile, { timeoutMs: this.options.timeoutMs });
      } catch {
        detached = false;
      }
    }

    const mounts = await fuseMountsAt(mountPoint);
    const pids = await rbdFusePids(mountPoint);
    if (mounts.length > 0) {
      let clean = false;
      if (detached && pids.length > 0 && mounts.length === 1) {
        try {
          await guardedUnmount(mountPoint, this.fuseTimeoutMs);
          clean = true;
        } catch {
          // dead or hung: cleared below
        }
      }
      if (!clean) await this.clearDeadMount(mountPoint, pids);
    }
    // After a clean umount the daemon exits by itself; one without a mount has nothing left to do.
    const survivors = mounts.length > 0 ? await waitForExit(pids, EXIT_WAIT_MS) : pids;
    if (survivors.length > 0) await killAndWait(survivors, EXIT_WAIT_MS);
    await this.checkGone(image, mountPoint, file);
    await rmdir(mountPoint).catch(() => undefined); // only an empty, unmounted directory; anything else stays
    await rm(fuseLogFile(dir, image), { force: true });
  }

  async abort(image: string): Promise<void> {
    const dir = await this.mountDir(false);
    if (dir === undefined) return;
    for (const mount of await fuseMountsAt(fuseMountPoint(dir, image))) await abortFuseConnection(mount);
  }

  async refreshSize(image: string, sizeBytes: number): Promise<void> {
    const dir = await this.mountDir(false);
    if (dir === undefined) return;
    const mountPoint = fuseMountPoint(dir, image);
    const file = fuseImageFile(dir, image);
    const wanted = Math.floor(sizeBytes / 512) * 512;
    for (const dev of await this.devicesOf(file)) {
      const deadline = Date.now() + this.fuseTimeoutMs;
      // rbd-fuse learns the new size from the image's header watch; the loop device then takes it from the file's
      // size (losetup -c). Measured: the very next losetup -c sees it. If the kernel still had the old size cached,
      // a stat of the file (a FUSE getattr) refreshes it.
      for (let attempt = 0; (await loopSizeBytes(dev.device)) < wanted; attempt++) {
        if (Date.now() >= deadline) {
          throw new LatchError(
            `${dev.device} of ${this.spec(image)} still shows ${await loopSizeBytes(dev.device)} bytes after the image grew to ${sizeBytes}`,
          );
        }
        if (attempt > 0) {
          await guardedFileSize(mountPoint, file, this.fuseTimeoutMs);
          await sleep(100);
        }
        await guardFuse(mountPoint, this.fuseTimeoutMs, (timeoutMs) => refreshLoopCapacity(dev.device, { timeoutMs }));
      }
    }
  }

  /**
   * Makes sure a live rbd-fuse serves the mount point. Anything else found there (a mount without its daemon, a
   * daemon without its mount, stacked mounts) is cleared first: no device uses it (the caller checked), so nothing
   * can be lost.
   */
  private async ensureMount(dir: string, image: string): Promise<void> {
    const mountPoint = fuseMountPoint(dir, image);
    const mounts = await fuseMountsAt(mountPoint);
    const pids = await rbdFusePids(mountPoint);
    if (mounts.length === 1 && pids.length === 1) return;
    if (mounts.length > 0 || pids.length > 0) await this.clearDeadMount(mountPoint, pids);
    await mkdir(mountPoint, { recursive: true, mode: 0o700 });
    await mkdir(fuseLogDir(dir), { recursive: true, mode: 0o700 });
    const { identity, pool } = this.options;
    // startRbdFuse turns librbd's cache off on the command line, but a pool or image setting beats the command line,
    // and with the cache a fenced node's fsync returns success for writes that never land (startRbdFuse).
    const cache = await rbdConfigOverride(identity, pool, image, 'rbd_cache');
    if (cache !== undefined && cache.value !== 'false') {
      throw new LatchError(
        `${this.spec(image)} has rbd_cache=${JSON.stringify(cache.value.slice(0, 20))} in its ${cache.source}'s config, which would ` +
          `turn librbd's cache back on in rbd-fuse, and with it a fenced node's fsync reports success for writes that never land; ` +
          `remove it (rbd config ${cache.source} rm ${cache.source === 'pool' ? pool : this.spec(image)} rbd_cache)`,
      );
    }
    const logFile = fuseLogFile(dir, image);
    await startRbdFuse({ identity, pool, image, mountPoint, timeoutMs: this.options.timeoutMs, logFile });
  }

  /** rbd-fuse -r shows the image's file once it has opened the image; until then the mount is empty. */
  private async waitForImageFile(mountPoint: string, file: string): Promise<void> {
    const deadline = Date.now() + this.fuseTimeoutMs;
    for (;;) {
      const left = Math.max(1_000, deadline - Date.now());
      if ((await guardedFileSize(mountPoint, file, left)) !== undefined) return;
      if (Date.now() >= deadline) {
        throw new LatchError(`rbd-fuse mounted ${mountPoint}, but ${basename(file)} did not appear in it within ${this.fuseTimeoutMs} ms`);
      }
      await sleep(100);
    }
  }

  /** The fenced-or-dead path (docs/design/rbd-backend.md c): abort the connection, kill the daemon, then unmount. */
  private async clearDeadMount(mountPoint: string, pids: number[]): Promise<void> {
    for (const mount of await fuseMountsAt(mountPoint)) await abortFuseConnection(mount);
    await killAndWait(pids, EXIT_WAIT_MS);
    // After the abort nothing on the mount can block; stacked mounts come off one at a time.
    for (let i = (await fuseMountsAt(mountPoint)).length; i > 0; i--) {
      await run('umount', [mountPoint], { timeoutMs: 10_000 }).catch(async (err: unknown) => {
        await run('umount', ['--lazy', mountPoint], { timeoutMs: 10_000 }).catch(() => {
          throw new LatchError(`cannot unmount the rbd-fuse mount ${mountPoint}: ${errorMessage(err)}`);
        });
      });
    }
  }

  private async checkGone(image: string, mountPoint: string, file: string): Promise<void> {
    const deadline = Date.now() + LOOP_GONE_WAIT_MS;
    while ((await this.devicesOf(file)).length > 0 && Date.now() < deadline) await sleep(50);
    const left: string[] = [];
    const devices = await this.devicesOf(file);
    if (devices.length > 0) left.push(`loop device(s) ${devices.map((d) => d.device).join(', ')}`);
    if ((await fuseMountsAt(mountPoint)).length > 0) left.push(`the mount ${mountPoint}`);
    const pids = await rbdFusePids(mountPoint);
    if (pids.length > 0) left.push(`rbd-fuse process(es) ${pids.join(', ')}`);
    if (left.length > 0) throw new LatchError(`releasing ${this.spec(image)} left ${left.join(' and ')} behind`);
  }

  /** The device every caller keeps (deviceInUse); unmounted duplicates are detached. */
  private keepOne(devices: LoopDevice[]): Promise<string> {
    return keepOneDevice(devices, (dup) => detachLoop(dup.device, dup.backingFile, { timeoutMs: this.options.timeoutMs }));
  }

  /**
   * Loop devices backed by `file`, lowest number first (from /sys only). Whether the kernel marks the file
   * " (deleted)" does not count here: a FUSE dentry that failed revalidation is unhashed and shows up that way
   * (measured: every device over a second rbd-fuse instance at the same mount point), though the file is there.
   */
  private async devicesOf(file: string): Promise<LoopDevice[]> {
    return (await listLoopDevices())
      .filter((d) => d.backingFile === file)
      .sort((a, b) => (loopNumber(a.device) ?? 0) - (loopNumber(b.device) ?? 0));
  }

  /**
   * The mount directory's real path (mountinfo and sysfs spell paths that way), made 0700 with `create`. Only the
   * directory itself is resolved, never a mount point below it.
   */
  private async mountDir(create: boolean): Promise<string | undefined> {
    if (this.canonicalDir !== undefined) return this.canonicalDir;
    if (create) await mkdir(this.options.mountDir, { recursive: true, mode: 0o700 });
    try {
      this.canonicalDir = await realpath(this.options.mountDir);
    } catch {
      return undefined;
    }
    return this.canonicalDir;
  }

  private spec(image: string): string {
    return `${this.options.pool}/${image}`;
  }
}

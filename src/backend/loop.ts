// The embedded data plane: each volume is a sparse image file <poolDir>/<volume>.img, attached with losetup.
// Which device belongs to which volume is read from the kernel (/sys/block/loopN/loop/backing_file), never
// remembered in a file, so it stays true across crashes and restarts.
import { constants } from 'node:fs';
import { chmod, link, lstat, mkdir, open, readdir, readFile, realpath, rmdir, statfs, truncate, unlink } from 'node:fs/promises';
import type { Stats } from 'node:fs';
import { basename, dirname, isAbsolute, join, resolve } from 'node:path';
import { LatchError } from '../errors.js';
import { checkVolumeName } from '../names.js';
import { formatSize } from '../size.js';
import { blockDeviceSize } from '../sys/blockdev.js';
import { CommandError, type ChildDeadline } from '../sys/run.js';
import { detachLoop, listLoopDevices, loopDeviceInfo, loopNumber, refreshLoopCapacity, setupLoop, type LoopDevice } from '../sys/loop.js';
import { deviceToUse, keepOneDevice } from './devices.js';
import type { Backend, ReadableImage, SnapshotBackend, SnapshotInfo } from './types.js';
import { leftoverOf, syncDir, tempPathFor, writeFileAtomic } from '../atomic-file.js';
import { processExists } from '../sys/processes.js';
import { canReflink, cloneFile, extentUsage, type CloneMethod } from '../sys/clone.js';

export interface LoopBackendOptions {
  /** Directory holding the images; created 0700 on first use. */
  poolDir: string;
  /** Largest size a volume may be created with or grown to, in bytes. */
  maxSize: number;
  /** Deadline of each child (losetup, filefrag): the configuration's commandTimeout; without it, run()'s default. */
  commandTimeoutMs?: number;
}

const IMAGE_SUFFIX = '.img';

/**
 * statfs(2) magic numbers of the local filesystems whose st_blocks counts every byte written to a file as soon as
 * it is written (delayed allocations included): ext2/3/4, xfs, btrfs, tmpfs.
 */
const COUNTS_EVERY_BLOCK = new Set([0xef53, 0x58465342, 0x9123683e, 0x01021994]);

/** The file name of a volume's image in the pool: `<volume>.img`. */
export function imageFileName(volume: string): string {
  return `${checkVolumeName(volume)}${IMAGE_SUFFIX}`;
}

/** The volume an image file (a name or a path) is named after, or undefined when it is not named `<something>.img`. */
export function volumeOfImageFile(file: string): string | undefined {
  const name = basename(file);
  return name.endsWith(IMAGE_SUFFIX) ? name.slice(0, -IMAGE_SUFFIX.length) : undefined;
}

export class LoopBackend implements Backend, SnapshotBackend {
  readonly poolDir: string;
  readonly maxSize: number;
  /** The deadline of every child it runs. */
  private readonly timeout: ChildDeadline;
  readonly freedByUnmount = true;

  constructor(options: LoopBackendOptions) {
    if (!isAbsolute(options.poolDir)) throw new LatchError(`poolDir ${JSON.stringify(options.poolDir)} must be an absolute path`);
    if (!Number.isSafeInteger(options.maxSize) || options.maxSize < 1) {
      throw new LatchError(`maxSize must be a positive whole number of bytes, got ${options.maxSize}`);
    }
    this.poolDir = resolve(options.poolDir);
    this.maxSize = options.maxSize;
    this.timeout = { timeoutMs: options.commandTimeoutMs };
  }

  get storage(): string {
    return `the pool (${this.poolDir})`;
  }

  /** The pool is this node's alone: each volume has a home (Backend.localPool). */
  get localPool(): string {
    return this.poolDir;
  }

  /** Where the volume's image lives (whether or not it exists). */
  imagePath(volume: string): string {
    return join(this.poolDir, imageFileName(volume));
  }

  /** The image file has no block allocated (made sparse, never written). */
  async isUnwritten(volume: string): Promise<boolean> {
    const stats = await lstat(this.imagePath(volume)).catch(() => undefined);
    return stats !== undefined && stats.isFile() && stats.blocks === 0;
  }

  async create(volume: string, sizeBytes: number): Promise<void> {
    const path = this.imagePath(volume);
    checkSizeArgument(volume, sizeBytes);
    if (sizeBytes > this.maxSize) {
      throw new LatchError(
        `volume ${volume}: requested size ${formatSize(sizeBytes)} is above the limit of ${formatSize(this.maxSize)} (maxSize)`,
      );
    }
    await mkdir(this.poolDir, { recursive: true, mode: 0o700 });

    const existing = await statImage(path);
    if (existing) return acceptExisting(volume, path, existing, sizeBytes);

    const available = await this.availableBytes();
    if (sizeBytes > available) {
      throw new LatchError(
        `volume ${volume}: requested size ${formatSize(sizeBytes)} is above the ${formatSize(available)} available ` +
          `in the pool ${this.poolDir}`,
      );
    }

    // The image is made full-size under a private name and then linked into place: link() never replaces an
    // existing file, so a concurrent create can neither clobber an image nor see a half-made one. Only the pool
    // directory is fsynced, after the link: the image holds no data, and link() changes the inode itself (its link
    // count), so the commit that makes the new name durable carries the inode with its size and mode (a journal
    // commits whole transactions in order; btrfs logs the inode of a new name). An fsync of the image first would
    // be a second journal commit that protects nothing more.
    const temp = tempPathFor(path);
    const handle = await open(temp, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o600);
    try {
      try {
        await handle.chmod(0o600);
        await handle.truncate(sizeBytes);
      } finally {
        await handle.close();
      }
      try {
        await link(temp, path);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
        const raced = await statImage(path);
        if (!raced) throw err;
        return acceptExisting(volume, path, raced, sizeBytes);
      }
    } finally {
      await unlink(temp).catch(() => undefined);
    }
    await syncDir(this.poolDir);
  }

  async delete(volume: string): Promise<void> {
    const path = this.imagePath(volume);
    const devices = await this.liveDevices(volume);
    if (devices.length > 0) {
      throw new LatchError(`volume ${volume} is still set up as ${devices.map((d) => d.device).join(', ')}; release it before deleting`);
    }
    const snapshots = await this.listSnapshots(volume);
    if (snapshots.length > 0) {
      throw new LatchError(
        `volume ${volume} has snapshot(s) ${snapshots.map((s) => s.name).join(', ')}; delete them first (latch snapshot delete)`,
      );
    }
    try {
      await unlink(path);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return;
      throw err;
    }
    await syncDir(this.poolDir);
  }

  async size(volume: string): Promise<number | undefined> {
    const stats = await statImage(this.imagePath(volume));
    return stats?.size;
  }

  async attach(volume: string): Promise<string> {
    const path = this.imagePath(volume);
    if (!(await statImage(path))) throw new LatchError(`volume ${volume} has no image in the pool (${path})`);

    const existing = await this.liveDevices(volume);
    const [only, ...others] = existing;
    if (only && others.length === 0) return only.device;
    if (existing.length === 0) {
      // A create killed between its temp file and the temp's removal (a SIGKILLed waitforattach) left that file; the
      // volume's next set-up, which the repeated call always reaches, removes it.
      await removeDeadTemps(this.poolDir, imageFileName(volume));
      await this.setUp(volume, path);
    }
    // Several callers may have raced past the check above (or a killed call left a second device). Every caller
    // keeps the same device (deviceInUse) and detaches the others that are not mounted, so they all converge on one.
    const devices = await this.liveDevices(volume);
    if (devices.length === 0) throw new LatchError(`losetup set up ${path}, but no loop device backed by it is visible in /sys`);
    // Best effort: a device still open (udev probing it) is left with autoclear and goes away on its last close.
    return keepOneDevice(devices, (dup) => detachLoop(dup.device, dup.backingFile, this.timeout));
  }

  async hasMapping(volume: string): Promise<boolean> {
    return (await this.findDevice(volume)) !== undefined;
  }

  /**
   * A loop device over the image that reads and writes it with direct I/O: measured in docs/performance.md, that
   * keeps the volume's data out of the page cache a second time (a buffered loop caches every page the volume's
   * filesystem caches already, as the image's), makes the volume's O_DIRECT and fsync reach the disk, and reads cold
   * data faster. 512-byte sectors keep the device what a buffered one is (a direct-I/O device would otherwise take
   * the pool disk's logical block size, and a filesystem made on 512-byte sectors may not mount on 4096); where the
   * pool's filesystem cannot do direct I/O at that alignment (a 4Kn disk, an old tmpfs) the kernel quietly keeps
   * the device buffered, and a losetup that refuses the flag outright is run again without it.
   */
  private async setUp(volume: string, path: string): Promise<void> {
    try {
      await setupLoop(path, { directIo: true, sectorSize: 512, ...this.timeout });
    } catch (err) {
      if (!(err instanceof CommandError) || err.timedOut) throw err;
      // A device is there after all (losetup set it up, then failed to switch it) or a concurrent attach made one.
      if ((await this.liveDevices(volume)).length > 0) return;
      await setupLoop(path, this.timeout);
    }
  }

  async findDevice(volume: string): Promise<string | undefined> {
    checkVolumeName(volume);
    return (await deviceToUse(await this.liveDevices(volume)))?.device;
  }

  /**
   * The image has no block allocated: a sparse file reads as zeros wherever nothing was written, so the device reads
   * as zeros throughout (a fresh volume's first mount is proven blank without blkid, which cost 7-10 ms). Trusted only
   * where the pool's filesystem counts every written byte in st_blocks, delayed allocations included (ext2/3/4, xfs,
   * btrfs, tmpfs: not so a network or FUSE filesystem, where the count may lag or be made up), and only for the
   * device backed by the volume's current image. Writes still in the device's page cache (a process that wrote to the
   * device and did not sync) are pushed through to the image first: a sync of the device does that.
   */
  async isBlank(volume: string, device: string): Promise<boolean> {
    const pool = await this.realPoolDir();
    const info = await loopDeviceInfo(device);
    if (pool === undefined || !info || info.deleted || info.backingFile !== join(pool, imageFileName(volume))) return false;
    if (!COUNTS_EVERY_BLOCK.has(Number((await statfs(pool)).type))) return false;
    const handle = await open(device, constants.O_RDONLY);
    try {
      await handle.sync();
    } finally {
      await handle.close();
    }
    const stats = await statImage(join(pool, imageFileName(volume)));
    return stats !== undefined && stats.blocks === 0;
  }

  async volumeOfDevice(device: string): Promise<string | undefined> {
    if (typeof device !== 'string' || !device.startsWith('/dev/')) return undefined;
    let real = device;
    try {
      real = await realpath(device);
    } catch {
      // Not there (any more): the /sys lookup below decides.
    }
    if (loopNumber(real) === undefined) return undefined;
    const info = await loopDeviceInfo(real);
    if (!info) return undefined;
    return this.volumeOfBackingFile(info.backingFile, await this.realPoolDir());
  }

  async release(volume: string): Promise<void> {
    checkVolumeName(volume);
    // Every device backed by this image path, including one whose image was unlinked underneath it.
    const devices = await this.devicesOf(volume, { includeDeleted: true });
    const errors: unknown[] = [];
    for (const dev of devices) {
      try {
        await detachLoop(dev.device, dev.backingFile, this.timeout);
      } catch (err) {
        errors.push(err);
      }
    }
    if (errors.length > 0) throw errors[0];
  }

  async grow(volume: string, sizeBytes: number): Promise<void> {
    const path = this.imagePath(volume);
    checkSizeArgument(volume, sizeBytes);
    const stats = await statImage(path);
    if (!stats) throw new LatchError(`volume ${volume} has no image in the pool (${path})`);
    if (sizeBytes < stats.size) {
      throw new LatchError(`volume ${volume}: cannot shrink from ${formatSize(stats.size)} to ${formatSize(sizeBytes)}; volumes only grow`);
    }
    if (sizeBytes > this.maxSize) {
      throw new LatchError(
        `volume ${volume}: requested size ${formatSize(sizeBytes)} is above the limit of ${formatSize(this.maxSize)} (maxSize)`,
      );
    }
    if (sizeBytes > stats.size) {
      // What the image could still need if it were filled: its new size less what it already occupies.
      const needed = sizeBytes - stats.blocks * 512;
      const available = await this.availableBytes();
      if (needed > available) {
        throw new LatchError(
          `volume ${volume}: growing to ${formatSize(sizeBytes)} needs up to ${formatSize(needed)} more, but only ` +
            `${formatSize(available)} is available in the pool ${this.poolDir}`,
        );
      }
      await truncate(path, sizeBytes);
    }
    // Also on a repeated call: a previous one may have grown the image and failed before the refresh.
    const deviceBytes = Math.floor(sizeBytes / 512) * 512;
    for (const dev of await this.liveDevices(volume)) {
      if ((await blockDeviceSize(dev.device)) < deviceBytes) await refreshLoopCapacity(dev.device, this.timeout);
    }
  }

  // Snapshots: <poolDir>/snapshots/<volume>/<name>.img, a read-only clone of the image (a reflink where the pool's
  // filesystem can, else a sparse copy), and <name>.json beside it saying when and how it was made. The clone is made
  // under a temp name and linked into place, so a killed call never leaves a half-copied snapshot under its name.
  // Consistency of a volume in use (fsfreeze) is the caller's: node/snapshot.ts.

  /** Where the volume's snapshots live. */
  snapshotDir(volume: string): string {
    return join(this.poolDir, 'snapshots', checkVolumeName(volume));
  }

  private snapshotPath(volume: string, name: string): string {
    return join(this.snapshotDir(volume), `${checkSnapshotName(name)}${IMAGE_SUFFIX}`);
  }

  /** A pool that can reflink snapshots at once; elsewhere (ext4) createSnapshot copies the whole image. */
  async instantSnapshots(volume: string): Promise<boolean> {
    const dir = this.snapshotDir(volume);
    await mkdir(dir, { recursive: true, mode: 0o700 });
    return canReflink(dir);
  }

  async createSnapshot(volume: string, name: string): Promise<SnapshotInfo> {
    const image = this.imagePath(volume);
    const source = await statImage(image);
    if (!source) throw new LatchError(`volume ${volume} has no image in the pool (${image})`);
    const dir = this.snapshotDir(volume);
    const path = this.snapshotPath(volume, name);
    await mkdir(dir, { recursive: true, mode: 0o700 });
    if (await statImage(path)) throw new LatchError(`volume ${volume} already has a snapshot named ${name}`);
    await removeDeadTemps(dir);

    const temp = tempPathFor(path);
    const createdAt = new Date().toISOString();
    try {
      // A sparse copy reads and writes the whole image: allow it about 20 MB/s, and never less than 10 minutes.
      const method = await cloneFile(image, temp, Math.max(600_000, source.size / 20_000));
      await chmod(temp, 0o400);
      const handle = await open(temp, 'r');
      try {
        await handle.sync();
      } finally {
        await handle.close();
      }
      const meta: SnapshotMeta = { volume, name, createdAt, sizeBytes: source.size, method };
      // Only the file is fsynced here: the directory is, once, after the link below.
      await writeFileAtomic(join(dir, `${name}.json`), `${JSON.stringify(meta)}\n`, { sync: 'file' });
      try {
        await link(temp, path);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === 'EEXIST') throw new LatchError(`volume ${volume} already has a snapshot named ${name}`);
        throw err;
      }
    } finally {
      await unlink(temp).catch(() => undefined);
    }
    await syncDir(dir);
    const made = (await this.listSnapshots(volume)).find((s) => s.name === name);
    if (!made) throw new LatchError(`snapshot ${name} of volume ${volume} vanished right after it was made`);
    return made;
  }

  async listSnapshots(volume: string): Promise<SnapshotInfo[]> {
    const dir = this.snapshotDir(volume);
    let files: string[];
    try {
      files = await readdir(dir);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return [];
      throw err;
    }
    const list: SnapshotInfo[] = [];
    for (const file of files) {
      const name = volumeOfImageFile(file);
      if (name === undefined || file.startsWith('.')) continue;
      const path = join(dir, file);
      const stats = await statImage(path);
      if (!stats) continue;
      const meta = await readSnapshotMeta(join(dir, `${name}.json`));
      const method: CloneMethod = meta?.method ?? 'copy';
      const allocated = stats.blocks * 512;
      // Only a reflinked file shares extents; asking filefrag about a plain copy would only cost time.
      const usage = method === 'reflink' ? await extentUsage(path, this.timeout) : undefined;
      list.push({
        volume,
        name,
        createdAt: meta?.createdAt ?? stats.mtime.toISOString(),
        sizeBytes: meta?.sizeBytes ?? stats.size,
        sharing: method,
        allocatedBytes: allocated,
        // A reflink whose extents filefrag cannot report: unknown, rather than all of it.
        ...(method === 'copy' && { exclusiveBytes: allocated }),
        ...(usage && { exclusiveBytes: Math.max(0, Math.min(allocated, usage.allocated) - usage.shared) }),
      });
    }
    return list.sort((a, b) => a.createdAt.localeCompare(b.createdAt) || a.name.localeCompare(b.name));
  }

  async deleteSnapshot(volume: string, name: string): Promise<void> {
    const dir = this.snapshotDir(volume);
    await unlink(this.snapshotPath(volume, name)).catch((err: NodeJS.ErrnoException) => {
      if (err.code !== 'ENOENT') throw err;
    });
    await unlink(join(dir, `${name}.json`)).catch(() => undefined);
    await removeDeadTemps(dir);
    await syncDir(dir).catch(() => undefined);
    await rmdir(dir).catch(() => undefined);
  }

  async openSnapshot(volume: string, name: string): Promise<ReadableImage> {
    const path = this.snapshotPath(volume, name);
    if (!(await statImage(path))) throw new LatchError(`volume ${volume} has no snapshot named ${name} (latch snapshot list ${volume})`);
    return { path, description: `snapshot ${name} of volume ${volume} (${path})`, release: async () => undefined };
  }

  async idleImage(volume: string): Promise<ReadableImage | undefined> {
    const path = this.imagePath(volume);
    if (!(await statImage(path))) return undefined;
    return { path, description: `the image of volume ${volume} (${path}), detached`, release: async () => undefined };
  }

  /** The real path of the pool directory, or undefined when it does not exist (then no device is ours). */
  private async realPoolDir(): Promise<string | undefined> {
    try {
      return await realpath(this.poolDir);
    } catch {
      return undefined;
    }
  }

  /** Devices backed by the volume's current image, lowest number first. */
  private async liveDevices(volume: string): Promise<LoopDevice[]> {
    return this.devicesOf(volume, { includeDeleted: false });
  }

  private async devicesOf(volume: string, options: { includeDeleted: boolean }): Promise<LoopDevice[]> {
    const pool = await this.realPoolDir();
    if (pool === undefined) return [];
    const image = join(pool, imageFileName(volume));
    const devices = await listLoopDevices();
    return devices
      .filter((d) => d.backingFile === image && (options.includeDeleted || !d.deleted))
      .sort((a, b) => (loopNumber(a.device) ?? 0) - (loopNumber(b.device) ?? 0));
  }

  private volumeOfBackingFile(file: string, pool: string | undefined): string | undefined {
    if (pool === undefined || dirname(file) !== pool) return undefined;
    const volume = volumeOfImageFile(file);
    if (volume === undefined) return undefined;
    try {
      return checkVolumeName(volume);
    } catch {
      return undefined;
    }
  }

  private async availableBytes(): Promise<number> {
    const stats = await statfs(this.poolDir);
    return Number(stats.bavail) * Number(stats.bsize);
  }
}

function checkSizeArgument(volume: string, sizeBytes: number): void {
  if (!Number.isSafeInteger(sizeBytes) || sizeBytes < 1) {
    throw new LatchError(`volume ${volume}: size must be a positive whole number of bytes, got ${sizeBytes}`);
  }
}

/** lstat of an image; undefined when missing; refuses anything but a regular file (a symlink could point anywhere). */
async function statImage(path: string): Promise<Stats | undefined> {
  let stats: Stats;
  try {
    stats = await lstat(path);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw err;
  }
  if (!stats.isFile()) throw new LatchError(`${path} is not a regular file; refusing to use it as a volume image`);
  return stats;
}

function acceptExisting(volume: string, path: string, stats: Stats, sizeBytes: number): void {
  if (stats.size >= sizeBytes) return;
  throw new LatchError(
    `volume ${volume} already exists with ${formatSize(stats.size)}, less than the requested ${formatSize(sizeBytes)} ` +
      `(${path}); expand it instead`,
  );
}

interface SnapshotMeta {
  volume: string;
  name: string;
  createdAt: string;
  sizeBytes: number;
  method: CloneMethod;
}

/** Snapshot names name files: the volume name rules. */
function checkSnapshotName(name: string): string {
  return checkVolumeName(name, 'snapshot name', 200);
}

async function readSnapshotMeta(path: string): Promise<SnapshotMeta | undefined> {
  try {
    const meta = JSON.parse(await readFile(path, 'utf8')) as Partial<SnapshotMeta>;
    if (typeof meta.createdAt !== 'string' || (meta.method !== 'reflink' && meta.method !== 'copy')) return undefined;
    return meta as SnapshotMeta;
  } catch {
    return undefined;
  }
}

/**
 * Removes the temp files (atomic-file.ts: images and snapshot copies being made, snapshot records) whose process is
 * gone, in `dir`; only those of the file named `of` when it is given.
 */
async function removeDeadTemps(dir: string, of?: string): Promise<void> {
  let files: string[];
  try {
    files = await readdir(dir);
  } catch {
    return;
  }
  for (const file of files) {
    const leftover = leftoverOf(file);
    if (leftover === undefined || (of !== undefined && leftover.name !== of) || processExists(leftover.pid)) continue;
    await unlink(join(dir, file)).catch(() => undefined);
  }
}

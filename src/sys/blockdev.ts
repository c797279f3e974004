// Filesystems on block devices: probe, format, grow; and device sizes from /sys.
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { readFile, realpath } from 'node:fs/promises';
import { basename, isAbsolute } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { FILESYSTEMS, FS_TYPES, growSpecOf, isFsType } from '../filesystems.js';
import { LatchError } from '../errors.js';
import { CommandError, run, type ChildDeadline } from './run.js';

/**
 * The filesystem type blkid finds on `device` (low-level probe, no cache), or undefined when it finds no signature
 * at all. A device that carries a signature that is not a filesystem (a partition table) is not empty: that throws,
 * so nobody formats over it.
 */
export async function probeFsType(device: string, timeout: ChildDeadline = {}): Promise<string | undefined> {
  const dev = checkDevicePath(device);
  const { stdout, exitCode } = await run('blkid', ['-p', '-o', 'export', '-s', 'TYPE', '-s', 'PTTYPE', dev], {
    okExitCodes: [2],
    timeoutMs: timeout.timeoutMs,
  });
  if (exitCode === 2) return undefined;
  const values = new Map<string, string>();
  for (const line of stdout.split('\n')) {
    const eq = line.indexOf('=');
    if (eq > 0) values.set(line.slice(0, eq), line.slice(eq + 1).trim());
  }
  const type = values.get('TYPE');
  if (type) return type;
  const ptType = values.get('PTTYPE');
  throw new LatchError(
    `${dev} holds ${ptType ? `a ${ptType} partition table` : 'a signature blkid recognises'} but no filesystem; ` +
      `refusing to treat it as empty`,
  );
}

/**
 * Creates a filesystem on `device`, whatever it holds (mkfs.ext4 -F would not ask, nor does mke2fs without a
 * terminal). Only for a device that probeFsType has just found blank, with nothing else able to write to it since:
 * node/filesystem.ts (ensureFilesystem) is the one caller, and says why nothing can.
 */
export async function makeFs(device: string, fsType: string, timeout: ChildDeadline = {}): Promise<void> {
  const dev = checkDevicePath(device);
  if (!isFsType(fsType)) {
    throw new LatchError(`cannot create a ${JSON.stringify(fsType)} filesystem: supported types are ${FS_TYPES.join(', ')}`);
  }
  const [command, ...args] = FILESYSTEMS[fsType].mkfs;
  try {
    await run(command, [...args, dev], timeout);
  } catch (err) {
    if (fsType === 'btrfs' && err instanceof CommandError && (err.timedOut || err.stderrTail.includes('cannot check mount status'))) {
      // mkfs.btrfs resolves the backing file of every mounted loop device to see whether `device` is one of them: a
      // single one over a FUSE mount whose daemon died (ENOTCONN) or is fenced (the stat hangs) fails every format.
      throw new LatchError(
        `${err.message}. mkfs.btrfs looks at the backing file of every mounted loop device on this node, and fails or ` +
          'hangs on one over a FUSE mount that is dead or fenced: latch doctor names such an rbd mapping and how to take ' +
          'it down',
        { cause: err },
      );
    }
    throw err;
  }
}

/** Grows the filesystem on `device`, mounted at `mountPoint`, to fill the device (online). */
export async function growFs(device: string, mountPoint: string, fsType: string, timeout: ChildDeadline = {}): Promise<void> {
  const dev = checkDevicePath(device);
  if (!isAbsolute(mountPoint) || mountPoint.includes('\0')) {
    throw new LatchError(`mount point ${JSON.stringify(mountPoint.slice(0, 120))} must be an absolute path`);
  }
  const spec = growSpecOf(fsType)?.grow;
  if (!spec) throw new LatchError(`cannot grow a ${JSON.stringify(fsType)} filesystem: latch grows ${FS_TYPES.join(', ')} and ext2`);
  await run(spec.tool, [...spec.args, spec.target === 'device' ? dev : mountPoint], timeout);
}

/** Size of a block device in bytes, from /sys/class/block/<name>/size (512-byte sectors). */
export async function blockDeviceSize(device: string): Promise<number> {
  const name = await blockDeviceName(device);
  let text: string;
  try {
    text = await readFile(`/sys/class/block/${name}/size`, 'utf8');
  } catch (err) {
    throw new LatchError(`${device} is not a block device known to the kernel`, { cause: err });
  }
  const sectors = Number(text.trim());
  if (!Number.isSafeInteger(sectors)) throw new LatchError(`the kernel reports an unreadable size for ${device}: ${text.trim()}`);
  return sectors * 512;
}

/** The kernel name (e.g. "loop3") of a device path, following /dev symlinks. */
async function blockDeviceName(device: string): Promise<string> {
  const dev = checkDevicePath(device);
  let real = dev;
  try {
    real = await realpath(dev);
  } catch {
    // Fall back to the name as given; /sys decides whether it exists.
  }
  const name = basename(real);
  if (!/^[A-Za-z0-9][A-Za-z0-9._!-]*$/.test(name)) throw new LatchError(`${device} is not a block device name`);
  return name;
}

function checkDevicePath(device: string): string {
  if (typeof device !== 'string' || !device.startsWith('/dev/') || device.includes('\0') || device.includes('..')) {
    throw new LatchError(`device ${JSON.stringify(String(device).slice(0, 120))} must be a path under /dev`);
  }
  return device;
}

/** Drops the kernel's cached blocks of a device (BLKFLSBUF), so that the next reads come from the device: verifying a copy. */
export async function flushBuffers(device: string): Promise<void> {
  await run('blockdev', ['--flushbufs', checkDevicePath(device)]);
}

/**
 * Throws while a filesystem still writes through `device` although no mount shows it: a umount that gave up at its
 * deadline (the storage stalled) leaves the mount table at once, while its writeback waits in the kernel. Freeing the
 * device then would throw those writes away; once the storage answers they land, and a repeat may free it. Waits up to
 * `settleMs` first: right after a clean unmount a request can still be in flight for a moment on a loaded node (CI
 * saw one, and the unmountdevice failed). Reads sysfs only, which answers from the kernel's memory.
 */
export async function waitNoFilesystemLeft(
  device: string,
  what: string,
  options: { settleMs?: number; sysRoot?: string } = {},
): Promise<void> {
  const { settleMs = SETTLE_MS, sysRoot = '/sys' } = options;
  const deadline = Date.now() + settleMs;
  for (;;) {
    const writing = requestsInFlight(device, sysRoot);
    if (writing === 0 && !filesystemRegistered(device, sysRoot)) return;
    if (Date.now() >= deadline) {
      throw new LatchError(
        `${what} is still in use by a filesystem being unmounted` +
          (writing > 0 ? ` (${writing} request(s) waiting on the storage)` : '') +
          `; try again once the storage answers`,
      );
    }
    await sleep(50);
  }
}

/** How long a device's last requests may take to land after a clean unmount before the storage counts as stalled. */
const SETTLE_MS = 2000;

/** Requests the block device has in flight (/sys/block/NAME/inflight: reads, writes); 0 when it is gone. */
function requestsInFlight(device: string, sysRoot: string): number {
  try {
    const text = readFileSync(`${sysRoot}/block/${basename(device)}/inflight`, 'utf8');
    return text
      .trim()
      .split(/\s+/)
      .reduce((sum, n) => sum + (Number(n) || 0), 0);
  } catch {
    return 0;
  }
}

/**
 * Whether a filesystem of a type latch makes still has its superblock on `device` (each registers it in /sys/fs
 * under the device's name until it is fully unmounted), also when no mount shows it any more.
 */
function filesystemRegistered(device: string, sysRoot: string): boolean {
  const name = basename(device);
  if (existsSync(`${sysRoot}/fs/ext4/${name}`) || existsSync(`${sysRoot}/fs/xfs/${name}`)) return true;
  let btrfs: string[] = [];
  try {
    btrfs = readdirSync(`${sysRoot}/fs/btrfs`);
  } catch {
    // no btrfs loaded
  }
  return btrfs.some((fsid) => existsSync(`${sysRoot}/fs/btrfs/${fsid}/devices/${name}`));
}

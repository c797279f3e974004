// Loop devices. The kernel already says which file backs which device (/sys/block/loopN/loop/backing_file), so
// listing spawns nothing; losetup is only run to change state. /sys is read synchronously: a host may have dozens of
// loop devices, and each asynchronous read is a round trip through libuv's thread pool (measured: 2.5-5 ms to list
// 70 devices, against 0.3 ms read inline, and a lifecycle lists them five times). sysfs reads never block on I/O.
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { isAbsolute } from 'node:path';
import { LatchError } from '../errors.js';
import { CommandError, run, type ChildDeadline } from './run.js';

export interface LoopDevice {
  /** e.g. /dev/loop3 */
  device: string;
  /** Absolute path of the backing file as the kernel reports it (symlinks resolved), without " (deleted)". */
  backingFile: string;
  /** The backing file was unlinked (or replaced) after the device was set up. */
  deleted: boolean;
  /** A detach was requested while the device was in use; the kernel frees it when its last user closes it. */
  autoclear: boolean;
}

const LOOP_DEVICE = /^\/dev\/loop([0-9]+)$/;
const DELETED_SUFFIX = ' (deleted)';
const DETACH_SETTLE_MS = 2_000;

/** Every loop device that has a backing file, ordered by number. Reads /sys only. */
export async function listLoopDevices(): Promise<LoopDevice[]> {
  let names: string[];
  try {
    names = readdirSync('/sys/block');
  } catch {
    return [];
  }
  const loops = names.filter((name) => /^loop[0-9]+$/.test(name)).sort((a, b) => Number(a.slice(4)) - Number(b.slice(4)));
  const found = loops.map((name) => readLoop(name));
  return found.filter((entry): entry is LoopDevice => entry !== undefined);
}

/** The state of one loop device, or undefined when it is not set up (or not a loop device). */
export async function loopDeviceInfo(device: string): Promise<LoopDevice | undefined> {
  const match = LOOP_DEVICE.exec(device);
  if (!match) return undefined;
  return readLoop(`loop${match[1]}`);
}

/** The number of a /dev/loopN path (for ordering), or undefined for anything else. */
export function loopNumber(device: string): number | undefined {
  const match = LOOP_DEVICE.exec(device);
  return match ? Number(match[1]) : undefined;
}

export interface SetupLoopOptions {
  /**
   * --direct-io=on: the device reads and writes its backing file with O_DIRECT, so the page cache holds no second
   * copy of what the filesystem on the device caches already. The kernel keeps the device buffered where the backing
   * file cannot do direct I/O at the device's sector size; loopDirectIo() says which it got.
   */
  directIo?: boolean;
  /** --sector-size: the device's logical block size. Without it, a direct-I/O device takes the backing disk's. */
  sectorSize?: 512 | 4096;
  timeoutMs?: number;
}

/** Sets up the first free loop device over `file` and returns its path. */
export async function setupLoop(file: string, options: SetupLoopOptions = {}): Promise<string> {
  if (!isAbsolute(file) || file.includes('\0')) throw new LatchError(`loop backing file ${JSON.stringify(file)} must be an absolute path`);
  const directIo = options.directIo ? ['--direct-io=on'] : [];
  const sectorSize = options.sectorSize ? ['--sector-size', String(options.sectorSize)] : [];
  const { stdout } = await run('losetup', ['--find', '--show', ...directIo, ...sectorSize, file], { timeoutMs: options.timeoutMs });
  const device = stdout.trim();
  if (!LOOP_DEVICE.test(device)) {
    throw new LatchError(`losetup --find --show ${file} printed ${JSON.stringify(device.slice(0, 80))} instead of a loop device`);
  }
  return device;
}

/**
 * Detaches a loop device. Already detached is fine. With `expectedBackingFile`, a device that is now backed by
 * another file is left alone (it was detached and reused meanwhile). The kernel only defers a detach of a device
 * in use (mounted, open): that is reported as an error, since the device is not released yet.
 */
export async function detachLoop(device: string, expectedBackingFile?: string, timeout: ChildDeadline = {}): Promise<void> {
  checkLoopDevice(device);
  const before = await loopDeviceInfo(device);
  if (before === undefined) return;
  if (expectedBackingFile !== undefined && before.backingFile !== expectedBackingFile) return;
  try {
    await run('losetup', ['-d', device], timeout);
  } catch (err) {
    if (err instanceof CommandError && (await loopDeviceInfo(device)) === undefined) return;
    throw err;
  }
  // udev may hold the device open for a moment after a change event; the detach then completes on its close.
  const until = Date.now() + DETACH_SETTLE_MS;
  for (;;) {
    const info = await loopDeviceInfo(device);
    if (info === undefined) return;
    if (Date.now() >= until) {
      throw new LatchError(
        `${device} (${info.backingFile}) is still in use (mounted or open), so the kernel deferred its detach: ` +
          `it is released when its last user closes it`,
      );
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Whether the device does direct I/O on its backing file (/sys/block/loopN/loop/dio); false when not set up. */
export async function loopDirectIo(device: string): Promise<boolean> {
  checkLoopDevice(device);
  try {
    return readFileSync(`/sys/block/${device.slice('/dev/'.length)}/loop/dio`, 'utf8').trim() === '1';
  } catch {
    return false;
  }
}

/** Makes the kernel re-read the backing file's size (after the image grew). */
export async function refreshLoopCapacity(device: string, options: { timeoutMs?: number } = {}): Promise<void> {
  checkLoopDevice(device);
  await run('losetup', ['-c', device], { timeoutMs: options.timeoutMs });
}

/** The loop device's size in bytes as the kernel has it (/sys/block/loopN/size, in 512-byte sectors); 0 when not set up. */
export async function loopSizeBytes(device: string): Promise<number> {
  checkLoopDevice(device);
  try {
    return Number(readFileSync(`/sys/block/${device.slice('/dev/'.length)}/size`, 'utf8').trim()) * 512;
  } catch {
    return 0;
  }
}

function readLoop(name: string): LoopDevice | undefined {
  // Most loop devices of a host are not set up: asked first, as a failed read's exception costs ten times more.
  if (!existsSync(`/sys/block/${name}/loop`)) return undefined;
  let raw: string;
  try {
    raw = readFileSync(`/sys/block/${name}/loop/backing_file`, 'utf8');
  } catch {
    return undefined; // no loop/ directory: the device is not set up
  }
  let backingFile = raw.endsWith('\n') ? raw.slice(0, -1) : raw;
  const deleted = backingFile.endsWith(DELETED_SUFFIX);
  if (deleted) backingFile = backingFile.slice(0, -DELETED_SUFFIX.length);
  let autoclear = false;
  try {
    autoclear = readFileSync(`/sys/block/${name}/loop/autoclear`, 'utf8').trim() === '1';
  } catch {
    // Detached between the two reads; the backing file we read is still what it was.
  }
  return { device: `/dev/${name}`, backingFile, deleted, autoclear };
}

function checkLoopDevice(device: string): void {
  if (!LOOP_DEVICE.test(device)) throw new LatchError(`${JSON.stringify(String(device).slice(0, 80))} is not a loop device path`);
}

// What is mounted where, read from the kernel (/proc/self/mountinfo) rather than from a file inside any mount;
// plus thin wrappers over mount(8), umount(8) and findmnt(8).
import { readFile, realpath } from 'node:fs/promises';
import { isAbsolute, resolve } from 'node:path';
import { LatchError } from '../errors.js';
import { CommandError, run } from './run.js';

export interface MountInfo {
  id: number;
  parentId: number;
  /** "major:minor" of the filesystem's device (st_dev), e.g. "7:3". */
  majorMinor: string;
  /** The path inside the filesystem that is mounted here ("/" unless a bind mount of a subdirectory). */
  root: string;
  mountPoint: string;
  /** Per-mount options, e.g. ["rw", "relatime"]. */
  options: string[];
  /** Optional fields such as "shared:1" or "master:2". */
  optionalFields: string[];
  fsType: string;
  source: string;
  /** Per-superblock options, e.g. ["rw", "errors=remount-ro"]. */
  superOptions: string[];
}

export interface FindmntEntry {
  source: string;
  target: string;
  fsType: string;
  options: string[];
}

export interface MountOptions {
  fsType: string;
  options?: string[];
  readOnly?: boolean;
}

const MOUNTINFO = '/proc/self/mountinfo';
// Mount options are joined with ',' into one argument, so each must be a single, plain option.
const MOUNT_OPTION = /^[A-Za-z0-9_][A-Za-z0-9_.:=+/@-]*$/;
const FS_TYPE = /^[a-z0-9][a-z0-9_.]*$/;

/** Decodes the octal escapes (\040 space, \011 tab, \012 newline, \134 backslash) the kernel uses in mountinfo. */
export function unescapeMountField(field: string): string {
  return field.replace(/\\([0-7]{3})/g, (_, octal: string) => String.fromCharCode(parseInt(octal, 8)));
}

/** Parses mountinfo text (see proc(5)); malformed lines are skipped. */
export function parseMountInfo(text: string): MountInfo[] {
  const entries: MountInfo[] = [];
  for (const line of text.split('\n')) {
    if (line.trim() === '') continue;
    const fields = line.split(' ');
    const separator = fields.indexOf('-', 6);
    if (fields.length < 10 || separator < 0 || fields.length < separator + 3) continue;
    const [, , majorMinor, root, mountPoint, options] = fields;
    const fsType = fields[separator + 1];
    const source = fields[separator + 2];
    // Always there after the length checks above; checked again so that the type checker knows it too.
    if (majorMinor === undefined || root === undefined || mountPoint === undefined || options === undefined) continue;
    if (fsType === undefined || source === undefined) continue;
    const id = Number(fields[0]);
    const parentId = Number(fields[1]);
    if (!Number.isInteger(id) || !Number.isInteger(parentId)) continue;
    entries.push({
      id,
      parentId,
      majorMinor,
      root: unescapeMountField(root),
      mountPoint: unescapeMountField(mountPoint),
      options: splitOptions(options),
      optionalFields: fields.slice(6, separator),
      fsType: unescapeMountField(fsType),
      source: unescapeMountField(source),
      superOptions: splitOptions(unescapeMountField(fields.slice(separator + 3).join(' '))),
    });
  }
  return entries;
}

/** The current mount table of this process's mount namespace. */
export async function readMountInfo(): Promise<MountInfo[]> {
  return parseMountInfo(await readFile(MOUNTINFO, 'utf8'));
}

/**
 * Entries mounted exactly at `path` (normalised; also matched by its real path when it is reached through a
 * symlink), bottom first: with stacked mounts the last one is the visible one.
 */
export async function mountsAt(path: string, table?: MountInfo[]): Promise<MountInfo[]> {
  const candidates = new Set<string>([normalisePath(path)]);
  try {
    candidates.add(await realpath(path));
  } catch {
    // Missing path or unreadable mount: compare the normalised path only.
  }
  const entries = table ?? (await readMountInfo());
  return entries.filter((entry) => candidates.has(entry.mountPoint));
}

/** Whether anything is mounted exactly at `path`. */
export async function isMountPoint(path: string): Promise<boolean> {
  return (await mountsAt(path)).length > 0;
}

/**
 * What findmnt reports as mounted at `path` (the topmost mount when several are stacked), or undefined when nothing is.
 */
export async function findmnt(path: string): Promise<FindmntEntry | undefined> {
  const target = checkPath(path, 'mount point');
  const { stdout, exitCode } = await run('findmnt', ['--json', '--mountpoint', target, '--output', 'SOURCE,TARGET,FSTYPE,OPTIONS'], {
    okExitCodes: [1],
  });
  if (exitCode === 1 && stdout.trim() === '') return undefined;
  let parsed: unknown;
  try {
    parsed = JSON.parse(stdout);
  } catch (err) {
    throw new LatchError(`findmnt ${target} printed something that is not JSON: ${stdout.slice(0, 120)}`, { cause: err });
  }
  const list = (parsed as { filesystems?: unknown }).filesystems;
  if (!Array.isArray(list) || list.length === 0) return undefined;
  const top = list[list.length - 1] as Record<string, unknown>;
  // findmnt prints each column as a string, or null when it has no value.
  const text = (value: unknown) => (typeof value === 'string' ? value : '');
  const options = text(top.options);
  return {
    source: text(top.source),
    target: text(top.target),
    fsType: text(top.fstype),
    options: options === '' ? [] : options.split(','),
  };
}

/** Mounts `source` (a device) at `target` with a filesystem type and checked options. */
export async function mount(source: string, target: string, options: MountOptions): Promise<void> {
  const src = checkPath(source, 'mount source');
  const dst = checkPath(target, 'mount point');
  if (!FS_TYPE.test(options.fsType)) throw new LatchError(`filesystem type ${JSON.stringify(options.fsType)} is not valid`);
  const opts = checkMountOptions(options.options ?? []);
  if (options.readOnly && !opts.includes('ro')) opts.push('ro');
  const args = ['-t', options.fsType];
  if (opts.length > 0) args.push('-o', opts.join(','));
  args.push(src, dst);
  await run('mount', args);
}

/** Bind-mounts `source` at `target`; read-only binds need a second remount (the kernel ignores ro on the bind). */
export async function bindMount(source: string, target: string, readOnly: boolean): Promise<void> {
  const src = checkPath(source, 'bind mount source');
  const dst = checkPath(target, 'mount point');
  await run('mount', ['--bind', src, dst]);
  if (!readOnly) return;
  try {
    await run('mount', ['-o', 'remount,bind,ro', dst]);
  } catch (err) {
    // Never leave a writable bind behind where a read-only one was asked for.
    try {
      await run('umount', [dst]);
    } catch {
      // The original error is the one worth reporting.
    }
    throw err;
  }
}

/**
 * Unmounts the topmost mount at `target`. Returns false (Success-equivalent) when nothing was mounted there,
 * including a missing directory. Lazy (detached) unmount only when asked for explicitly.
 */
export async function umount(target: string, options: { lazy?: boolean } = {}): Promise<boolean> {
  const dst = checkPath(target, 'mount point');
  if (!(await isMountPoint(dst))) return false;
  const args = options.lazy ? ['--lazy', dst] : [dst];
  try {
    await run('umount', args);
    return true;
  } catch (err) {
    // "not mounted" (EINVAL) or a concurrent unmount: the kernel's table is the judge.
    if (err instanceof CommandError && !(await isMountPoint(dst))) return false;
    throw err;
  }
}

/** The sources of every mount on this host (devices, for block-device mounts). */
export async function mountedSources(): Promise<Set<string>> {
  return new Set((await readMountInfo()).map((m) => m.source));
}

/** Whether `device` is mounted anywhere on this host (a global path, a pod's bind mount, a staging path...). */
export async function isDeviceMounted(device: string): Promise<boolean> {
  return (await mountedSources()).has(device);
}

/** Throws unless every option is a single plain mount option (no commas, no leading '-'). */
export function checkMountOptions(options: string[]): string[] {
  for (const option of options) {
    if (typeof option !== 'string' || !MOUNT_OPTION.test(option)) {
      throw new LatchError(`mount option ${JSON.stringify(String(option).slice(0, 64))} is not valid`);
    }
  }
  return [...options];
}

function splitOptions(text: string): string[] {
  return text === '' ? [] : text.split(',');
}

function normalisePath(path: string): string {
  return resolve(path);
}

function checkPath(path: string, what: string): string {
  if (typeof path !== 'string' || !isAbsolute(path) || path.includes('\0') || path.includes('\n')) {
    throw new LatchError(`${what} ${JSON.stringify(String(path).slice(0, 120))} must be an absolute path`);
  }
  return resolve(path);
}

// Mounting a volume's device and proving it: every mount is checked in the kernel's mount table afterwards and undone
// when it shows anything else there. Nothing is ever mounted over something that is already mounted.
import { mkdir, stat } from 'node:fs/promises';
import type { Context } from '../context.js';
import { LatchError } from '../errors.js';
import type { FsType } from '../filesystems.js';
import type { VolumeDoc } from '../ledger/types.js';
import { ensureFilesystem } from './filesystem.js';

export interface VolumeMountRequest {
  /** The filesystem asked for (options), if any: a different one on the device is refused. */
  fsType: FsType | undefined;
  mountOptions: string[];
  /** Mount read-only. */
  readOnly: boolean;
  /** A blank device may be formatted (false for read-only requests: there would be nothing to read). */
  mayFormat: boolean;
}

/**
 * Mounts the volume's `device` at `path` (a directory, created with `dirMode` when missing): the filesystem on the
 * device, or a new one when (and only when) the device is blank; checked in the mount table afterwards. Returns
 * 'already' when the device is already mounted there. Refuses to mount over anything else.
 */
export async function mountVolumeAt(
  ctx: Context,
  doc: VolumeDoc,
  device: string,
  path: string,
  request: VolumeMountRequest,
  dirMode = 0o750,
): Promise<'mounted' | 'already'> {
  await ensureDirectory(path, dirMode);
  const top = (await ctx.system.mountsAt(path)).at(-1);
  if (top) {
    if (top.source === device) return 'already';
    throw new LatchError(`${path} already has ${top.source} mounted; not mounting volume ${doc.name} over it`);
  }
  const fsType = await ensureFilesystem(ctx, doc, device, request.fsType, request.mayFormat);
  await ctx.system.mount(device, path, { fsType, options: request.mountOptions, readOnly: request.readOnly });
  await verifyMount(ctx, path, device, 'after mounting');
  return 'mounted';
}

/** Bind-mounts `source` (where `device` is mounted) at `target`, read-only when asked, and verifies it. */
export async function bindVolumeAt(ctx: Context, source: string, target: string, device: string, readOnly: boolean): Promise<void> {
  await ctx.system.bindMount(source, target, readOnly);
  await verifyMount(ctx, target, device, 'after the bind mount');
}

/**
 * The mount at `path` must now be the root of `device`'s filesystem. Read from /proc/self/mountinfo, as findmnt(8)
 * would read it, without a child process (findmnt cost 4-7 ms a mount): the same table, the same answer.
 */
export async function verifyMount(ctx: Context, path: string, device: string, when: string): Promise<void> {
  const top = (await ctx.system.mountsAt(path)).at(-1);
  if (top?.source !== device || top.root !== '/') {
    await ctx.system.umount(path);
    const shown = top ? `${top.source}${top.root === '/' ? '' : `[${top.root}]`}` : 'nothing';
    throw new LatchError(`${when}, the mount table shows ${shown} at ${path} instead of ${device}; undone`);
  }
}

/** Makes `path` a directory (with `mode`, parents too) unless it is one; refuses anything else in its place. */
export async function ensureDirectory(path: string, mode = 0o750): Promise<void> {
  const info = await stat(path).catch((err: NodeJS.ErrnoException) => {
    if (err.code === 'ENOENT') return undefined;
    throw err;
  });
  if (!info) await mkdir(path, { recursive: true, mode });
  else if (!info.isDirectory()) throw new LatchError(`mount path ${path} exists and is not a directory`);
}

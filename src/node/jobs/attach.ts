// The manual attach (`latch volume attach VOLUME --node N [--mount] [--read-only]`, docs/jobs.md, "Manual attach"),
// the seeds' longhorn-api ticket: the runner sets the device up; this mounts it, when asked, for a person to inspect
// or fsck. It mounts only a filesystem that is there (a manual attach never formats) and read-only when the ticket is.
// The job stays 'succeeded' (the device set up, the mount in place) until `latch volume detach` marks it ending;
// then cleanUp unmounts it and the runner releases the device.
//
// Where it mounts is never the ledger's to say: any node's certificate can write any ledger document, and the agent
// mounts as root (docs/ledger.md, "Who may write the ledger"). So the mount point is this node's own
// `<manualAttach.mountRoot>/<volume>` (a checked volume name), in a root-only directory latch makes, checked component
// by component (no symlink, owned by root, not writable by others) before the mount, and the mount is always nosuid
// and nodev, and noexec unless the configuration says `manualAttach.exec`. A ledger that names any other path (a
// `mountPath` written by an older latch, or by someone else) is refused, and nothing is mounted.
import { lstat, mkdir, realpath, rmdir } from 'node:fs/promises';
import { dirname, isAbsolute, join, normalize } from 'node:path';
import type { Config } from '../../config.js';
import { LatchError } from '../../errors.js';
import { checkVolumeName } from '../../names.js';
import { verifyMount } from '../mount.js';
import type { JobHandler, JobOf, JobRun } from './types.js';

export const attachJob: JobHandler<'attach'> = {
  kind: 'attach',
  async run(job, { ctx, volume, ticket, device, doc }) {
    // A shared volume's job set-up records a grant, not a device (jobs/runner.ts): there is nothing to attach.
    if (doc.spec.shared)
      throw new LatchError(`volume ${volume} is a shared (ReadWriteMany) CephFS volume: it has no block device to attach`);
    const readOnly = ticket.parameters.readOnly;
    const result = { device, readOnly };
    if (!mountAsked(job)) {
      return { message: `volume ${volume} is set up on node ${ctx.config.nodeName} as ${device}${readOnly ? ' (read-only)' : ''}`, result };
    }
    const path = mountPathOf(job, ctx.config, volume);
    await prepareMountPoint(ctx.config, volume);
    const top = (await ctx.system.mountsAt(path)).at(-1);
    if (top?.source === device)
      return { message: `volume ${volume} (${device}) is mounted at ${path}`, result: { ...result, mountPath: path } };
    if (top) throw new LatchError(`${path} is already a mount point (${top.source}); not mounting volume ${volume} over it`);
    const fsType = await ctx.system.probeFsType(device);
    if (fsType === undefined) {
      throw new LatchError(
        `volume ${volume} (${device}) holds no filesystem to mount; a manual attach never formats (attach it without --mount for the raw device)`,
      );
    }
    await ctx.system.mount(device, path, { fsType, options: manualMountOptions(ctx.config), readOnly });
    await verifyMount(ctx, path, device, 'after mounting');
    await ctx.ledger.recordFilesystem(volume, fsType);
    return {
      message: `volume ${volume} (${device}, ${fsType}) is mounted at ${path}${readOnly ? ' read-only' : ''}`,
      result: { ...result, mountPath: path, fsType },
    };
  },
  cleanUp: unmountOurs,
};

/** Whether the job asks for a mount: `mount` (what latch writes), or a `mountPath` (what an older latch wrote). */
function mountAsked(job: JobOf<'attach'>): boolean {
  return job.mount === true || job.mountPath !== undefined;
}

/** Where this node mounts a manual attach of `volume`: `<manualAttach.mountRoot>/<volume>`, and nowhere else. */
export function manualMountPath(config: Pick<Config, 'manualAttach'>, volume: string): string {
  return join(config.manualAttach.mountRoot, checkVolumeName(volume));
}

/** The options of every manual mount: never set-uid programs or device files from the volume; no programs either, by default. */
function manualMountOptions(config: Pick<Config, 'manualAttach'>): string[] {
  return ['nosuid', 'nodev', ...(config.manualAttach.exec ? [] : ['noexec'])];
}

/** The mount point of the job: this node's own path; a ledger that names another one is refused. */
function mountPathOf(job: JobOf<'attach'>, config: Pick<Config, 'manualAttach' | 'nodeName'>, volume: string): string {
  const path = manualMountPath(config, volume);
  if (job.mountPath !== undefined && job.mountPath !== path) {
    throw new LatchError(
      `the ticket asks node ${config.nodeName} to mount volume ${volume} at ${JSON.stringify(job.mountPath.slice(0, 200))}; ` +
        `a manual attach mounts only at ${path} (manualAttach.mountRoot): refused, nothing mounted`,
    );
  }
  return path;
}

/**
 * Makes (or checks) the mount root and the volume's directory in it: each a real directory (not a symlink), owned
 * by root (this process's user), not writable by group or others, and resolving to itself. The root is made 0700
 * with its missing parents; a mount root that fails a check is refused, never repaired.
 */
async function prepareMountPoint(config: Pick<Config, 'manualAttach'>, volume: string): Promise<string> {
  const root = config.manualAttach.mountRoot;
  if (!isAbsolute(root) || normalize(root) !== root || root === '/') {
    throw new LatchError(`manualAttach.mountRoot ${JSON.stringify(root)} must be an absolute, normalized path (not /)`);
  }
  await mkdir(root, { recursive: true, mode: 0o700 });
  await checkOwnDirectory(root, 'manualAttach.mountRoot');
  const realRoot = await realpath(root);
  const path = manualMountPath(config, volume);
  await mkdir(path, { mode: 0o700 }).catch((err: NodeJS.ErrnoException) => {
    if (err.code !== 'EEXIST') throw err;
  });
  await checkOwnDirectory(path, 'the mount point');
  // The root may sit behind a symlink the admin made (its real path is what the mount table shows); nothing below it may.
  const real = await realpath(path);
  if (real !== join(realRoot, volume)) {
    throw new LatchError(`the mount point ${path} resolves to ${real}, outside ${realRoot}: refused, nothing mounted`);
  }
  return path;
}

async function checkOwnDirectory(path: string, what: string): Promise<void> {
  const info = await lstat(path);
  const uid = process.geteuid?.() ?? 0;
  if (info.isSymbolicLink() || !info.isDirectory()) {
    throw new LatchError(`${what} ${path} is ${info.isSymbolicLink() ? 'a symbolic link' : 'not a directory'}: refused, nothing mounted`);
  }
  if (info.uid !== uid || (info.mode & 0o022) !== 0) {
    throw new LatchError(
      `${what} ${path} is owned by uid ${info.uid} with mode ${(info.mode & 0o7777).toString(8)}; it must be owned by uid ${uid} and ` +
        `writable by it alone: refused, nothing mounted (fix: chown ${uid} ${path} && chmod go-w ${path})`,
    );
  }
}

/**
 * Unmounts the volume's device from the job's mount point (only mounts of that device, top down), and removes the
 * empty directory. A job an older latch ran at a `mountPath` of its own: mounts of the device there go too (only the
 * device's own mounts are touched, so a path from the ledger can only undo what latch mounted).
 */
async function unmountOurs(job: JobOf<'attach'>, { ctx, device, volume }: Omit<JobRun, 'signal'>): Promise<void> {
  if (!mountAsked(job)) return;
  const own = manualMountPath(ctx.config, volume);
  const legacy = job.mountPath !== undefined && job.mountPath !== own ? checkedLegacyPath(job.mountPath) : undefined;
  for (const path of legacy === undefined ? [own] : [own, legacy]) {
    for (let i = 0; i < 16; i++) {
      const top = (await ctx.system.mountsAt(path)).at(-1);
      if (top?.source !== device) break;
      await ctx.system.umount(path);
    }
  }
  if (dirname(own) === ctx.config.manualAttach.mountRoot) await rmdir(own).catch(() => undefined);
}

function checkedLegacyPath(path: string): string | undefined {
  return isAbsolute(path) && !path.includes('\0') && normalize(path) === path && path !== '/' ? path : undefined;
}

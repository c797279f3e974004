// The manual attach (`latch volume attach VOLUME --node N [--mount PATH] [--read-only]`, docs/jobs.md, "Manual attach"),
// the seeds' longhorn-api ticket: the runner sets the device up; this mounts it at PATH when asked, for a person to
// inspect or fsck. It mounts only a filesystem that is there (a manual attach never formats) and read-only when the
// ticket is. The job stays 'succeeded' (the device set up, the mount in place) until `latch volume detach` marks it
// ending; then cleanUp unmounts it and the runner releases the device.
import { isAbsolute, normalize } from 'node:path';
import { stat } from 'node:fs/promises';
import { LatchError } from '../../errors.js';
import { verifyMount } from '../mount.js';
import type { JobHandler, JobOf, JobRun } from './types.js';

export const attachJob: JobHandler<'attach'> = {
  kind: 'attach',
  async run(job, { ctx, volume, ticket, device }) {
    const readOnly = ticket.parameters.readOnly;
    const result = { device, readOnly, ...(job.mountPath !== undefined && { mountPath: job.mountPath }) };
    if (job.mountPath === undefined) {
      return { message: `volume ${volume} is set up on node ${ctx.config.nodeName} as ${device}${readOnly ? ' (read-only)' : ''}`, result };
    }
    const path = checkMountPath(job.mountPath);
    const top = (await ctx.system.mountsAt(path)).at(-1);
    if (top?.source === device) return { message: `volume ${volume} (${device}) is mounted at ${path}`, result };
    if (top) throw new LatchError(`${path} is already a mount point (${top.source}); not mounting volume ${volume} over it`);
    const info = await stat(path).catch((err: NodeJS.ErrnoException) => {
      if (err.code === 'ENOENT') throw new LatchError(`mount path ${path} does not exist on node ${ctx.config.nodeName}`);
      throw err;
    });
    if (!info.isDirectory()) throw new LatchError(`mount path ${path} is not a directory`);
    const fsType = await ctx.system.probeFsType(device);
    if (fsType === undefined) {
      throw new LatchError(
        `volume ${volume} (${device}) holds no filesystem to mount; a manual attach never formats (attach it without --mount for the raw device)`,
      );
    }
    await ctx.system.mount(device, path, { fsType, options: [], readOnly });
    await verifyMount(ctx, path, device, 'after mounting');
    await ctx.ledger.recordFilesystem(volume, fsType);
    return {
      message: `volume ${volume} (${device}, ${fsType}) is mounted at ${path}${readOnly ? ' read-only' : ''}`,
      result: { ...result, fsType },
    };
  },
  cleanUp: unmountOurs,
};

/** Unmounts the volume's device from the job's mount path (only mounts of that device, top down). */
async function unmountOurs(job: JobOf<'attach'>, { ctx, device }: Omit<JobRun, 'signal'>): Promise<void> {
  if (job.mountPath === undefined) return;
  const path = checkMountPath(job.mountPath);
  for (let i = 0; i < 16; i++) {
    const top = (await ctx.system.mountsAt(path)).at(-1);
    if (top?.source !== device) return;
    await ctx.system.umount(path);
  }
}

/** A mount path from a ticket: absolute and normal, so that it names exactly the directory the person gave. */
export function checkMountPath(path: string): string {
  if (!isAbsolute(path) || path.includes('\0') || normalize(path) !== path || path === '/') {
    throw new LatchError(`mount path ${JSON.stringify(path)} must be an absolute, normalized path (not /)`);
  }
  return path;
}

// latch volume restore NEW --from-backup B: a new volume filled from a backup by the node agent (docs/jobs.md,
// "Restore"). The volume's document is created together with its restore ticket (priority 2000, never preempted) in
// one ledger write, so no workload can have NEW before the restore is done, nor after it failed.
import { readManifest, type Manifest } from '../../backup/manifest.js';
import type { Context } from '../../context.js';
import { SHARED_ARCHIVE } from '../../node/shared-files.js';
import { checkBackupName } from '../../backup/layout.js';
import { LatchError } from '../../errors.js';
import { FS_TYPES, type FsType } from '../../filesystems.js';
import { finishedJob } from '../../ledger/arbitrate.js';
import { jobTicketId } from '../../ledger/ids.js';
import { checkVolumeName } from '../../names.js';
import { formatSize } from '../../size.js';
import { backupTargetOf } from '../../jobs/backup-target.js';
import { configOf, type CommandIO } from '../io.js';
import { jobNode, jobRequest } from '../../jobs/request.js';
import { FILL_WAIT_MS, createWithTicket, runJob } from './job.js';

export interface VolumeRestoreOptions {
  name: string;
  fromBackup: string;
  node?: string;
  fsType?: string;
  /** false with --no-wait: return once the ticket is in the ledger. */
  wait: boolean;
  /** Seconds to wait for the agent's outcome (the job goes on after). */
  timeout?: number;
}

export async function volumeRestore(options: VolumeRestoreOptions, io: CommandIO): Promise<void> {
  const config = configOf(io);
  const name = checkVolumeName(options.name);
  const backup = checkBackupName(options.fromBackup);
  // A backup that does not exist or whose manifest is damaged is refused here, before any volume is made.
  const manifest = await readManifest(backupTargetOf(config), backup);
  if (manifest.sizeBytes > config.maxSize) {
    throw new LatchError(`backup ${backup} is ${formatSize(manifest.sizeBytes)}, above maxSize (${formatSize(config.maxSize)})`);
  }
  const fsType = (options.fsType ?? knownFsType(manifest.fsType) ?? config.defaultFsType) as FsType;
  if (!config.allowedFsTypes.includes(fsType)) {
    throw new LatchError(`--fs-type ${fsType} is not allowed; allowed: ${config.allowedFsTypes.join(', ')}`);
  }
  const ctx = io.context(config);
  // The files of a shared volume (a tar archive: node/jobs/shared-files.ts) make a new shared volume.
  const shared = manifest.fsType === SHARED_ARCHIVE;
  const job = { kind: 'restore', backup } as const;
  const id = jobTicketId('restore', name, backup);
  const existing = await ctx.ledger.get(name);
  if (existing) {
    const repeat = existing.spec.tickets[id];
    if (!repeat) {
      if (finishedJob(existing, id)?.status.state === 'succeeded') {
        io.out(`volume ${name} was restored from backup ${backup} already\n`);
        return;
      }
      throw new LatchError(`volume ${name} already exists; a restore makes a new volume: choose another name (or delete ${name} first)`);
    }
  }
  // A repeated restore stays on the node it was asked for (its ticket says which); a new one on --node or here.
  const node = existing?.spec.tickets[id]?.nodeID ?? jobNode(ctx, name, existing, options.node);
  if (options.node !== undefined && node !== options.node) {
    throw new LatchError(`the restore of ${name} was asked for on node ${node}; repeat it without --node, or delete ${name} first`);
  }
  const request = jobRequest(ctx, name, job, node);
  io.out(
    `restoring backup ${backup} (volume ${manifest.volume}, ${formatSize(manifest.sizeBytes)}) into new volume ${name} on node ${node}\n`,
  );
  if (!existing)
    await createWithTicket(ctx, name, request, { sizeBytes: await sizeOf(ctx, manifest), fsType, ...(shared && { shared: true }) });
  await runJob(ctx, io, name, request, {
    wait: options.wait,
    timeoutMs: options.timeout === undefined ? FILL_WAIT_MS : options.timeout * 1000,
    // A repeat after a failure must never lose its ticket (the volume is half-made); a fresh one that no agent takes
    // up is taken back, with the empty volume it made.
    keepUnstarted: existing !== undefined,
    undoCreate: existing === undefined,
  });
}

/** The manifest's filesystem when latch can make it (otherwise the default; the agent records what it finds). */
function knownFsType(fsType: string | undefined): FsType | undefined {
  return fsType !== undefined && (FS_TYPES as readonly string[]).includes(fsType) ? (fsType as FsType) : undefined;
}

/**
 * The new volume's size: the backup's image size; for a shared volume's archive (whose image is the archive's bound,
 * not the volume's quota), the source volume's quota when the ledger still has it and it is larger.
 */
async function sizeOf(ctx: Context, manifest: Manifest): Promise<number> {
  if (manifest.fsType !== SHARED_ARCHIVE) return manifest.sizeBytes;
  const source = await ctx.ledger.get(manifest.volume);
  const archive = Math.ceil(manifest.sizeBytes / MiB) * MiB;
  return Math.min(Math.max(archive, source?.spec.shared ? source.spec.sizeBytes : 0), ctx.config.maxSize);
}

const MiB = 1024 * 1024;

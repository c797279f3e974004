// latch backup create: back a volume up to the backup target. In use on this node: done here at once, through a
// snapshot taken with its filesystem frozen. In use on another node, or idle: asked of the node agent through a
// backup ticket (docs/jobs.md), on the node that holds it or, for an idle volume, on --node or this node.
import { createBackup, defaultBackupName } from '../../backup/create.js';
import { checkBackupName, describeTarget } from '../../backup/layout.js';
import { checkTarget } from '../../backup/store.js';
import { manifestExists } from '../../backup/manifest.js';
import { LatchError, errorMessage } from '../../errors.js';
import { checkVolumeName } from '../../names.js';
import { diffingBackend, incrementalBackup } from '../../node/backup.js';
import { observed } from '../../node/backup-outcome.js';
import { backupSummary } from '../../node/jobs/backup.js';
import { openBackupSource } from '../../node/snapshot.js';
import type { Context } from '../../context.js';
import type { BackupTarget } from '../../backup/layout.js';
import type { Manifest } from '../../backup/manifest.js';
import { formatSize } from '../../size.js';
import { configOf, type CommandIO } from '../io.js';
import { holdersOf, jobNode, jobRequest } from '../../jobs/request.js';
import { requestAndReport } from '../job-report.js';
import { formatJson, type OutputFormat } from '../output.js';
import { backupTargetOf } from '../../jobs/backup-target.js';
import { recordDirectBackup } from '../../jobs/direct.js';

export interface BackupCreateOptions {
  volume: string;
  name?: string;
  fromSnapshot?: string;
  output: OutputFormat;
  /** The node that does it when the volume is idle (default: this one). */
  node?: string;
  /** false (--no-wait): return once the ticket is added. */
  wait?: boolean;
  /** Seconds to wait for the agent's outcome (default 3600). */
  timeout?: number;
}

export async function backupCreate(options: BackupCreateOptions, io: CommandIO): Promise<void> {
  const config = configOf(io);
  const volume = checkVolumeName(options.volume);
  if (options.name !== undefined) checkBackupName(options.name);
  const target = backupTargetOf(config);
  // Before a snapshot is taken or a ticket added for it: a missing target fails at once.
  await checkTarget(target);
  const ctx = io.context(config);
  const doc = await ctx.ledger.get(volume);
  if (!doc) throw new LatchError(`volume ${volume} does not exist (latch volume list shows the volumes)`);
  const node = jobNode(ctx, volume, doc, options.node);
  // The name is fixed now, so that the ticket (and an agent that redoes it after a kill) names the same backup.
  const name = options.name ?? defaultBackupName(volume, new Date(ctx.clock()).toISOString());
  const job = { kind: 'backup' as const, backup: name, ...(options.fromSnapshot !== undefined && { fromSnapshot: options.fromSnapshot }) };
  const request = jobRequest(ctx, volume, job, node);
  const underWay = doc.spec.tickets[request.id] !== undefined;
  if (!underWay && (await manifestExists(target, name)))
    throw new LatchError(`a backup named ${name} already exists in ${describeTarget(target)}`);

  // A shared volume's backup is always the agent's job (its ticket shares the volume with its pods at once).
  if (!(node === config.nodeName && holdersOf(doc).includes(node)) || underWay || doc.spec.shared) {
    await requestAndReport(ctx, io, volume, request, options);
    return;
  }

  // In use here: done now, beside the pod, without an agent. Its outcome is logged for the agent's metrics and, once
  // known, recorded in the volume's status.jobs as a finished backup job's is (jobs/direct.ts): a failed one has no
  // manifest, and `latch backup list` would otherwise go on showing the last success.
  const startedAt = ctx.ledger.now();
  let made: Awaited<ReturnType<typeof backUpHere>>;
  try {
    made = await observed(
      config,
      { kind: 'backup', trigger: 'manual', volume, name },
      () => backUpHere(ctx, { target, volume, name, fromSnapshot: options.fromSnapshot, fsType: doc.status.filesystem }),
      (done) => ({ read: done.bytesRead, written: done.manifest.stats.newBytesStored }),
    );
  } catch (err) {
    // The command fails with the backup's own message; a record that cannot be written is only logged.
    await recordDirectBackup(ctx, volume, name, { state: 'failed', message: errorMessage(err), startedAt });
    throw err;
  }
  const { manifest, source } = made;
  const s = manifest.stats;
  const consistency = `${source.consistency}${source.note ? `: ${source.note}` : ''}`;
  const notRecorded = await recordDirectBackup(ctx, volume, name, {
    state: 'succeeded',
    message:
      `backup ${manifest.name} of volume ${volume} created beside the pod (${consistency}): ${formatSize(manifest.sizeBytes)}, ` +
      `${s.newChunks} new chunk(s) (${formatSize(s.newBytesStored)} written), ${s.presentChunks} already in the target`,
    result: { ...backupSummary(manifest, source.consistency, source.note), bytesRead: made.bytesRead },
    startedAt,
  });
  const { chunks, ...summary } = manifest;
  if (options.output === 'json') {
    const note = source.note !== undefined && { consistencyNote: source.note };
    const unrecorded = notRecorded !== undefined && { outcomeNotRecorded: notRecorded };
    io.out(formatJson({ ...summary, chunkCount: chunks.length, consistency: source.consistency, ...note, ...unrecorded }));
    return;
  }
  io.out(
    `backup ${manifest.name} of volume ${volume} created in ${describeTarget(target)} (${consistency}, from ${manifest.source}):\n` +
      `  ${formatSize(manifest.sizeBytes)}, ${s.dataChunks} data chunk(s) (${formatSize(s.dataBytes)}), ${s.holeChunks} hole(s)\n` +
      `  ${s.newChunks} new chunk(s) written (${formatSize(s.newBytesStored)} compressed), ${s.presentChunks} already in the target` +
      (manifest.parent ? ` (previous backup: ${manifest.parent})` : '') +
      '\n' +
      // The backup is complete all the same: `backup list` finds it in the target; only the ledger's history misses it.
      (notRecorded === undefined ? '' : `  (its outcome is not in the ledger's job history: ${notRecorded})\n`),
  );
}

/** A backup of a volume in use here: incremental from Ceph's snapshots where the backend can (node/backup.ts). */
async function backUpHere(
  ctx: Context,
  options: { target: BackupTarget; volume: string; name: string; fromSnapshot: string | undefined; fsType: string | undefined },
): Promise<{ manifest: Manifest; source: { consistency: string; note?: string | undefined }; bytesRead: number }> {
  const { target, volume, name } = options;
  const node = ctx.config.nodeName;
  if (diffingBackend(ctx)) {
    const made = await incrementalBackup(ctx, { target, volume, name, node, fsType: options.fsType, fromSnapshot: options.fromSnapshot });
    return { manifest: made.manifest, source: made, bytesRead: made.bytesRead };
  }
  const source = await openBackupSource(ctx, volume, options.fromSnapshot);
  try {
    const manifest = await createBackup({
      target,
      source: source.image.path,
      volume,
      name,
      sourceDescription: source.image.description,
      node,
      // The filesystem it holds, so that a restore recreates the volume with it.
      fsType: options.fsType,
      beforePublish: source.beforePublish,
    });
    return { manifest, source, bytesRead: manifest.stats.dataBytes };
  } finally {
    await source.release();
  }
}

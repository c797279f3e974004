// latch backup list: the complete backups in the target (of one volume, or all), and damaged manifests as such; an
// unauthenticated manifest (an unkeyed checksum only: backup/manifest.ts) is listed, and says so. Then the last
// outcome of each volume's backups: the newest of its complete backups and of the backup jobs the ledger records
// (a failed one has no manifest, and is seen only there).
import { listBackups, type ListedBackup } from '../../backup/manifest.js';
import { errorMessage } from '../../errors.js';
import type { FinishedJob, JobSpec, JobStatus, Ticket, VolumeDoc } from '../../ledger/types.js';
import { checkVolumeName } from '../../names.js';
import { formatSize } from '../../size.js';
import { configOf, type CommandIO } from '../io.js';
import { formatJson, formatTable, type OutputFormat } from '../output.js';
import { backupTargetOf } from '../../jobs/backup-target.js';

export async function backupList(options: { volume?: string; output: OutputFormat }, io: CommandIO): Promise<void> {
  if (options.volume !== undefined) checkVolumeName(options.volume);
  const target = backupTargetOf(configOf(io));
  const backups = await listBackups(target, options.volume);
  if (options.output === 'json') {
    // The list of backups, as before: the outcomes are in the table (and in `latch ticket list` for jobs).
    io.out(
      formatJson(
        backups.map((b) => {
          if (!b.manifest) return { name: b.name, error: b.error };
          // As many as the size needs: a manifest that lists another number is refused as damaged (backup/manifest.ts).
          const chunkCount = Math.ceil(b.manifest.sizeBytes / b.manifest.chunkSize);
          return { ...b.manifest, chunkCount, authenticated: b.authenticated === true };
        }),
      ),
    );
    return;
  }
  io.out(
    formatTable(
      ['name', 'volume', 'size', 'data', 'stored', 'created', 'authenticated', 'parent'],
      backups.map((b) => {
        const m = b.manifest;
        if (!m) return [b.name, '?', '-', '-', '-', '-', '-', `DAMAGED: ${b.error ?? ''}`];
        return [
          m.name,
          m.volume,
          formatSize(m.sizeBytes),
          formatSize(m.stats.dataBytes),
          formatSize(m.stats.newBytesStored),
          m.createdAt,
          b.authenticated ? 'yes' : 'NO',
          m.parent ?? '-',
        ];
      }),
    ),
  );
  let docs: VolumeDoc[];
  try {
    docs = (await io.context(configOf(io)).ledger.list()).docs;
  } catch (err) {
    io.out(`\n(the last outcomes need the ledger, which cannot be read: ${errorMessage(err)})\n`);
    return;
  }
  const outcomes = lastOutcomes(backups, docs, options.volume);
  if (outcomes.length === 0) return;
  io.out(
    '\n' +
      formatTable(
        ['volume', 'last outcome', 'at', 'backup', 'node', 'message'],
        outcomes.map((o) => [o.volume, o.outcome, o.at, o.backup, o.node ?? '-', (o.message ?? '').slice(0, 160)]),
      ),
  );
}

export interface LastOutcome {
  volume: string;
  outcome: 'succeeded' | 'failed' | 'running';
  at: string;
  backup: string;
  node?: string;
  message?: string;
}

/**
 * Per volume, its newest backup event: a complete backup in the target (succeeded), or a backup job in the ledger,
 * finished (succeeded or failed, with its message; a backup run beside a pod is recorded the same way) or still
 * running. The ledger is another node's writing: an entry whose fields are not what latch writes is passed over.
 */
export function lastOutcomes(backups: ListedBackup[], docs: VolumeDoc[], volume?: string): LastOutcome[] {
  const newest = new Map<string, LastOutcome>();
  const offer = (o: LastOutcome | undefined) => {
    if (o === undefined || (volume !== undefined && o.volume !== volume)) return;
    const seen = newest.get(o.volume);
    if (!seen || o.at > seen.at || (o.at === seen.at && o.outcome !== 'succeeded')) newest.set(o.volume, o);
  };
  for (const b of backups) {
    const m = b.manifest;
    if (m) offer({ volume: m.volume, outcome: 'succeeded', at: m.completedAt, backup: m.name, node: m.node });
  }
  for (const doc of docs) {
    const jobs: unknown[] = Array.isArray(doc.status.jobs) ? doc.status.jobs : [];
    for (const finished of jobs as Array<Partial<FinishedJob> | null>) {
      const state = finished?.status?.state;
      if (state !== 'succeeded' && state !== 'failed') continue;
      offer(backupEvent(doc.name, finished?.job, finished?.status, state));
    }
    const tickets: Array<Partial<Ticket> | null> = Object.values(doc.spec.tickets);
    const statuses = (doc.status.tickets as Partial<VolumeDoc['status']['tickets']> | undefined) ?? {};
    for (const ticket of tickets) {
      const job: Partial<JobStatus> | undefined = typeof ticket?.id === 'string' ? statuses[ticket.id]?.job : undefined;
      if (job === undefined) continue;
      offer(backupEvent(doc.name, ticket?.job, job, job.state === 'failed' || job.state === 'succeeded' ? job.state : 'running'));
    }
  }
  return [...newest.values()].sort((a, b) => a.volume.localeCompare(b.volume));
}

/** One backup job's event, if its fields are the strings latch writes (else undefined: it is not shown). */
function backupEvent(
  volume: string,
  spec: Partial<JobSpec> | undefined,
  status: Partial<JobStatus> | undefined,
  outcome: LastOutcome['outcome'],
): LastOutcome | undefined {
  if (spec?.kind !== 'backup' || typeof spec.backup !== 'string') return undefined;
  const at = status?.finishedAt ?? status?.startedAt;
  const { node, message } = status ?? {};
  if (typeof at !== 'string' || (node !== undefined && typeof node !== 'string')) return undefined;
  if (outcome === 'failed' && typeof message !== 'string') return undefined;
  return { volume, outcome, at, backup: spec.backup, ...(node !== undefined && { node }), ...(outcome === 'failed' && { message }) };
}

// latch snapshot create: a consistent snapshot of a volume. In use on this node: taken here at once (frozen if
// mounted). In use on another node, or idle: asked of the node agent through a snapshot ticket (docs/jobs.md), on the
// node that holds it (frozen there) or, for an idle volume, on --node or this node (the seeds' auto-attach flow).
// A shared volume's: always a snapshot ticket, on --node or this node (a CephFS subvolume snapshot, no freeze).
import { hasSnapshots } from '../../backend/types.js';
import { LatchError } from '../../errors.js';
import { checkVolumeName } from '../../names.js';
import { refuseBaseName } from '../../node/backup.js';
import { snapshotVolume } from '../../node/snapshot.js';
import { formatSize } from '../../size.js';
import { configOf, type CommandIO } from '../io.js';
import { holdersOf, jobNode, jobRequest } from '../../jobs/request.js';
import { requestAndReport } from '../job-report.js';
import { formatJson, type OutputFormat } from '../output.js';

export interface SnapshotCreateOptions {
  volume: string;
  name: string;
  output: OutputFormat;
  /** The node that takes it when the volume is idle (default: this one). */
  node?: string;
  /** false (--no-wait): return once the ticket is added. */
  wait?: boolean;
  /** Seconds to wait for the agent's outcome (default 3600). */
  timeout?: number;
}

export async function snapshotCreate(options: SnapshotCreateOptions, io: CommandIO): Promise<void> {
  const volume = checkVolumeName(options.volume);
  const name = checkVolumeName(options.name, 'snapshot name', 200);
  refuseBaseName(name);
  const config = configOf(io);
  const ctx = io.context(config);
  const doc = await ctx.ledger.get(volume);
  if (!doc) throw new LatchError(`volume ${volume} does not exist (latch volume list shows the volumes)`);
  const node = jobNode(ctx, volume, doc, options.node);
  const request = jobRequest(ctx, volume, { kind: 'snapshot', snapshot: name }, node);

  // A shared volume's snapshot is always the agent's job (a snapshot ticket shares the volume with its pods at once).
  if (!doc.spec.shared && node === config.nodeName && holdersOf(doc).includes(node) && !doc.spec.tickets[request.id]) {
    // In use here: taken now, beside the pod, without an agent.
    const { info, consistency, note } = await snapshotVolume(ctx, volume, name);
    if (options.output === 'json') {
      io.out(formatJson({ ...info, consistency, ...(note !== undefined && { consistencyNote: note }) }));
      return;
    }
    const how = {
      frozen: 'its filesystem was frozen while it was cut',
      idle: 'the volume was not in use',
      'crash-consistent': `crash-consistent: ${note ?? 'set up here but not mounted'}`,
    }[consistency];
    io.out(`snapshot ${name} of volume ${volume} created (${info.sharing}, ${formatSize(info.sizeBytes)}; ${how})\n`);
    return;
  }

  // A taken name is refused before anything is asked (a job finds "its" snapshot done), unless this very job is
  // under way: then the request finds its ticket and waits for it.
  const snapshots = doc.spec.shared
    ? await (await import('../../node/shared.js')).sharedVolumesOf(ctx)
    : hasSnapshots(ctx.backend)
      ? ctx.backend
      : undefined;
  if (!doc.spec.tickets[request.id] && snapshots && (await snapshots.listSnapshots(volume)).some((s) => s.name === name)) {
    throw new LatchError(`volume ${volume} already has a snapshot named ${name}`);
  }
  await requestAndReport(ctx, io, volume, request, options);
}

// latch ticket list: who asked for a volume (one volume's tickets, or every volume's; all of them, or one node's).
import { shortTicketId } from '../../ledger/ids.js';
import { SEED_ATTACHER_TYPE, TICKET_PRIORITY, type Ticket, type TicketStatus } from '../../ledger/types.js';
import { checkNodeName } from '../../names.js';
import { configOf, type CommandIO } from '../io.js';
import { formatJson, formatTable, type OutputFormat } from '../output.js';
import { describeRequester, getVolume } from '../volume-doc.js';

export interface TicketListOptions {
  volume?: string;
  /** Only the tickets for this node. */
  node?: string;
  output: OutputFormat;
}

/** Exit 1 when a volume's document cannot be read: its tickets are unknown; it is named after the table (in JSON, as `{ volume, damaged }`). */
export async function ticketList(options: TicketListOptions, io: CommandIO): Promise<number> {
  const { node } = options;
  if (node !== undefined) checkNodeName(node);
  const { ledger } = io.context(configOf(io));
  const { docs, damaged } = options.volume ? { docs: [await getVolume(ledger, options.volume)], damaged: [] } : await ledger.list();
  const status = damaged.length > 0 ? 1 : 0;
  const rows = docs.flatMap((d) =>
    Object.values(d.spec.tickets)
      .filter((t) => node === undefined || t.nodeID === node)
      .map((t) => ({
        volume: d.name,
        ...t,
        priority: TICKET_PRIORITY[t.type],
        attacherType: SEED_ATTACHER_TYPE[t.type],
        status: d.status.tickets[t.id],
      })),
  );
  if (options.output === 'json') {
    io.out(formatJson([...rows, ...damaged.map((d) => ({ volume: d.name, damaged: d.reason }))]));
    return status;
  }
  io.out(
    formatTable(
      ['volume', 'ticket', 'type', 'node', 'mode', 'satisfied', 'job', 'requested by', 'expires', 'conditions', 'message'],
      rows.map((r) => [
        r.volume,
        shortTicketId(r.id),
        `${r.type} (${r.priority})`,
        r.nodeID,
        r.parameters.readOnly ? 'ro' : 'rw',
        r.status?.satisfied && r.status.generation === r.generation ? 'yes' : 'no',
        describeJob(r, r.status),
        r.owner ? `${describeRequester(r.requestedBy)} (${r.owner})` : describeRequester(r.requestedBy),
        r.expiresAt ?? '-',
        (r.status?.conditions ?? []).map((c) => `${c.type}=${c.status}(${c.reason})`).join(' ') || '-',
        r.status?.job ? `${r.status.message}; job: ${r.status.job.message}` : (r.status?.message ?? ''),
      ]),
    ),
  );
  for (const d of damaged) io.out(`volume ${d.name}: its tickets cannot be read: ${d.reason}\n`);
  return status;
}

/** A job ticket's job and how far it got, e.g. "snapshot: running (attempt 2)" or "backup: not started". */
function describeJob(ticket: Ticket, status: TicketStatus | undefined): string {
  if (!ticket.job) return '-';
  const job = status?.job;
  if (!job) return `${ticket.job.kind}: not started`;
  return `${ticket.job.kind}: ${job.state}${job.attempts > 1 ? ` (attempt ${job.attempts})` : ''}`;
}

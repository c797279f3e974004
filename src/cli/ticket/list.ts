// latch ticket list: who asked for a volume (one volume's tickets, or every volume's; all of them, or one node's).
import { shortTicketId } from '../../ledger/ids.js';
import { checkNodeName } from '../../names.js';
import { configOf, type CommandIO } from '../io.js';
import { formatJson, formatTable, type OutputFormat } from '../output.js';
import { describeRequester, getVolume } from '../volume/volume-doc.js';

export interface TicketListOptions {
  volume?: string;
  /** Only the tickets for this node. */
  node?: string;
  output: OutputFormat;
}

export async function ticketList(options: TicketListOptions, io: CommandIO): Promise<void> {
  const { node } = options;
  if (node !== undefined) checkNodeName(node);
  const { ledger } = io.context(configOf(io));
  const docs = options.volume ? [await getVolume(ledger, options.volume)] : await ledger.list();
  const rows = docs.flatMap((d) =>
    Object.values(d.spec.tickets)
      .filter((t) => node === undefined || t.nodeID === node)
      .map((t) => ({ volume: d.name, ...t, status: d.status.tickets[t.id] })),
  );
  if (options.output === 'json') {
    io.out(formatJson(rows));
    return;
  }
  io.out(
    formatTable(
      ['volume', 'ticket', 'type', 'node', 'mode', 'satisfied', 'requested by', 'expires', 'condition'],
      rows.map((r) => [
        r.volume,
        shortTicketId(r.id),
        r.type,
        r.nodeID,
        r.parameters.readOnly ? 'ro' : 'rw',
        r.status?.satisfied && r.status.generation === r.generation ? 'yes' : 'no',
        r.owner ? `${describeRequester(r.requestedBy)} (${r.owner})` : describeRequester(r.requestedBy),
        r.expiresAt ?? '-',
        r.status?.message ?? '',
      ]),
    ),
  );
}

// latch ticket list: who asked for a volume (one volume's tickets, or every volume's).
import { shortTicketId } from '../../ledger/ids.js';
import type { Ticket } from '../../ledger/types.js';
import { configOf, type CommandIO } from '../io.js';
import { formatJson, formatTable, type OutputFormat } from '../output.js';
import { getVolume } from '../volume/volume-doc.js';

export async function ticketList(options: { volume?: string; output: OutputFormat }, io: CommandIO): Promise<void> {
  const { ledger } = io.context(configOf(io));
  const docs = options.volume ? [await getVolume(ledger, options.volume)] : await ledger.list();
  const rows = docs.flatMap((d) => Object.values(d.spec.tickets).map((t) => ({ volume: d.name, ...t, status: d.status.tickets[t.id] })));
  if (options.output === 'json') {
    io.out(formatJson(rows));
    return;
  }
  io.out(
    formatTable(
      ['volume', 'ticket', 'type', 'node', 'mode', 'satisfied', 'requested by', 'condition'],
      rows.map((r) => [
        r.volume,
        shortTicketId(r.id),
        r.type,
        r.nodeID,
        r.parameters.readOnly ? 'ro' : 'rw',
        r.status?.satisfied && r.status.generation === r.generation ? 'yes' : 'no',
        describeRequester(r.requestedBy),
        r.status?.message ?? '',
      ]),
    ),
  );
}

function describeRequester(by: Ticket['requestedBy']): string {
  if (by.admin) return 'admin';
  const pod = by.pod?.name ? ` pod ${by.pod.namespace ?? ''}/${by.pod.name}` : '';
  return `${by.pvName ? `pv ${by.pvName}` : ''}${pod}` || '-';
}

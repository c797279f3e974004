// latch node check: may this node be drained or deleted now? Asked of the ledger, as Kubernetes asks whether any
// VolumeAttachment still names the node: the node may go when no volume has a ticket for it and no volume lists it
// in status.nodes, whatever the phase. Otherwise, per volume, what ties the node and what clears each tie.
import { ticketsOfNode } from '../../ledger/arbitrate.js';
import { shortTicketId } from '../../ledger/ids.js';
import type { DamagedVolume } from '../../ledger/ledger.js';
import type { NodePhase, Ticket, TicketType, VolumeDoc } from '../../ledger/types.js';
import { checkNodeName } from '../../names.js';
import { configOf, type CommandIO } from '../io.js';
import { formatJson, type OutputFormat } from '../output.js';
import { concernsNode, describeRequester } from '../volume-doc.js';

export interface NodeCheckOptions {
  node: string;
  output: OutputFormat;
}

/** One ticket for the node, and what removes it. */
interface TicketTie {
  id: string;
  shortId: string;
  type: TicketType;
  requestedBy: string;
  satisfied: boolean;
  clearedBy: string;
}

/** One volume that still names the node: its hold (absent when the node only has tickets) and its tickets. */
interface VolumeTie {
  volume: string;
  hold?: { phase: NodePhase; since: string; readOnly: boolean; device?: string; clearedBy: string };
  tickets: TicketTie[];
}

interface NodeCheck {
  node: string;
  mayGo: boolean;
  volumes: VolumeTie[];
  /** Volumes whose documents cannot be read: whether they name the node is unknown. */
  damaged: DamagedVolume[];
}

/** Exit status: 0 when the node may be drained or deleted now, 1 when a volume still names it (or on a refusal). */
export async function nodeCheck(options: NodeCheckOptions, io: CommandIO): Promise<number> {
  const { node } = options;
  checkNodeName(node);
  const { docs, damaged } = await io.context(configOf(io)).ledger.list();
  const check = checkNode(docs, damaged, node);
  io.out(options.output === 'json' ? formatJson(check) : formatNodeCheck(check));
  return check.mayGo ? 0 : 1;
}

/** What the ledger says about the node (pure). */
function checkNode(docs: VolumeDoc[], damaged: DamagedVolume[], node: string): NodeCheck {
  const volumes = docs.filter((d) => concernsNode(d, node)).map((d) => volumeTie(d, node));
  // A damaged document may name the node: it may not go until the document is repaired.
  return { node, mayGo: volumes.length === 0 && damaged.length === 0, volumes, damaged };
}

function volumeTie(doc: VolumeDoc, node: string): VolumeTie {
  const entry = doc.status.nodes[node];
  const tickets = ticketsOfNode(doc, node).map((t) => ticketTie(doc, node, t));
  if (!entry) return { volume: doc.name, tickets };
  const { phase, since, readOnly, device } = entry;
  return {
    volume: doc.name,
    hold: { phase, since, readOnly, ...(device !== undefined && { device }), clearedBy: holdClearedBy(doc.name, node, phase) },
    tickets,
  };
}

function ticketTie(doc: VolumeDoc, node: string, ticket: Ticket): TicketTie {
  const status = doc.status.tickets[ticket.id];
  return {
    id: ticket.id,
    shortId: shortTicketId(ticket.id),
    type: ticket.type,
    requestedBy: ticket.owner ? `${describeRequester(ticket.requestedBy)} (${ticket.owner})` : describeRequester(ticket.requestedBy),
    satisfied: !!status && status.satisfied && status.generation === ticket.generation,
    clearedBy:
      ticket.type === 'workload'
        ? `the pod leaving ${node} (kubelet unmounts, the controller detaches); ${ifDown(doc.name, node)}`
        : // A unique prefix of the ID is enough for ticket remove; the short ID without its "...".
          `latch ticket remove ${doc.name} ${ticket.id.slice(0, ticket.id.indexOf('-') + 13)}` +
          (ticket.expiresAt ? `; it expires by itself at ${ticket.expiresAt}` : ''),
  };
}

function holdClearedBy(volume: string, node: string, phase: NodePhase): string {
  switch (phase) {
    case 'granted':
      return `goes with the node's tickets (${node} has not touched the device)`;
    case 'attaching':
    case 'attached':
      return `once no ticket wants it there, ${node} must unmount the volume and release its device; ${ifDown(volume, node)}`;
    case 'detaching':
      return (
        `${node} must unmount the volume and release its device (unmountdevice or unmount confirms it; ` +
        `latch agent on ${node} does it once ${node} has no device of it); ${ifDown(volume, node)}`
      );
  }
}

function ifDown(volume: string, node: string): string {
  return `if ${node} is down for good: latch volume release ${volume} --node ${node} --node-is-down`;
}

/** The report for people: the verdict, then each volume with its hold and tickets and what clears them. */
function formatNodeCheck(check: NodeCheck): string {
  if (check.mayGo) return `node ${check.node} may be drained or deleted: no volume has a ticket for it or lists it\n`;
  const unread = check.damaged.length > 0 ? `, and ${check.damaged.length} volume document(s) cannot be read` : '';
  const lines = [`node ${check.node} may not be drained or deleted yet: ${check.volumes.length} volume(s) still name it${unread}`];
  for (const d of check.damaged) lines.push(`volume ${d.name}: its document cannot be read, repair it first: ${d.reason}`);
  for (const v of check.volumes) {
    const hold = v.hold
      ? `${v.hold.phase}${v.hold.readOnly ? ' read-only' : ''} since ${v.hold.since}${v.hold.device ? ` (device ${v.hold.device})` : ''}`
      : 'not granted (tickets only)';
    lines.push(`volume ${v.volume}: ${hold}; ${v.tickets.length === 0 ? 'no tickets' : `${v.tickets.length} ticket(s)`}`);
    for (const t of v.tickets) {
      lines.push(`  ticket ${t.shortId} ${t.type}, requested by ${t.requestedBy}${t.satisfied ? '' : ', not satisfied'}`);
      lines.push(`    cleared by: ${t.clearedBy}`);
    }
    if (v.hold) lines.push(`  ${v.hold.phase}: ${v.hold.clearedBy}`);
  }
  return `${lines.join('\n')}\n`;
}

// latch ticket add: ask for a volume on a node, as an admin.
import { LatchError } from '../../errors.js';
import { ticketId } from '../../ledger/ids.js';
import { TICKET_TYPES, type TicketType } from '../../ledger/types.js';
import { checkNodeName } from '../../names.js';
import { configOf, type CommandIO } from '../io.js';
import { getVolume } from '../volume/volume-doc.js';

export interface TicketAddOptions {
  volume: string;
  node: string;
  type: TicketType;
  readOnly?: boolean;
}

/** The --type value; a LatchError (which the surface reports as a bad option value) for anything else. */
export function parseTicketType(value: string): TicketType {
  if (!(TICKET_TYPES as string[]).includes(value)) {
    throw new LatchError(`--type ${value} is not a ticket type; use one of ${TICKET_TYPES.join(', ')}`);
  }
  return value as TicketType;
}

export async function ticketAdd(options: TicketAddOptions, io: CommandIO): Promise<void> {
  const { volume, node, type } = options;
  checkNodeName(node);
  const config = configOf(io);
  const { ledger } = io.context(config);
  await getVolume(ledger, volume);
  const id = ticketId(type, volume, config.driverName, node);
  const doc = await ledger.addTicket(volume, {
    id,
    type,
    nodeID: node,
    parameters: { readOnly: !!options.readOnly },
    requestedBy: { admin: true },
  });
  const status = doc?.status.tickets[id];
  io.out(`ticket ${id} added: ${status?.satisfied ? 'satisfied' : 'unsatisfied'} (${status?.message})\n`);
}

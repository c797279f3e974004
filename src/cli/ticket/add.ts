// latch ticket add: ask for a volume on a node, as an admin. Admin and maintenance tickets name their owner and may
// have a time to live, after which the reaper (latch agent, or the next ticket write on the volume) removes them.
import { LatchError } from '../../errors.js';
import { ticketId } from '../../ledger/ids.js';
import type { TicketType } from '../../ledger/types.js';
import { checkNodeName } from '../../names.js';
import { configOf, type CommandIO } from '../io.js';
import { getVolume } from '../volume-doc.js';

export interface TicketAddOptions {
  volume: string;
  node: string;
  type: TicketType;
  readOnly?: boolean;
  /** Who asks (a person or a tool): required for admin and maintenance tickets. */
  owner?: string;
  /** Time to live in seconds (parsed from --ttl 90m, 2h, 1d). */
  ttl?: number;
}

/** Ticket types a person asks for: they must say who they are, so a leftover ticket has someone to ask. */
const OWNED_TYPES: readonly TicketType[] = ['admin', 'maintenance'];

/**
 * The types a person adds by hand: reservations (no device is set up for them) and a workload ticket. A restore
 * ticket added here is a reservation at restore priority, as before jobs existed: it carries no job.
 */
export const ADDABLE_TICKET_TYPES: readonly TicketType[] = ['restore', 'admin', 'workload', 'maintenance'];

/** Job ticket types carry work for the node agent: the command that does the work makes them, with their job. */
const MADE_BY: Partial<Record<TicketType, string>> = {
  manual: 'latch volume attach',
  snapshot: 'latch snapshot create',
  backup: 'latch backup create',
  clone: 'latch volume clone',
};

/** The --type value; a LatchError (which the surface reports as a bad option value) for anything else. */
export function parseTicketType(value: string): TicketType {
  const command = MADE_BY[value as TicketType];
  if (command !== undefined) {
    throw new LatchError(
      `--type ${value}: ${value} tickets carry a job for the node agent and are made by \`${command}\`, not by ticket add`,
    );
  }
  if (!(ADDABLE_TICKET_TYPES as string[]).includes(value)) {
    throw new LatchError(`--type ${value} is not a ticket type; use one of ${ADDABLE_TICKET_TYPES.join(', ')}`);
  }
  return value as TicketType;
}

const TTL_UNITS: Record<string, number> = { s: 1, m: 60, h: 3600, d: 86400 };

/** The --ttl value: a whole number with a unit, s, m, h or d (30m, 2h, 1d); returns seconds. */
export function parseTtl(value: string): number {
  const match = /^([1-9][0-9]{0,6})([smhd])$/.exec(value);
  const unit = match?.[2] === undefined ? undefined : TTL_UNITS[match[2]];
  if (!match || unit === undefined) throw new LatchError(`--ttl ${value} is not a duration; use a number and a unit: 90s, 30m, 2h, 1d`);
  return Number(match[1]) * unit;
}

/** The --owner value: a name people recognise (user, email, tool), printable and short. */
export function parseOwner(value: string): string {
  if (!/^[\w.@+:/-]{1,128}$/.test(value)) {
    throw new LatchError(`--owner ${JSON.stringify(value.slice(0, 40))} must be 1 to 128 letters, digits or . _ @ + : / -`);
  }
  return value;
}

export async function ticketAdd(options: TicketAddOptions, io: CommandIO): Promise<void> {
  const { volume, node, type } = options;
  checkNodeName(node);
  if (OWNED_TYPES.includes(type) && options.owner === undefined) {
    throw new LatchError(`${type} tickets need an owner: add --owner WHO (and --ttl 2h if it should go away by itself)`);
  }
  const config = configOf(io);
  const { ledger, clock } = io.context(config);
  await getVolume(ledger, volume);
  const id = ticketId(type, volume, config.driverName, node);
  const expiresAt = options.ttl === undefined ? undefined : new Date(clock() + options.ttl * 1000).toISOString();
  const doc = await ledger.addTicket(volume, {
    id,
    type,
    nodeID: node,
    parameters: { readOnly: !!options.readOnly },
    requestedBy: { admin: true },
    ...(options.owner !== undefined && { owner: options.owner }),
    ...(expiresAt !== undefined && { expiresAt }),
  });
  const status = doc?.status.tickets[id];
  io.out(
    `ticket ${id} added: ${status?.satisfied ? 'satisfied' : 'unsatisfied'} (${status?.message})` +
      `${expiresAt ? `; expires at ${expiresAt}` : ''}\n`,
  );
}

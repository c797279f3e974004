// latch ticket list|add|remove: see who asked for a volume, and clear stuck requests safely.
import type { Command } from 'commander';
import { loadConfig } from '../config.js';
import { LatchError } from '../errors.js';
import { nodeHoldsDevice } from '../ledger/arbitrate.js';
import { ticketId } from '../ledger/ids.js';
import { TICKET_TYPES, type TicketType, type VolumeDoc } from '../ledger/types.js';
import { checkNodeName } from '../names.js';
import { createContext } from '../context.js';
import { parseFormat, printJson, printTable, type OutputFormat } from './output.js';
import { getVolume } from './volume.js';

export function registerTicketCommands(program: Command): void {
  const ticket = program.command('ticket').description('list, add and remove attachment tickets');

  ticket
    .command('list [volume]')
    .description('list tickets (of one volume, or of all)')
    .option('-o, --output <format>', 'table or json', parseFormat, 'table')
    .action(async (volume: string | undefined, opts: { output: OutputFormat }) => {
      const { ledger } = createContext(loadConfig());
      const docs = volume ? [await getVolume(ledger, volume)] : await ledger.list();
      const rows = docs.flatMap((d) =>
        Object.values(d.spec.tickets).map((t) => ({ volume: d.name, ...t, status: d.status.tickets[t.id] })),
      );
      if (opts.output === 'json') return printJson(rows);
      printTable(
        ['volume', 'ticket', 'type', 'node', 'mode', 'satisfied', 'requested by', 'condition'],
        rows.map((r) => [
          r.volume,
          `${r.id.slice(0, r.id.indexOf('-') + 13)}...`,
          r.type,
          r.nodeID,
          r.parameters.readOnly ? 'ro' : 'rw',
          r.status?.satisfied && r.status.generation === r.generation ? 'yes' : 'no',
          describeRequester(r.requestedBy),
          r.status?.message ?? '',
        ]),
      );
    });

  ticket
    .command('add <volume>')
    .description('add a ticket asking for the volume on a node')
    .requiredOption('--node <node>', 'the node that should have the volume')
    .option('--type <type>', `ticket type (${TICKET_TYPES.join(', ')})`, 'admin')
    .option('--read-only', 'ask for read-only access')
    .action(async (volume: string, opts: { node: string; type: string; readOnly?: boolean }) => {
      checkNodeName(opts.node);
      if (!(TICKET_TYPES as string[]).includes(opts.type)) {
        throw new LatchError(`--type ${opts.type} is not a ticket type; use one of ${TICKET_TYPES.join(', ')}`);
      }
      const config = loadConfig();
      const { ledger } = createContext(config);
      await getVolume(ledger, volume);
      const type = opts.type as TicketType;
      const id = ticketId(type, volume, config.driverName, opts.node);
      const doc = await ledger.addTicket(volume, {
        id,
        type,
        nodeID: opts.node,
        parameters: { readOnly: !!opts.readOnly },
        requestedBy: { admin: true },
      });
      const status = doc?.status.tickets[id];
      process.stdout.write(`ticket ${id} added: ${status?.satisfied ? 'satisfied' : 'unsatisfied'} (${status?.message})\n`);
    });

  ticket
    .command('remove <volume> <ticket>')
    .description('remove a ticket (by ID or a unique prefix of it); unknown tickets are fine')
    .option('--force', 'remove a workload ticket even though its node still holds the device')
    .action(async (volume: string, idOrPrefix: string, opts: { force?: boolean }) => {
      const { ledger } = createContext(loadConfig());
      const current = await getVolume(ledger, volume);
      const id = findTicket(current, idOrPrefix);
      if (!id) {
        process.stdout.write(`volume ${volume} has no ticket ${idOrPrefix}; nothing to do\n`);
        return;
      }
      const doc = await ledger.removeTicket(volume, id, (d) => {
        const t = d.spec.tickets[id];
        if (t && t.type === 'workload' && nodeHoldsDevice(d, t.nodeID) && !opts.force) {
          throw new LatchError(
            `ticket ${id} belongs to a workload on node ${t.nodeID}, which still holds the device ` +
              `(${d.status.nodes[t.nodeID]?.phase}). Removing it does not free the volume: it stays detaching until ` +
              `${t.nodeID} unmounts it (or, if the node is down, latch volume release ${volume} --node ${t.nodeID} --node-is-down), ` +
              'and kubelet may still be using it. Repeat with --force if you are sure.',
          );
        }
      });
      process.stdout.write(`ticket ${id} removed; volume ${volume} is ${doc?.status.state}\n`);
    });
}

function findTicket(doc: VolumeDoc, idOrPrefix: string): string | undefined {
  if (doc.spec.tickets[idOrPrefix]) return idOrPrefix;
  const matches = Object.keys(doc.spec.tickets).filter((id) => id.startsWith(idOrPrefix));
  if (matches.length > 1) throw new LatchError(`"${idOrPrefix}" matches ${matches.length} tickets; give more of the ID`);
  return matches[0];
}

function describeRequester(by: VolumeDoc['spec']['tickets'][string]['requestedBy']): string {
  if (by.admin) return 'admin';
  const pod = by.pod?.name ? ` pod ${by.pod.namespace ?? ''}/${by.pod.name}` : '';
  return `${by.pvName ? `pv ${by.pvName}` : ''}${pod}` || '-';
}

// doctor: what latch did by itself (reaped tickets, holds released on a node's own proof of having no device), from
// the bounded list each volume keeps in its status. Informational: recovery worked, but people should know it ran.
import type { Inventory } from '../host/inventory.js';
import { shortTicketId } from '../ledger/ids.js';
import type { AddFinding } from './findings.js';

export function reportAutomaticActions(held: Inventory, add: AddFinding): void {
  const actions = held.volumes
    .flatMap((doc) => (doc.status.automatic ?? []).map((action) => ({ volume: doc.name, ...action })))
    .sort((a, b) => (a.at < b.at ? -1 : a.at > b.at ? 1 : 0));
  for (const a of actions) {
    const what = a.kind === 'released' ? 'released' : `reaped (${a.kind})`;
    add({
      check: 'automatic',
      severity: 'ok',
      message:
        `${a.at}: volume ${a.volume}, node ${a.node}: ${what}` + `${a.ticket ? ` ticket ${shortTicketId(a.ticket)}` : ''}: ${a.message}`,
    });
  }
}

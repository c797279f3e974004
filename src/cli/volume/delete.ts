// latch volume delete: a volume and its data; refused while it has tickets or a node holds it (a failed restore's or
// clone's ticket excepted: it only guards the half-made volume).
import { LatchError } from '../../errors.js';
import type { Ticket, VolumeDoc } from '../../ledger/types.js';
import { configOf, type CommandIO } from '../io.js';
import { getVolume } from './volume-doc.js';

export async function volumeDelete(options: { name: string }, io: CommandIO): Promise<void> {
  const { name } = options;
  const { ledger, backend } = io.context(configOf(io));
  refuseIfInUse(await getVolume(ledger, name));
  // The image goes first: a half-done delete then leaves a document without data (which latch refuses to
  // reuse if it ever held a filesystem), never an old image that a new volume of the same name would adopt.
  await backend.delete(name);
  await ledger.deleteVolume(name, refuseIfInUse);
  io.out(`volume ${name} deleted\n`);
}

function refuseIfInUse(doc: VolumeDoc): void {
  // A failed restore's or clone's ticket only keeps everyone off the half-made volume: deleting it is one way out.
  const wanted = Object.values(doc.spec.tickets).filter((t) => !isHalfMade(doc, t));
  const tickets = wanted.length;
  const nodes = Object.entries(doc.status.nodes)
    .filter(([node, entry]) => entry.phase !== 'granted' || wanted.some((t) => t.nodeID === node))
    .map(([node]) => node);
  if (tickets > 0 || nodes.length > 0) {
    throw new LatchError(
      `volume ${doc.name} is in use: ${tickets} ticket(s)` +
        (nodes.length > 0 ? `, held by ${nodes.join(', ')}` : '') +
        '; detach it first (latch ticket list shows who asked for it)',
    );
  }
}

/** A restore or clone target that failed: its ticket stays so that nothing uses what it half made. */
function isHalfMade(doc: VolumeDoc, ticket: Ticket): boolean {
  const job = ticket.job;
  const failed = doc.status.tickets[ticket.id]?.job?.state === 'failed';
  return failed && (job?.kind === 'restore' || (job?.kind === 'clone' && job.role === 'target'));
}

// latch volume delete: a volume and its data; refused while it has tickets or a node holds it (a failed restore's or
// clone's ticket excepted: it only guards the half-made volume).
import { LatchError } from '../../errors.js';
import type { Ticket, VolumeDoc } from '../../ledger/types.js';
import { reachesHome } from '../../node/home.js';
import { configOf, type CommandIO } from '../io.js';
import { getVolume } from '../volume-doc.js';

export async function volumeDelete(options: { name: string }, io: CommandIO): Promise<void> {
  const { name } = options;
  const ctx = io.context(configOf(io));
  const { ledger, backend, config } = ctx;
  const doc = await getVolume(ledger, name);
  refuseIfInUse(doc);
  if (doc.spec.shared) {
    const storage = await (await import('../../node/shared.js')).deleteSharedVolume(ctx, name);
    await ledger.deleteVolume(name, refuseIfInUse);
    io.out(`shared volume ${name} deleted, with its subvolume in ${storage}\n`);
    return;
  }
  // A node-local image is deleted where it lives, or not at all: the document stays until then (node/home.ts).
  const home = doc.status.home;
  if (home && !reachesHome(ctx, home, config.nodeName)) {
    throw new LatchError(
      `volume ${name} lives on node ${home.node} (its image is in the pool ${home.pool} there), which this node does not ` +
        `reach: run \`latch volume delete ${name}\` on node ${home.node}; nothing was deleted`,
    );
  }
  const hadImage = (await backend.size(name)) !== undefined;
  // The image goes first: a half-done delete then leaves a document without data (which latch refuses to
  // reuse if it ever held a filesystem), never an old image that a new volume of the same name would adopt.
  await backend.delete(name);
  await ledger.deleteVolume(name, refuseIfInUse);
  if (hadImage) io.out(`volume ${name} deleted, with its image in ${backend.storage}\n`);
  else if (backend.localPool !== undefined && !home) {
    // A document older than homes, whose image is not here: it may be in another node's pool.
    io.out(
      `volume ${name} deleted from the ledger; no image of it in ${backend.storage}, and the ledger recorded no home for ` +
        `it: if another node's pool holds one, \`latch doctor\` there lists it as an image without a volume\n`,
    );
  } else io.out(`volume ${name} deleted; it had no image in ${backend.storage}\n`);
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

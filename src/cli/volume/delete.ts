// latch volume delete: a volume and its data; refused while it has tickets or a node holds it.
import { LatchError } from '../../errors.js';
import type { VolumeDoc } from '../../ledger/types.js';
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
  const tickets = Object.keys(doc.spec.tickets).length;
  const nodes = Object.keys(doc.status.nodes);
  if (tickets > 0 || nodes.length > 0) {
    throw new LatchError(
      `volume ${doc.name} is in use: ${tickets} ticket(s)` +
        (nodes.length > 0 ? `, held by ${nodes.join(', ')}` : '') +
        '; detach it first (latch ticket list shows who asked for it)',
    );
  }
}

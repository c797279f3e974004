// A volume's ledger document as the admin commands read and show it.
import { LatchError } from '../../errors.js';
import type { Ledger } from '../../ledger/ledger.js';
import type { VolumeDoc } from '../../ledger/types.js';
import { checkVolumeName } from '../../names.js';

/** The volume's document; a LatchError saying how to find the volumes when there is none. */
export async function getVolume(ledger: Ledger, name: string): Promise<VolumeDoc> {
  checkVolumeName(name);
  const doc = await ledger.get(name);
  if (!doc) throw new LatchError(`volume ${name} does not exist (latch volume list shows the volumes)`);
  return doc;
}

/** The nodes holding the volume, e.g. "node-a(attached) node-b(detaching,ro)". */
export function describeNodes(doc: VolumeDoc): string {
  return Object.entries(doc.status.nodes)
    .map(([n, e]) => `${n}(${e.phase}${e.readOnly ? ',ro' : ''})`)
    .join(' ');
}

// latch volume allow: which PV names and namespaces, besides the PV a volume was created for, may use it through a
// driver call (docs/operations.md, "Tenancy"). Without --pv or --namespace it shows the volume's owner and lists.
import { LatchError } from '../../errors.js';
import type { VolumeDoc } from '../../ledger/types.js';
import { checkNamespaceName, checkPvName } from '../../names.js';
import { configOf, type CommandIO } from '../io.js';
import { getVolume } from '../volume-doc.js';

export interface VolumeAllowOptions {
  name: string;
  pv?: string[];
  namespace?: string[];
  /** Take the given entries out of the lists instead. */
  remove?: boolean;
}

export async function volumeAllow(options: VolumeAllowOptions, io: CommandIO): Promise<void> {
  const pvs = (options.pv ?? []).map((p) => checkPvName(p, '--pv'));
  const namespaces = (options.namespace ?? []).map((n) => checkNamespaceName(n, '--namespace'));
  if (pvs.length === 0 && namespaces.length === 0) throw new LatchError('name what to allow: --pv NAME and/or --namespace NAMESPACE');
  const { ledger } = io.context(configOf(io));
  await getVolume(ledger, options.name); // checks the name, and says how to find the volumes when there is none
  const doc = await ledger.allowVolume(options.name, { pvs, namespaces }, options.remove === true);
  io.out(`volume ${doc.name}: ${describeAccess(doc)}\n`);
}

/** Who may use the volume, e.g. "PV pv-1 (namespace shop); also PVs pv-2; also namespaces blog". */
export function describeAccess(doc: VolumeDoc): string {
  const { pv, allowed } = doc.spec;
  const own = pv ? `PV ${pv.name}${pv.namespace ? ` (namespace ${pv.namespace})` : ''}` : `no PV of its own (PV ${doc.name} only)`;
  const pvs = allowed?.pvs?.length ? `; also PVs ${allowed.pvs.join(', ')}` : '';
  const namespaces = allowed?.namespaces?.length ? `; also namespaces ${allowed.namespaces.join(', ')}` : '';
  return `${own}${pvs}${namespaces}`;
}

// Who may use a volume through a driver call, as pure rules (docs/ledger.md, "Who may use a volume"). A call names a
// volume through a PV name (kubernetes.io/pvOrVolumeName: a PV's, or an inline volume's, which its pod's author
// chooses) and, on a mount, its pod's namespace. A volume belongs to the PV it was created for; any other PV name or
// namespace needs an admin's allow entry. The rules cannot tell a PV from an inline volume that copies its name: the
// admission policy that `latch install --print-manifests` prints keeps inline volumes out (docs/operations.md).
import type { VolumeAllowed, VolumeDoc } from './types.js';

/** Who names the volume in a driver call. */
export interface Caller {
  /** kubernetes.io/pvOrVolumeName (what detach will know the volume by). */
  pvName: string;
  /** kubernetes.io/pod.namespace, when the call carries it (only mount does). */
  namespace?: string;
  /** The PV name's alias already leads to this volume: it counts for a volume with no recorded PV only. */
  aliasLeadsHere?: boolean;
}

/** Why `caller` may not use the volume, or undefined when it may. */
export function accessRefusal(doc: VolumeDoc, caller: Caller): string | undefined {
  const { pv, allowed } = doc.spec;
  if (caller.namespace !== undefined && listOf(allowed?.namespaces).includes(caller.namespace)) return undefined;
  // A volume with no recorded PV (made by an admin command, or before latch recorded one) belongs to the PV named like
  // it and to the PVs whose alias already leads to it: those aliases were written by calls latch accepted then.
  const ownPv = pv ? caller.pvName === pv.name : caller.pvName === doc.name || caller.aliasLeadsHere === true;
  if (!ownPv && !listOf(allowed?.pvs).includes(caller.pvName)) {
    const owner = pv ? `was created for PV ${pv.name}` : `has no PV of its own (only a PV named ${doc.name} may use it)`;
    return (
      `volume ${doc.name} ${owner}; PV or inline volume ${caller.pvName} may not use it unless an admin allows it ` +
      `(latch volume allow ${doc.name} --pv ${caller.pvName})`
    );
  }
  if (pv?.namespace !== undefined && caller.namespace !== undefined && caller.namespace !== pv.namespace) {
    return (
      `volume ${doc.name} was created for a pod in namespace ${pv.namespace}; a pod in namespace ${caller.namespace} may not use it ` +
      `unless an admin allows it (latch volume allow ${doc.name} --namespace ${caller.namespace})`
    );
  }
  return undefined;
}

/** A list of names as stored; anything else (a document another writer got wrong) allows nothing. */
function listOf(value: unknown): string[] {
  return Array.isArray(value) ? value.filter((v): v is string => typeof v === 'string') : [];
}

/** The volume with `entries` added to (or, with `remove`, taken from) its allow lists; sorted, empty lists dropped. */
export function changeAllowed(doc: VolumeDoc, entries: VolumeAllowed, remove: boolean): VolumeDoc {
  const merge = (now: string[] | undefined, given: string[] | undefined): string[] => {
    const set = new Set(listOf(now));
    for (const entry of given ?? []) {
      if (remove) set.delete(entry);
      else set.add(entry);
    }
    return [...set].sort();
  };
  const pvs = merge(doc.spec.allowed?.pvs, entries.pvs);
  const namespaces = merge(doc.spec.allowed?.namespaces, entries.namespaces);
  const allowed: VolumeAllowed = { ...(pvs.length > 0 && { pvs }), ...(namespaces.length > 0 && { namespaces }) };
  const { allowed: _old, ...spec } = doc.spec;
  return { ...doc, spec: { ...spec, ...(Object.keys(allowed).length > 0 && { allowed }) } };
}

/** How many volumes, and how many bytes, were created for pods of `namespace` (what its quota counts). */
export function namespaceUsage(docs: VolumeDoc[], namespace: string): { volumes: number; bytes: number } {
  const mine = docs.filter((d) => d.spec.pv?.namespace === namespace);
  return { volumes: mine.length, bytes: mine.reduce((sum, d) => sum + d.spec.sizeBytes, 0) };
}

// The workload ticket a pod's volume asks for: one per node in attach mode (attach), one per pod in non-attach mode
// (mount). Both name the volume the same way and record the PV name, because detach and unmount know nothing else.
// Here too what a call may do with the volume it names (docs/operations.md, "Tenancy"): use it only if the volume
// allows its PV name and namespace, create it only if lazyCreate is on and its namespace's quota has room.
import type { Config } from '../config.js';
import type { VolumeOptions } from '../contract/options.js';
import type { Context } from '../context.js';
import { LatchError } from '../errors.js';
import { accessRefusal, namespaceUsage, type Caller } from '../ledger/access.js';
import type { TicketRequest } from '../ledger/arbitrate.js';
import { workloadTicketId } from '../ledger/ids.js';
import type { NewVolumeSpec } from '../ledger/ledger.js';
import type { VolumeDoc } from '../ledger/types.js';
import { formatSize } from '../size.js';

export interface WorkloadRequest {
  /** The volume's stable name. */
  name: string;
  ticket: TicketRequest;
  /** What the volume is created as when this is its first ticket; absent: this call may not create it. */
  create?: NewVolumeSpec;
  /** Who names the volume: the ledger adds the ticket only if the volume allows it. */
  caller: Caller;
  /** The volume's document as read for this request (undefined: it does not exist yet), for the caller's own checks. */
  existing: VolumeDoc | undefined;
}

/** Which pod a non-attach mount is for: its key in the ticket ID, and its UID when the pod dir's path shows one. */
export interface PodOfMount {
  key: string;
  uid?: string;
}

/** The name a workload ticket is keyed by: the one detach and unmount will know, the PV's (or the inline volume's). */
function ticketPvName(options: VolumeOptions): string {
  return options.pvOrVolumeName ?? options.name;
}

/** The ID of `node`'s workload ticket for the volume the options name (attach mode: waitforattach, isattached). */
export function nodeWorkloadTicketId(config: Pick<Config, 'driverName'>, options: VolumeOptions, node: string): string {
  return workloadTicketId(ticketPvName(options), config.driverName, node);
}

/**
 * Resolves the volume, refuses a caller the volume does not allow (or a creation this call may not make), records a
 * `volume` option's alias for its PV name (never redirecting one), and builds the ticket of `node` (for a pod: that
 * pod's ticket on the node). Logs the volume and the ticket.
 */
export async function workloadRequest(ctx: Context, options: VolumeOptions, node: string, forPod?: PodOfMount): Promise<WorkloadRequest> {
  const { ledger, config } = ctx;
  const pvName = ticketPvName(options);
  const name = await ledger.resolve(options);
  // Only mount carries the pod's namespace from kubelet; on any other call a namespace in the options is the user's own.
  const caller = await callerOf(ctx, options, name, forPod !== undefined);
  const sizeBytes = options.size ?? config.defaultSize;
  const existing = await ledger.get(name);
  if (existing) refuseUnlessAllowed(existing, caller);
  else await checkMayCreate(ctx, name, sizeBytes, caller.namespace);
  if (options.volume !== undefined) await ledger.linkPv(pvName, options.volume);
  const id = workloadTicketId(pvName, config.driverName, node, forPod?.key);
  ctx.log.volume = name;
  ctx.log.ticket = id;
  const pod = options.pod ?? (forPod?.uid !== undefined ? { uid: forPod.uid } : undefined);
  const owner = { name: pvName, ...(caller.namespace !== undefined && { namespace: caller.namespace }) };
  return {
    name,
    ticket: {
      id,
      type: 'workload',
      nodeID: node,
      parameters: { readOnly: options.readOnly },
      requestedBy: { pvName, ...(pod && { pod }), ...(options.fsGroup !== undefined && { fsGroup: options.fsGroup }) },
    },
    // Without lazyCreate no call creates a volume, also not one deleted since the check above.
    ...(config.lazyCreate && {
      create: { sizeBytes, fsType: options.fsType ?? config.defaultFsType, pv: owner, ...(options.shared === true && { shared: true }) },
    }),
    caller,
    existing,
  };
}

/**
 * For the node's calls that use a volume an earlier call named (waitforattach, mountdevice, expandfs): refuses
 * (LatchError) a caller the volume does not allow, unless its PV name has a workload ticket on this node (added by an
 * attach or mount that was allowed, a namespace's allow entry included: these calls carry no namespace). kubelet
 * makes them only after that attach or mount; this keeps a forged call out too.
 */
export async function checkCaller(ctx: Context, options: VolumeOptions, name: string, doc: VolumeDoc): Promise<void> {
  const caller = await callerOf(ctx, options, name, false);
  const node = ctx.config.nodeName;
  const ticketHere = Object.values(doc.spec.tickets).some(
    (t) => t.type === 'workload' && t.nodeID === node && t.requestedBy.pvName === caller.pvName,
  );
  if (!ticketHere) refuseUnlessAllowed(doc, caller);
}

/**
 * Who the options say names volume `name`: the PV name, the pod's namespace when `withNamespace` (a mount), and whether
 * an alias leads here.
 */
async function callerOf(ctx: Context, options: VolumeOptions, name: string, withNamespace: boolean): Promise<Caller> {
  const pvName = ticketPvName(options);
  const namespace = withNamespace ? options.pod?.namespace : undefined;
  const aliasLeadsHere = pvName !== name && (await ctx.ledger.aliasOf(pvName)) === name;
  return { pvName, ...(namespace !== undefined && { namespace }), aliasLeadsHere };
}

function refuseUnlessAllowed(doc: VolumeDoc, caller: Caller): void {
  const refusal = accessRefusal(doc, caller);
  if (refusal !== undefined) throw new LatchError(refusal);
}

/** Refuses (LatchError) to create volume `name` when lazyCreate is off, or when it would pass its namespace's quota. */
async function checkMayCreate(ctx: Context, name: string, sizeBytes: number, namespace: string | undefined): Promise<void> {
  const { config, ledger } = ctx;
  if (!config.lazyCreate) {
    throw new LatchError(
      `volume ${name} does not exist, and volumes are not created on first use here (lazyCreate: false); ` +
        `an admin creates it (latch volume create ${name} --size SIZE)`,
    );
  }
  const quota = config.namespaceQuota;
  if (namespace === undefined || quota === undefined || (quota.volumes === undefined && quota.bytes === undefined)) return;
  // Counted before the write: creations racing in one namespace may pass the quota by as many as race (docs/operations.md).
  // A damaged document is not counted (its namespace cannot be read); doctor names it.
  const used = namespaceUsage((await ledger.list()).docs, namespace);
  if (quota.volumes !== undefined && used.volumes + 1 > quota.volumes) {
    throw new LatchError(
      `volume ${name} is not created: namespace ${namespace} has ${used.volumes} volume(s) created for its pods, ` +
        `and its quota (namespaceQuota.volumes) is ${quota.volumes}`,
    );
  }
  if (quota.bytes !== undefined && used.bytes + sizeBytes > quota.bytes) {
    throw new LatchError(
      `volume ${name} (${formatSize(sizeBytes)}) is not created: namespace ${namespace} has ${formatSize(used.bytes)} ` +
        `in volumes created for its pods, and its quota (namespaceQuota.bytes) is ${formatSize(quota.bytes)}`,
    );
  }
}

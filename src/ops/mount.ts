// mount <podVolumeDir> <json>. In attach mode kubelet bind-mounts the device mount itself: Not supported.
// In non-attach mode (attach: false) this one call does on the node what attach, waitforattach and mountdevice do
// in attach mode, through the same ledger and steps: the pod's workload ticket (refused, naming the holder, while
// another node holds a read-write-once volume), the loop device, the filesystem (made only when blank), a
// node-private staging mount under stateDir that every pod on this node shares, and a bind mount into the pod dir,
// read-only when asked.
import { LatchError, NotSupportedError, errorMessage } from '../errors.js';
import { addTicket, isInUse, isSatisfied, newVolume, removeTicket, ticketsOfNode } from '../ledger/arbitrate.js';
import type { Ticket } from '../ledger/types.js';
import { failure, success } from '../protocol/reply.js';
import { bindMount, findmnt, mountsAt, umount } from '../sys/mounts.js';
import {
  claimGrant,
  ensureDirectory,
  leaveNode,
  mountVolumeAt,
  podKeyOf,
  podTicketId,
  setUpDevice,
  stagingPath,
  withVolumeLock,
} from './node-steps.js';
import { openBackend, openLedger } from './services.js';
import type { OpCall } from './types.js';

export async function run(call: OpCall) {
  const { config } = call;
  if (config.attach) throw new NotSupportedError('in attach mode kubelet bind-mounts the device mount itself');
  const options = call.options!;
  const node = config.nodeName;
  const podDir = call.args.podVolumeDir!;
  const ledger = await openLedger(config);
  const backend = await openBackend(config);

  // unmount will only know the pod dir, whose name is this PV name: it is what the ticket ID hashes.
  const pvName = options.pvOrVolumeName ?? options.name;
  const name = await ledger.resolve(options);
  if (options.volume !== undefined) await ledger.linkPv(pvName, options.volume);
  const podKey = podKeyOf(podDir);
  const id = podTicketId(pvName, config.driverName, node, podKey);
  call.facts.volume = name;
  call.facts.node = node;
  call.facts.ticket = id;

  const pod = options.pod ?? (podKey !== podDir ? { uid: podKey } : undefined);
  const request: Omit<Ticket, 'generation' | 'createdAt'> = {
    id,
    type: 'workload',
    nodeID: node,
    parameters: { readOnly: options.readOnly },
    requestedBy: { pvName, ...(pod && { pod }), ...(options.fsGroup !== undefined && { fsGroup: options.fsGroup }) },
  };

  return withVolumeLock(config, name, async () => {
    await ensureDirectory(podDir);
    const atPod = await mountsAt(podDir);
    if (atPod.length > 0) {
      // A repeated call: done if this volume is what the pod dir shows (its ticket is refreshed, not duplicated).
      const top = atPod[atPod.length - 1]!;
      const owner = await backend.volumeOfDevice(top.source);
      if (owner !== name) {
        return failure(
          `${podDir} already has ${top.source} mounted${owner ? ` (volume ${owner})` : ''}; not mounting volume ${name} over it`,
        );
      }
      const doc = await ledger.update(name, (d) => (d ? addTicket(d, request, ledger.now()) : d));
      if (doc && isSatisfied(doc, id)) return success();
      return failure(
        `${podDir} shows volume ${name}, but its ticket on node ${node} is not satisfied: ${doc?.status.tickets[id]?.message ?? 'no ticket'}`,
      );
    }

    // The staging mount an earlier pod made here says what the volume holds: refuse another fsType up front.
    const staged = (await mountsAt(stagingPath(config, name))).at(-1)?.fsType;
    if (options.fsType && staged && staged !== options.fsType) {
      return failure(`volume ${name} holds a ${staged} filesystem, but ${options.fsType} was asked for; latch never reformats a volume`);
    }

    // Arbitrate in the compare-and-swap, and write only a granted ticket: a refused mount leaves the ledger as it
    // was (kubelet retries it, and a pod deleted meanwhile never gets an unmount, so a waiting ticket left behind
    // would later grant the volume to a node that no longer wants it). A stale ticket of this pod goes.
    const now = ledger.now();
    let refused: string | undefined;
    let doc = await ledger.update(name, (current) => {
      const next = addTicket(
        current ?? newVolume(name, options.size ?? config.defaultSize, options.fsType ?? config.defaultFsType, now),
        request,
        now,
      );
      refused = isSatisfied(next, id) ? undefined : (next.status.tickets[id]?.message ?? 'not granted');
      if (refused === undefined) return next;
      return current?.spec.tickets[id] ? removeTicket(current, id, now) : current;
    });
    if (refused !== undefined || !doc) return failure(`volume ${name} cannot be mounted on node ${node}: ${refused ?? 'not granted'}`);

    try {
      doc = await claimGrant(ledger, name, node);
      if (!doc || !isInUse(doc.status.nodes[node]?.phase)) {
        throw new LatchError(`volume ${name} was withdrawn from node ${node} while it was being mounted; try again`);
      }
      const { device, doc: attached } = await setUpDevice(config, name, doc, call.facts);
      const nodeReadOnly = attached.status.nodes[node]!.readOnly;
      const staging = stagingPath(config, name);
      call.facts.staging = staging;
      // The staging mount serves every pod here: read-only only when the node holds the volume read-only.
      await mountVolumeAt(
        config,
        attached,
        device,
        staging,
        {
          fsType: options.fsType,
          mountOptions: options.mountOptions,
          readOnly: nodeReadOnly,
          mayFormat: !nodeReadOnly && !options.readOnly,
        },
        0o700,
      );
      await bindMount(staging, podDir, options.readOnly);
      const check = await findmnt(podDir);
      if (check?.source !== device) {
        await umount(podDir);
        throw new LatchError(`after the bind mount, findmnt shows ${check?.source ?? 'nothing'} at ${podDir} instead of ${device}; undone`);
      }
      return success();
    } catch (err) {
      // Leave nothing behind for a pod that did not get its mount: kubelet sends no unmount for it.
      try {
        const after = await ledger.update(name, (d) => (d?.spec.tickets[id] ? removeTicket(d, id, ledger.now()) : d));
        if (!after || ticketsOfNode(after, node).length === 0) await leaveNode(config, name);
      } catch (undoErr) {
        call.facts.undoError = errorMessage(undoErr);
      }
      throw err;
    }
  });
}

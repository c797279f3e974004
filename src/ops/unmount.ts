// unmount <podVolumeDir>. In attach mode kubelet removes its own bind mount: Not supported.
// In non-attach mode: find the volume from the kernel (the bind mount's source device and its backing file), or,
// when nothing is mounted any more, from the pod dir's name (kubelet names it after the PV); remove the bind
// mount and the pod's ticket; when no ticket of this node is left, unmount the staging path, release the device
// and confirm it in the ledger. Nothing is kept in memory or in a file, so this works after a reboot, a kubelet
// restart or a lost staging mount. Success when nothing of the volume is mounted at the pod dir.
import { basename } from 'node:path';
import { NotSupportedError } from '../errors.js';
import { removeTicket, ticketsOfNode } from '../ledger/arbitrate.js';
import type { VolumeDoc } from '../ledger/types.js';
import { checkPvName } from '../names.js';
import { failure, success } from '../protocol/reply.js';
import { mountsAt, umount } from '../sys/mounts.js';
import { leaveNode, podKeyOf, podTicketId, withVolumeLock } from './node-steps.js';
import { openBackend, openLedger } from './services.js';
import type { OpCall } from './types.js';

export async function run(call: OpCall) {
  const { config } = call;
  if (config.attach) throw new NotSupportedError('in attach mode kubelet removes its own bind mount');
  const podDir = call.args.podVolumeDir!;
  const node = config.nodeName;
  const backend = await openBackend(config);

  const mounted = await mountsAt(podDir);
  let name: string | undefined;
  if (mounted.length > 0) {
    const source = mounted[mounted.length - 1]!.source;
    name = await backend.volumeOfDevice(source);
    if (!name) return failure(`${podDir} has ${source} mounted, which is not a latch volume; not touching it`);
  } else {
    const pvName = basename(podDir);
    try {
      checkPvName(pvName);
    } catch {
      return success(); // not a name latch could have mounted
    }
    name = await (await openLedger(config)).volumeOfPv(pvName);
  }
  const volume = name;
  call.facts.volume = volume;
  call.facts.node = node;

  return withVolumeLock(config, volume, async () => {
    // Every mount of this volume stacked at the pod dir goes; anything else found on top stays and is reported.
    for (let i = 0; i < 16; i++) {
      const top = (await mountsAt(podDir)).at(-1);
      if (!top) break;
      if ((await backend.volumeOfDevice(top.source)) !== volume) {
        return failure(`${podDir} still has ${top.source} mounted, which is not volume ${volume}; not touching it`);
      }
      await umount(podDir);
    }

    const ledger = await openLedger(config);
    const podKey = podKeyOf(podDir);
    const doc = await ledger.update(volume, (d) => {
      const id = d && findPodTicket(d, basename(podDir), config.driverName, node, podKey);
      return d && id ? removeTicket(d, id, ledger.now()) : d;
    });
    const others = doc ? ticketsOfNode(doc, node).length : 0;
    if (others > 0) {
      return success({ message: `${podDir} unmounted; volume ${volume} stays set up on node ${node} for ${others} other ticket(s)` });
    }
    const busy = await leaveNode(config, volume);
    if (busy) {
      return success({
        message: `${podDir} unmounted; ${busy} is still mounted elsewhere on this host, so node ${node} keeps its hold until a later unmount finds it free`,
      });
    }
    return success();
  });
}

/** The ticket mount made for this pod: by its deterministic ID, else by this node's ticket recording the pod's UID. */
function findPodTicket(doc: VolumeDoc, pvName: string, driverName: string, node: string, podKey: string): string | undefined {
  const id = podTicketId(pvName, driverName, node, podKey);
  if (doc.spec.tickets[id]) return id;
  return Object.values(doc.spec.tickets).find((t) => t.type === 'workload' && t.nodeID === node && t.requestedBy.pod?.uid === podKey)?.id;
}

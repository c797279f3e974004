// unmount <podVolumeDir>: Not supported in attach mode; in non-attach mode the reverse of mount, found from the
// kernel or the pod dir's name alone (docs/protocol.md, "What each op does").
import { basename } from 'node:path';
import { path } from '../contract/args.js';
import { failure, success } from '../contract/reply.js';
import { NotSupportedError } from '../errors.js';
import { ticketsOfNode } from '../ledger/arbitrate.js';
import { workloadTicketId } from '../ledger/ids.js';
import type { VolumeDoc } from '../ledger/types.js';
import { withVolumeLock } from '../node/lock.js';
import { unmountSharedForPod } from '../node/shared.js';
import { leaveNode, podKeyOf } from '../node/staging.js';
import { volumeAtPath } from '../node/volume-at-path.js';
import { defineOp } from './op.js';

/** Mounts stacked at one pod dir that unmount takes down before it gives up. */
const MAX_STACKED = 16;

export const op = defineOp({
  args: { podVolumeDir: path },
  releasesMarkedHolds: true,
  async run(ctx, { podVolumeDir: podDir }) {
    const { config, system, backend, ledger } = ctx;
    if (config.attach) throw new NotSupportedError('in attach mode kubelet removes its own bind mount');
    const node = config.nodeName;
    const podTicket = (d: VolumeDoc) => podTicketOf(d, basename(podDir), config.driverName, node, podKeyOf(podDir));
    const shared = await unmountSharedForPod(ctx, podDir, podTicket);
    if (shared) return shared;
    const found = await volumeAtPath(ctx, podDir);
    if (found.kind === 'none') return success(); // not a name latch could have mounted
    if (found.kind === 'foreign') return failure(`${podDir} has ${found.top.source} mounted, which is not a latch volume; not touching it`);
    const volume = found.volume;
    ctx.log.volume = volume;
    ctx.log.node = node;

    return withVolumeLock(config, volume, async () => {
      // Every mount of this volume stacked at the pod dir goes; anything else found on top stays and is reported.
      for (let i = 0; i < MAX_STACKED; i++) {
        const top = (await system.mountsAt(podDir)).at(-1);
        if (!top) break;
        if ((await backend.volumeOfDevice(top.source)) !== volume) {
          return failure(`${podDir} still has ${top.source} mounted, which is not volume ${volume}; not touching it`);
        }
        await system.umount(podDir);
      }

      const podKey = podKeyOf(podDir);
      const doc = await ledger.removeTicket(volume, (d) => podTicketOf(d, basename(podDir), config.driverName, node, podKey));
      const others = doc ? ticketsOfNode(doc, node).length : 0;
      if (others > 0) {
        return success({ message: `${podDir} unmounted; volume ${volume} stays set up on node ${node} for ${others} other ticket(s)` });
      }
      const busy = await leaveNode(ctx, volume);
      if (busy) {
        return success({
          message: `${podDir} unmounted; ${busy} is still mounted elsewhere on this host, so node ${node} keeps its hold until a later unmount finds it free`,
        });
      }
      return success();
    });
  },
});

/** The ticket mount made for this pod: by its deterministic ID, else by this node's ticket recording the pod's UID. */
function podTicketOf(doc: VolumeDoc, pvName: string, driverName: string, node: string, podKey: string): string | undefined {
  const id = workloadTicketId(pvName, driverName, node, podKey);
  if (doc.spec.tickets[id]) return id;
  return Object.values(doc.spec.tickets).find((t) => t.type === 'workload' && t.nodeID === node && t.requestedBy.pod?.uid === podKey)?.id;
}

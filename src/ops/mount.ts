// mount <podVolumeDir> <json>: Not supported in attach mode; in non-attach mode the whole of attach, waitforattach
// and mountdevice on the node, plus a bind mount into the pod dir (docs/protocol.md, "Non-attach mode").
import { path, volumeOptions } from '../contract/args.js';
import { failure, success } from '../contract/reply.js';
import { LatchError, NotSupportedError, errorMessage } from '../errors.js';
import { isFencedOff, ticketsOfNode } from '../ledger/arbitrate.js';
import { claimAndSetUpDevice } from '../node/device.js';
import { clearOwnFence } from '../node/fence.js';
import { awayFromHome } from '../node/home.js';
import { contextForSecrets } from '../node/secrets.js';
import { withVolumeLock } from '../node/lock.js';
import { bindVolumeAt, ensureDirectory, mountVolumeAt } from '../node/mount.js';
import { mountSharedForPod } from '../node/shared.js';
import { leaveNode, podKeyOf, stagingPath } from '../node/staging.js';
import { workloadRequest } from '../node/tickets.js';
import { defineOp } from './op.js';

export const op = defineOp({
  args: { podVolumeDir: path, json: volumeOptions },
  releasesMarkedHolds: true,
  async run(callCtx, { podVolumeDir: podDir, json }) {
    // A PV's secretRef names the cephx identity to map the volume with (rbd); otherwise the node's own.
    const ctx = await contextForSecrets(callCtx, json.secrets);
    const { config, ledger, backend, system } = ctx;
    if (config.attach) throw new NotSupportedError('in attach mode kubelet bind-mounts the device mount itself');
    const node = config.nodeName;
    ctx.log.node = node;
    const podKey = podKeyOf(podDir);
    const request = await workloadRequest(ctx, json, node, { key: podKey, ...(podKey !== podDir && { uid: podKey }) });
    if (json.shared || request.existing?.spec.shared) return mountSharedForPod(ctx, request, podDir, json);
    const { name, ticket, create, caller, existing } = request;
    const id = ticket.id;

    return withVolumeLock(config, name, async () => {
      await ensureDirectory(podDir);
      const atPod = (await system.mountsAt(podDir)).at(-1);
      if (atPod) {
        // A repeated call: done if this volume is what the pod dir shows (its ticket is refreshed, not duplicated).
        const owner = await backend.volumeOfDevice(atPod.source);
        if (owner !== name) {
          return failure(
            `${podDir} already has ${atPod.source} mounted${owner ? ` (volume ${owner})` : ''}; not mounting volume ${name} over it`,
          );
        }
        // Refreshed only if still granted: a refused repeat must not leave a waiting ticket that would later grant the
        // volume back to this node, where the pod's mount is stale.
        const repeat = await ledger.addTicketIfGranted(name, ticket, undefined, caller);
        if (repeat.refused === undefined) return success();
        return failure(`${podDir} shows volume ${name}, but its ticket on node ${node} is not granted: ${repeat.refused}`);
      }

      // The staging mount an earlier pod made here says what the volume holds: refuse another fsType up front.
      const staging = stagingPath(config, name);
      const staged = (await system.mountsAt(staging)).at(-1)?.fsType;
      if (json.fsType && staged && staged !== json.fsType) {
        return failure(`volume ${name} holds a ${staged} filesystem, but ${json.fsType} was asked for; latch never reformats a volume`);
      }

      // A volume whose image lives in another node's pool is refused before anything is written (node/home.ts).
      if (backend.localPool !== undefined) {
        const away = awayFromHome(ctx, existing, node);
        if (away !== undefined) return failure(away);
      }

      // Arbitrate in the compare-and-swap, and write only a granted ticket: a refused mount leaves the ledger as it
      // was (kubelet retries it, and a pod deleted meanwhile never gets an unmount, so a waiting ticket left behind
      // would later grant the volume to a node that no longer wants it).
      let granted = await ledger.addTicketIfGranted(name, ticket, create, caller);
      if (granted.refused !== undefined && granted.doc && isFencedOff(granted.doc, node)) {
        // Fenced off the volume earlier: clear the old mapping, then ask again.
        await clearOwnFence(ctx, name, granted.doc);
        granted = await ledger.addTicketIfGranted(name, ticket, create, caller);
      }
      if (granted.refused !== undefined || !granted.doc) {
        return failure(`volume ${name} cannot be mounted on node ${node}: ${granted.refused ?? 'not granted'}`);
      }

      try {
        const setUp = await claimAndSetUpDevice(ctx, name);
        if (!setUp) throw new LatchError(`volume ${name} was withdrawn from node ${node} while it was being mounted; try again`);
        const { device, doc } = setUp;
        const nodeReadOnly = doc.status.nodes[node]?.readOnly ?? true;
        ctx.log.staging = staging;
        // The staging mount serves every pod here: read-only only when the node holds the volume read-only.
        await mountVolumeAt(
          ctx,
          doc,
          device,
          staging,
          { fsType: json.fsType, mountOptions: json.mountOptions, readOnly: nodeReadOnly, mayFormat: !nodeReadOnly && !json.readOnly },
          0o700,
        );
        await bindVolumeAt(ctx, staging, podDir, device, json.readOnly);
        return success();
      } catch (err) {
        // Leave nothing behind for a pod that did not get its mount: kubelet sends no unmount for it.
        try {
          const after = await ledger.removeTicket(name, id);
          if (!after || ticketsOfNode(after, node).length === 0) await leaveNode(ctx, name);
        } catch (undoErr) {
          ctx.log.undoError = errorMessage(undoErr);
        }
        throw err;
      }
    });
  },
});

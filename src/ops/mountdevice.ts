// mountdevice <deviceMountPath> <devicePath> <json> (node): put a filesystem on the volume only if it has none,
// mount it at kubelet's global path, and check in the kernel's mount table that the right device is mounted there.
import { realpath } from 'node:fs/promises';
import { path, volumeOptions } from '../contract/args.js';
import { failure, success } from '../contract/reply.js';
import { isInUse } from '../ledger/arbitrate.js';
import { withVolumeLock } from '../node/lock.js';
import { mountVolumeAt } from '../node/mount.js';
import { mountSharedDevice } from '../node/shared.js';
import { checkCaller } from '../node/tickets.js';
import { defineOp } from './op.js';

export const op = defineOp({
  args: { deviceMountPath: path, devicePath: path, json: volumeOptions },
  releasesMarkedHolds: true,
  attachModeOnly: true,
  async run(ctx, { deviceMountPath, devicePath, json }) {
    const { ledger, backend } = ctx;
    const node = ctx.config.nodeName;
    const name = await ledger.resolve(json);
    ctx.log.volume = name;

    const doc = await ledger.get(name);
    const entry = doc?.status.nodes[node];
    if (!doc || !entry || !isInUse(entry.phase)) {
      return failure(
        `volume ${name} is not attached to node ${node} (${doc ? doc.status.state : 'unknown volume'}); waitforattach comes first`,
      );
    }
    await checkCaller(ctx, json, name, doc);
    if (doc.spec.shared) return mountSharedDevice(ctx, doc, deviceMountPath, devicePath, json);
    const device = await backend.findDevice(name);
    if (!device) return failure(`volume ${name} has no device on node ${node}; waitforattach sets it up`);
    const given = await realpath(devicePath).catch(() => devicePath);
    if (given !== device) {
      const owner = await backend.volumeOfDevice(given);
      return failure(
        `device ${devicePath} is not the device of volume ${name} (${device})` +
          (owner ? `: it belongs to volume ${owner}` : ': it is not a latch volume'),
      );
    }
    ctx.log.device = device;

    const readOnly = json.readOnly || entry.readOnly;
    // Under the node's volume lock, as every call that mounts or formats the volume here: the filesystem's one probe
    // stays true until mkfs (node/filesystem.ts).
    await withVolumeLock(ctx.config, name, () =>
      mountVolumeAt(ctx, doc, device, deviceMountPath, {
        fsType: json.fsType,
        mountOptions: json.mountOptions,
        readOnly,
        mayFormat: !readOnly,
      }),
    );
    return success();
  },
});

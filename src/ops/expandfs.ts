// expandfs <json> <devicePath> <podVolumeDir> <newBytes> <oldBytes> (node): grow storage, device and the mounted
// filesystem online; idempotent, and refused with nothing changed when it cannot finish (docs/operations.md, "Resizing").
import { byteCount, optionalPath, path, volumeOptions } from '../contract/args.js';
import { failure, success } from '../contract/reply.js';
import { isInUse } from '../ledger/arbitrate.js';
import { checkCanGrowOnline } from '../node/capabilities.js';
import { withVolumeLock } from '../node/lock.js';
import { checkGrowRequest, filesystemMountOf, growFilesystem } from '../node/resize.js';
import { checkCaller } from '../node/tickets.js';
import { formatSize } from '../size.js';
import { defineOp } from './op.js';

export const op = defineOp({
  args: { json: volumeOptions, devicePath: optionalPath, podVolumeDir: path, newBytes: byteCount, oldBytes: byteCount },
  releasesMarkedHolds: true,
  async run(ctx, { json, podVolumeDir, newBytes }) {
    const { config, ledger, backend } = ctx;
    const node = config.nodeName;
    const name = await ledger.resolve(json);
    Object.assign(ctx.log, { volume: name, node, newBytes });

    return withVolumeLock(config, name, async () => {
      const doc = await ledger.get(name);
      if (!doc) return failure(`volume ${name} does not exist; there is nothing to expand`);
      await checkCaller(ctx, json, name, doc);
      const current = await checkGrowRequest(ctx, name, newBytes);
      if (current === undefined) return failure(`volume ${name} has no image in ${backend.storage}; there is nothing to expand`);

      const entry = doc.status.nodes[node];
      if (!entry || !isInUse(entry.phase)) {
        return failure(
          `volume ${name} is not attached to node ${node} (${doc.status.state}); expandfs grows a volume on the node that has it mounted`,
        );
      }
      if (entry.readOnly) return failure(`volume ${name} is attached read-only on node ${node}; a read-only filesystem cannot grow`);
      const device = await backend.findDevice(name);
      if (!device) return failure(`volume ${name} has no device on node ${node}; nothing is mounted to grow`);
      ctx.log.device = device;
      const where = await filesystemMountOf(ctx, device, podVolumeDir);
      if (!where || where.options.includes('ro')) {
        return failure(
          `the filesystem of volume ${name} is not mounted read-write on node ${node}; latch grows filesystems online only (nothing was changed)`,
        );
      }
      ctx.log.mountPoint = where.mountPoint;
      await checkCanGrowOnline(ctx, name, where.fsType);

      await backend.grow(name, newBytes); // refuses beyond the pool's free space before changing anything
      await ledger.recordSize(name, newBytes);
      await growFilesystem(ctx, name, device, where);
      return success({
        message: `volume ${name} is ${formatSize(newBytes)}; its ${where.fsType} filesystem fills it (grown online at ${where.mountPoint})`,
      });
    });
  },
});

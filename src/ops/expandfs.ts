// expandfs <json> <devicePath> <podVolumeDir> <newBytes> <oldBytes> (node; kubelet calls it after a PVC was expanded,
// because init says requiresFSResize: true). Grows the volume's image, refreshes its loop device's capacity
// (losetup -c) and grows the mounted filesystem online: resize2fs for ext*, xfs_growfs for xfs, btrfs filesystem
// resize for btrfs. Idempotent: the same size again is Success (and finishes a grow a previous call left half done).
// Refuses, with nothing changed, to shrink, to pass maxSize or the pool's free space, and to grow an ext4 filesystem
// the kernel would refuse to grow (no CAP_SYS_RESOURCE). The devicePath argument is informational only ("" in
// non-attach mode): latch finds the device from the kernel.
import { formatSize } from '../size.js';
import { isInUse } from '../ledger/arbitrate.js';
import { failure, success } from '../protocol/reply.js';
import { checkCanGrowOnline, checkGrowRequest, filesystemMountOf, growFilesystem, recordSize, withVolumeLock } from './node-steps.js';
import { openBackend, openLedger } from './services.js';
import type { OpCall } from './types.js';

export async function run(call: OpCall) {
  const { config } = call;
  const node = config.nodeName;
  const newBytes = Number(call.args.newBytes);
  const ledger = await openLedger(config);
  const name = await ledger.resolve(call.options!);
  call.facts.volume = name;
  call.facts.node = node;
  call.facts.newBytes = newBytes;

  return withVolumeLock(config, name, async () => {
    const doc = await ledger.get(name);
    if (!doc) return failure(`volume ${name} does not exist; there is nothing to expand`);
    const current = await checkGrowRequest(config, name, newBytes);
    if (current === undefined) return failure(`volume ${name} has no image in the pool (${config.poolDir}); there is nothing to expand`);

    const entry = doc.status.nodes[node];
    if (!entry || !isInUse(entry.phase)) {
      return failure(
        `volume ${name} is not attached to node ${node} (${doc.status.state}); expandfs grows a volume on the node that has it mounted`,
      );
    }
    if (entry.readOnly) return failure(`volume ${name} is attached read-only on node ${node}; a read-only filesystem cannot grow`);
    const backend = await openBackend(config);
    const device = await backend.findDevice(name);
    if (!device) return failure(`volume ${name} has no device on node ${node}; nothing is mounted to grow`);
    call.facts.device = device;
    const where = await filesystemMountOf(device, call.args.podVolumeDir);
    if (!where || where.options.includes('ro')) {
      return failure(
        `the filesystem of volume ${name} is not mounted read-write on node ${node}; latch grows filesystems online only (nothing was changed)`,
      );
    }
    call.facts.mountPoint = where.mountPoint;
    await checkCanGrowOnline(name, where.fsType);

    await backend.grow(name, newBytes); // refuses beyond the pool's free space before changing anything
    await recordSize(config, name, newBytes);
    await growFilesystem(name, device, where);
    return success({
      message: `volume ${name} is ${formatSize(newBytes)}; its ${where.fsType} filesystem fills it (grown online at ${where.mountPoint})`,
    });
  });
}

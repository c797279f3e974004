// unmountdevice <deviceMountPath> (node): find what is mounted there from the kernel, unmount it, release the
// loop device and confirm the release in the ledger. Works with no options and after a crash at any point.
import { basename } from 'node:path';
import { checkPvName, checkVolumeName } from '../names.js';
import { failure, success } from '../protocol/reply.js';
import { mountsAt, umount } from '../sys/mounts.js';
import { releaseIfUnmounted } from './node-steps.js';
import { openBackend, openLedger } from './services.js';
import type { OpCall } from './types.js';

export async function run(call: OpCall) {
  const { config } = call;
  const path = call.args.deviceMountPath!;
  const backend = await openBackend(config);

  const mounted = await mountsAt(path);
  let name: string | undefined;
  if (mounted.length > 0) {
    const source = mounted[mounted.length - 1]!.source;
    name = await backend.volumeOfDevice(source);
    if (!name) return failure(`${path} has ${source} mounted, which is not a latch volume; not touching it`);
    await umount(path);
  } else {
    // Nothing mounted: a previous call may have died after unmounting. kubelet names the global path after the
    // PV, so finish that volume's release if its device is still set up here.
    try {
      name = checkVolumeName(await (await openLedger(config)).volumeOfPv(checkPvName(basename(path))));
    } catch {
      return success(); // not a name latch could have used: nothing of ours to finish
    }
    if ((await backend.findDevice(name)) === undefined) {
      const doc = await (await openLedger(config)).get(name);
      if (!doc?.status.nodes[config.nodeName] || doc.status.nodes[config.nodeName]?.phase === 'granted') return success();
    }
  }
  call.facts.volume = name;

  const busy = await releaseIfUnmounted(config, name);
  if (busy) {
    // Still mounted elsewhere (a pod bind mount kubelet has not removed yet): keep the device and the hold.
    return success({ message: `${path} unmounted; ${busy} is still mounted elsewhere, so it stays attached` });
  }
  return success();
}

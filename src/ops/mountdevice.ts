// mountdevice <deviceMountPath> <devicePath> <json> (node): put a filesystem on the volume only if it has none,
// mount it at kubelet's global path, and check with findmnt that the right device is mounted there.
import { realpath } from 'node:fs/promises';
import { isInUse } from '../ledger/arbitrate.js';
import { failure, success } from '../protocol/reply.js';
import { mountVolumeAt } from './node-steps.js';
import { openBackend, openLedger } from './services.js';
import type { OpCall } from './types.js';

export async function run(call: OpCall) {
  const { config } = call;
  const options = call.options!;
  const node = config.nodeName;
  const path = call.args.deviceMountPath!;
  const ledger = await openLedger(config);
  const backend = await openBackend(config);
  const name = await ledger.resolve(options);
  call.facts.volume = name;

  const doc = await ledger.get(name);
  const entry = doc?.status.nodes[node];
  if (!doc || !entry || !isInUse(entry.phase)) {
    return failure(
      `volume ${name} is not attached to node ${node} (${doc ? doc.status.state : 'unknown volume'}); waitforattach comes first`,
    );
  }
  const device = await backend.findDevice(name);
  if (!device) return failure(`volume ${name} has no device on node ${node}; waitforattach sets it up`);
  const given = await realpath(call.args.devicePath!).catch(() => call.args.devicePath!);
  if (given !== device) {
    const owner = await backend.volumeOfDevice(given);
    return failure(
      `device ${call.args.devicePath} is not the device of volume ${name} (${device})` +
        (owner ? `: it belongs to volume ${owner}` : ': it is not a latch volume'),
    );
  }
  call.facts.device = device;

  const readOnly = options.readOnly || entry.readOnly;
  await mountVolumeAt(config, doc, device, path, {
    fsType: options.fsType,
    mountOptions: options.mountOptions,
    readOnly,
    mayFormat: !readOnly,
  });
  return success();
}

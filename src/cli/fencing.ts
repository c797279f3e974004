// What `latch node fence` and `latch volume release` share: the configuration's fencer, and fencing a node off one
// volume, said for people.
import type { Fencer } from '../backend/types.js';
import { configuredFencer } from '../backend/index.js';
import type { Config } from '../config.js';
import type { Context } from '../context.js';
import { LatchError } from '../errors.js';
import { fenceNodeOffVolume, type FenceOptions } from '../node/fence.js';

/** Fences `node` off `volume` and says what the storage now refuses (volume release --node-is-down uses it too). */
export async function fenceVolume(
  ctx: Context,
  fencer: Fencer,
  volume: string,
  node: string,
  reason: string,
  options: FenceOptions = {},
): Promise<string> {
  const { doc, clients, by } = await fenceNodeOffVolume(ctx, fencer, volume, node, reason, options);
  const refused =
    clients.length > 0
      ? `${by} refuses its client(s) ${clients.join(', ')}`
      : `no client of it had the image open or locked, and none was recorded: ${by} had nothing to refuse` +
        (options.poweredOff ? " (the node is powered off, on the admin's word)" : '');
  return `volume ${volume}: node ${node} fenced off (${refused}); its hold and tickets released; state now ${doc?.status.state}`;
}

/** The fencer of the configuration; a LatchError saying why there is none. */
export async function requireFencer(config: Config): Promise<Fencer> {
  if (config.backend.type === 'loop') {
    throw new LatchError(
      'the loop backend keeps each volume on one node: there is no shared storage to fence. ' +
        'If the node is down, latch volume release VOLUME --node NODE --node-is-down releases its hold',
    );
  }
  const fencer = await configuredFencer(config);
  if (!fencer) {
    throw new LatchError(
      `the configuration ${config.source} has no fencer identity (backend.fencer: { clientId, keyring }): ` +
        'fencing needs the Ceph identity that may blocklist client instances, which nodes never hold (docs/operations.md, "Fencing")',
    );
  }
  return fencer;
}

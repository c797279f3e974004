// Fencing for the rbd backend: Ceph's OSD blocklist, one entry per client instance (IP:PORT/NONCE), never a whole
// host or range (on a shared host, or for a node's other volumes, that would cut off clients that did nothing).
// Measured facts behind it: docs/design/rbd-backend.md, a, d and e.
//
// It fails closed: an address it cannot read, or a watcher or lock listing that fails, fails the fence (a client it
// cannot name is one it cannot cut off); and a fence completes only once the OSD map lists every target.
import { checkVolumeName } from '../names.js';
import { LatchError } from '../errors.js';
import {
  cephBlocklist,
  cephBlocklistAdd,
  cephBlocklistRemove,
  isClientInstance,
  rbdLockers,
  rbdWatchers,
  type CephIdentity,
} from '../sys/rbd.js';
import type { Fencer } from './types.js';

// Blocklist entries expire; a fence must outlast any outage, so it is set for ten years and lifted explicitly.
const FENCE_SECONDS = 10 * 365 * 24 * 3600;

export interface RbdFencerOptions {
  pool: string;
  /** The fencer identity: blocklist caps restricted to single instances (docs/operations.md, "Fencing"). */
  identity: CephIdentity;
}

export class RbdFencer implements Fencer {
  readonly kind = "the Ceph cluster's OSD blocklist";

  constructor(private readonly options: RbdFencerOptions) {}

  async find(volume: string, known: string[], spare: string[]): Promise<string[]> {
    const image = checkVolumeName(volume);
    const { identity, pool } = this.options;
    // Before the volume moves, nothing but its other legitimate holders may have it open or hold its lock: every
    // watcher (a client with the image open) and every lock holder (the last writer, also a dead one) is the node's.
    // A listing that fails throws: "nobody found" must mean the cluster said so.
    const [watchers, lockers] = await Promise.all([rbdWatchers(identity, pool, image), rbdLockers(identity, pool, image)]);
    const others = new Set(spare);
    const targets = [...new Set([...known, ...[...watchers, ...lockers].filter((c) => !others.has(c))])].sort();
    const unreadable = targets.filter((c) => !isClientInstance(c));
    if (unreadable.length > 0) {
      throw new LatchError(
        `volume ${volume}: cannot fence client address(es) ${unreadable.map((c) => JSON.stringify(c)).join(', ')} of ${pool}/${image}: ` +
          'not a single Ceph client instance (IP:PORT/NONCE); a client that cannot be named cannot be cut off, so the hold stays',
      );
    }
    return targets;
  }

  async fence(volume: string, known: string[], spare: string[]): Promise<string[]> {
    const targets = await this.find(volume, known, spare);
    const { identity } = this.options;
    for (const client of targets) await cephBlocklistAdd(identity, client, FENCE_SECONDS);
    if (targets.length > 0) {
      // The fence is what lets the volume move: confirm it in the OSD map rather than trust the command's exit code.
      const listed = new Set(await cephBlocklist(identity));
      const missing = targets.filter((c) => !listed.has(c));
      if (missing.length > 0) throw new LatchError(`the Ceph blocklist does not show ${missing.join(', ')} after adding it`);
    }
    return targets;
  }

  async lift(clients: string[]): Promise<void> {
    for (const client of clients.filter(isClientInstance)) await cephBlocklistRemove(this.options.identity, client);
  }
}

// Fencing a node off a shared volume (docs/ledger.md, "Fences"): its CephFS client instances are blocklisted in the
// OSD map (their writes to the data pool fail at once) and their MDS sessions evicted (they can change no metadata, and
// the MDS revokes their caps), and both are confirmed before the node's hold goes. Which instances: the node's recorded
// ones, and every MDS session on the volume's directory that is not another holder's (cephfs-sessions.ts): the other
// nodes that hold the shared volume legitimately have sessions on the same subvolume, and are told apart by the cephx
// entity (or instance) each recorded.
//
// Measured here: a blocklisted ceph-fuse does not hang (unlike rbd-fuse): its writes fail at once ("Cannot send after
// transport endpoint shutdown"), and the MDS drops its session within about a second.
import { setTimeout as sleep } from 'node:timers/promises';
import type { Config } from '../config.js';
import { LatchError } from '../errors.js';
import { checkVolumeName } from '../names.js';
import { mdsEvict, mdsSessions } from '../sys/cephfs.js';
import { cephBlocklist, cephBlocklistAdd, cephBlocklistRemove, isClientInstance, type CephIdentity } from '../sys/rbd.js';
import { selectFenceTargets } from './cephfs-sessions.js';
import type { Fencer } from './types.js';

// As for rbd: a fence must outlast any outage; it is lifted explicitly.
const FENCE_SECONDS = 10 * 365 * 24 * 3600;
const SESSION_GONE_MS = 15_000;

class CephFsFencer implements Fencer {
  readonly kind = "the Ceph cluster's OSD blocklist and the MDS's session eviction";

  constructor(
    private readonly identity: CephIdentity,
    private readonly fsName: string,
    private readonly group: string,
  ) {}

  /** The node's clients (cephfs-sessions.ts), from the MDS's session lists; throws when an MDS cannot say. */
  async find(volume: string, known: string[], spare: string[]): Promise<string[]> {
    checkVolumeName(volume);
    return selectFenceTargets(volume, this.group, await mdsSessions(this.identity, this.fsName), known, spare);
  }

  async fence(volume: string, known: string[], spare: string[]): Promise<string[]> {
    const targets = await this.find(volume, known, spare);
    if (targets.length === 0) return targets;
    for (const client of targets) await cephBlocklistAdd(this.identity, client, FENCE_SECONDS);
    const listed = new Set(await cephBlocklist(this.identity));
    const missing = targets.filter((c) => !listed.has(c));
    if (missing.length > 0) throw new LatchError(`the Ceph blocklist does not show ${missing.join(', ')} after adding it`);
    // The MDS notices a blocklisted client by itself; evicting says so at once, and the listing confirms it.
    const deadline = Date.now() + SESSION_GONE_MS;
    for (;;) {
      const left = (await mdsSessions(this.identity, this.fsName)).filter((s) => targets.includes(s.address));
      if (left.length === 0) return targets;
      if (Date.now() >= deadline) {
        throw new LatchError(
          `volume ${volume}: the MDS still lists the session(s) of ${left.map((s) => s.address).join(', ')} after eviction`,
        );
      }
      for (const session of left) await mdsEvict(this.identity, session).catch(() => undefined);
      await sleep(250);
    }
  }

  async lift(clients: string[]): Promise<void> {
    for (const client of clients.filter(isClientInstance)) await cephBlocklistRemove(this.identity, client);
  }
}

/** The fencer of shared volumes: the configuration's fencer identity on its CephFS; undefined without either. */
export function cephFsFencerFor(config: Pick<Config, 'backend' | 'commandTimeout'>): CephFsFencer | undefined {
  const rbd = config.backend;
  if (rbd.type !== 'rbd' || rbd.fencer === undefined || rbd.cephfs === undefined) return undefined;
  // Its ceph calls get the configured deadline, as the rbd fencer's do (configuredFencer), not run()'s 120 s default.
  const identity = { cephConf: rbd.cephConf, ...rbd.fencer, commandTimeoutMs: config.commandTimeout * 1000 };
  return new CephFsFencer(identity, rbd.cephfs.fsName, rbd.cephfs.group);
}

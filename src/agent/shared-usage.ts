// The quota and use of each shared (CephFS) volume this node holds, for the latch_shared_volume_* gauges (metrics.ts):
// read from the cluster (`ceph fs subvolume info` as the node's identity, each call bounded by commandTimeout), never
// by statfs of the node's mount, which a ceph-fuse that no longer answers would hang. The agent reads them once per
// round (tasks.ts), one call per held volume, a few at a time; `latch metrics` once. A volume whose figures cannot be
// read has none that round, and is counted and logged. The figures are the cluster's, so every node that holds a
// volume exports the same ones: the rules take the max by volume.
import type { Context } from '../context.js';
import { errorMessage } from '../errors.js';
import type { VolumeDoc } from '../ledger/types.js';
import { CommandError } from '../sys/run.js';

/** A shared volume's figures, as `ceph fs subvolume info` gives them. */
export interface SharedUsage {
  usedBytes: number;
  /** undefined: the subvolume has no quota. */
  quotaBytes: number | undefined;
}

/** Reads one volume's figures (SharedVolumes.usage); undefined when it has no subvolume. */
export type UsageReader = (volume: string) => Promise<SharedUsage | undefined>;

/** What one round read: the figures of the volumes it could read, and how many it could not. */
export interface UsageRound {
  figures: Map<string, SharedUsage>;
  failed: number;
}

type Log = (entry: Record<string, unknown>) => void;

/** Reads at a time: a round of many volumes is not one ceph process after another, nor all of them at once. */
const CONCURRENT_READS = 4;

/** The shared volumes the ledger says this node holds, in any phase (granted, attaching, attached, detaching). */
export function heldSharedVolumes(docs: readonly VolumeDoc[], node: string): string[] {
  return docs
    .filter((doc) => doc.spec.shared === true && doc.status.nodes[node] !== undefined)
    .map((doc) => doc.name)
    .sort();
}

/**
 * Reads the figures of `volumes`, CONCURRENT_READS at a time. A read that fails leaves that volume without figures
 * (logged, counted). Once one ends because the cluster did not answer in time (its deadline, or ceph's own connect
 * timeout), the volumes not yet started are skipped for the round: a manager that does not answer would cost each
 * of them the whole deadline, and the agent's other work waits for the round.
 */
export async function readSharedUsage(volumes: readonly string[], read: UsageReader, log: Log): Promise<UsageRound> {
  const figures = new Map<string, SharedUsage>();
  let failed = 0;
  const queue = [...volumes];
  const skipped: string[] = [];
  let unanswered = false;
  const worker = async () => {
    for (let volume = queue.shift(); volume !== undefined; volume = queue.shift()) {
      if (unanswered) {
        skipped.push(volume);
        continue;
      }
      try {
        const usage = await read(volume);
        if (usage) figures.set(volume, usage);
        else {
          failed++;
          log({ volume, error: 'shared volume has no subvolume: no quota or use figures' });
        }
      } catch (err) {
        failed++;
        log({ volume, error: `quota and use not read: ${errorMessage(err)}` });
        if (clusterDidNotAnswer(err)) unanswered = true;
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(CONCURRENT_READS, queue.length) }, worker));
  if (skipped.length > 0) {
    failed += skipped.length;
    log({ error: `quota and use of ${skipped.sort().join(', ')} not read this round: the cluster did not answer in time` });
  }
  return { figures, failed };
}

/**
 * The child's deadline passed, or ceph gave up reaching the monitors within its --connect-timeout: it then exits 1
 * with "timed out" (measured, ceph 16) or, elsewhere, ETIMEDOUT (110), as doctor/rbd/cluster.ts reads it.
 */
function clusterDidNotAnswer(err: unknown): boolean {
  return err instanceof CommandError && (err.timedOut || err.exitCode === 110 || /timed out/i.test(err.stderrTail));
}

/**
 * One round: the figures of the shared volumes this node holds (for LatchMetrics.setSharedVolumeUsage, which drops
 * the gauges of volumes no longer held). None where the configuration has no backend.cephfs, nor when the ledger
 * cannot be read (logged; latch_ledger_up says so).
 */
export async function gatherSharedVolumeUsage(ctx: Pick<Context, 'config' | 'ledger'>, log: Log): Promise<UsageRound> {
  const { sharedVolumesFor } = await import('../backend/cephfs.js');
  const shared = sharedVolumesFor(ctx.config);
  if (!shared) return { figures: new Map(), failed: 0 };
  let docs: VolumeDoc[];
  try {
    ({ docs } = await ctx.ledger.list());
  } catch (err) {
    log({ error: `ledger: ${errorMessage(err)}; no shared volume figures this round` });
    return { figures: new Map(), failed: 0 };
  }
  return readSharedUsage(heldSharedVolumes(docs, ctx.config.nodeName), (volume) => shared.usage(volume), log);
}

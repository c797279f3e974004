// Where a volume's bytes live (docs/ledger.md, "Home"). A loop image is in one node's pool: no other node reaches it.
// The ledger records that node, and every other node refuses the volume (attach, waitforattach, mount, jobs) instead
// of making a new, empty image in its own pool; `latch volume delete` deletes the image only where it lives.
import type { Backend } from '../backend/types.js';
import type { Config } from '../config.js';
import type { Context } from '../context.js';
import { LatchError } from '../errors.js';
import type { VolumeDoc, VolumeHome } from '../ledger/types.js';

/** What deciding where the volume lives needs of a context. */
interface HomeView {
  config: Pick<Config, 'oneHost' | 'nodeName'>;
  backend: Pick<Backend, 'localPool'>;
}

/**
 * The view of a caller that does not load the backend (attach on the control plane, doctor): the loop backend's pool
 * is the configured poolDir, and every other backend is shared storage.
 */
export function homeViewOf(config: HomeView['config'] & Pick<Config, 'backend' | 'poolDir'>): HomeView {
  return { config, backend: { localPool: config.backend.type === 'loop' ? config.poolDir : undefined } };
}

/**
 * Whether `node` reaches the image at `home`: it is the home node, or it is this node, whose pool (simulated nodes of
 * one host, `oneHost`) is the home's directory; another node's pool is not known here. Always, where the storage is
 * shared (no localPool).
 */
export function reachesHome(view: HomeView, home: VolumeHome | undefined, node: string): boolean {
  const pool = view.backend.localPool;
  if (pool === undefined || home === undefined || home.node === node) return true;
  return view.config.oneHost === true && node === view.config.nodeName && home.pool === pool;
}

/** Why `node` cannot have the volume (its image lives in another node's pool), or undefined. */
export function awayFromHome(view: HomeView, doc: VolumeDoc | undefined, node: string): string | undefined {
  const home = doc?.status.home;
  if (!doc || !home || reachesHome(view, home, node)) return undefined;
  return (
    `volume ${doc.name} lives on node ${home.node} (its image is in the pool ${home.pool} there), not on node ${node}: ` +
    `its pods must run on node ${home.node}; give its PV a nodeAffinity that pins them there ` +
    `(required nodeSelectorTerms: kubernetes.io/hostname In [${home.node}])`
  );
}

/** Throws awayFromHome's refusal, before anything is changed. */
export function refuseAwayFromHome(view: HomeView, doc: VolumeDoc | undefined, node: string): void {
  const why = awayFromHome(view, doc, node);
  if (why !== undefined) throw new LatchError(why);
}

/**
 * Before this node makes or uses the volume's image: records this node as its home when none is recorded (the node
 * that first makes the image, or first finds it: a document older than homes, a volume made by `latch volume create`
 * before), and refuses when the home is another node's. Nothing to do for shared storage.
 */
export async function claimHome(ctx: Context, doc: VolumeDoc): Promise<void> {
  const node = ctx.config.nodeName;
  const pool = ctx.backend.localPool;
  if (pool === undefined) return;
  const recorded = doc.status.home ? doc : await ctx.ledger.recordHome(doc.name, node, pool);
  refuseAwayFromHome(ctx, recorded, node);
}

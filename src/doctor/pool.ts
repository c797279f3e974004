// doctor: the pool's free space against what its volumes may still grow into (images are sparse), and its images
// against the ledger's volumes that live here (docs/ledger.md, "Home").
import { lstat, readdir, statfs } from 'node:fs/promises';
import { join } from 'node:path';
import { imageFileName, volumeOfImageFile } from '../backend/loop.js';
import type { Config } from '../config.js';
import { errorMessage } from '../errors.js';
import type { Inventory } from '../host/inventory.js';
import { reachesHome } from '../node/home.js';
import { formatApproxSize } from '../size.js';
import type { AddFinding } from './findings.js';

export async function checkPool(config: Config, held: Inventory, add: AddFinding): Promise<void> {
  const { pool, volumes } = held;
  if (pool === undefined) {
    add({ check: 'pool', severity: 'ok', message: `pool ${config.poolDir} does not exist yet; it is created with the first volume` });
    return;
  }
  const provisioned = volumes.reduce((sum, d) => sum + d.spec.sizeBytes, 0);
  let allocated = 0;
  for (const doc of volumes) {
    try {
      const info = await lstat(join(pool, imageFileName(doc.name)));
      if (info.isFile()) allocated += Math.min(info.blocks * 512, doc.spec.sizeBytes);
    } catch {
      // no image on this node
    }
  }
  let available: number;
  try {
    const fs = await statfs(pool);
    available = Number(fs.bavail) * Number(fs.bsize);
  } catch (err) {
    add({
      check: 'pool',
      severity: 'error',
      message: `cannot read the free space of ${pool}: ${errorMessage(err)}`,
      note: `the pool must be a readable directory (ls -ld ${pool})`,
    });
    return;
  }
  const approx = formatApproxSize;
  const stillNeeded = Math.max(0, provisioned - allocated);
  const summary = `${approx(provisioned)} provisioned, ${approx(allocated)} of it allocated, ${approx(available)} free in ${pool}`;
  if (stillNeeded > available) {
    add({
      check: 'pool',
      severity: 'warning',
      message: `pool overcommitted: ${summary}; filling the volumes needs ${approx(stillNeeded)} more, and writes fail (ENOSPC) once the pool is full`,
      note: `free space on the filesystem of ${pool} (df -h ${pool}), grow it, or move poolDir to a larger one`,
    });
  } else {
    add({ check: 'pool', severity: 'ok', message: summary });
  }
}

/**
 * Images in the pool that no volume document names (a volume deleted from a node that does not reach this pool, a
 * document lost), and volumes whose recorded home is this pool but whose image is not in it.
 */
export async function checkImages(config: Config, held: Inventory, add: AddFinding): Promise<number> {
  const { pool, volumes } = held;
  if (pool === undefined) return 0;
  let images: string[];
  try {
    const entries = await readdir(pool, { withFileTypes: true });
    images = entries.filter((e) => e.isFile() && !e.name.startsWith('.')).flatMap((e) => volumeOfImageFile(e.name) ?? []);
  } catch {
    return 0; // checkPool reports an unreadable pool
  }
  const known = new Set(volumes.map((d) => d.name));
  let problems = 0;
  for (const volume of images.filter((v) => !known.has(v)).sort()) {
    problems++;
    add({
      check: 'images',
      severity: 'warning',
      message: `image ${join(pool, `${volume}.img`)} has no volume in the ledger: its data is kept, but no call will ever use it`,
      note: `a volume deleted from a node that does not reach this pool, or a lost document; once nobody needs its data: rm ${join(pool, `${volume}.img`)}`,
    });
  }
  const present = new Set(images);
  const view = { config, backend: { localPool: config.poolDir } };
  for (const doc of volumes) {
    const home = doc.status.home;
    if (!home || !reachesHome(view, home, config.nodeName) || present.has(doc.name)) continue;
    problems++;
    add({
      check: 'images',
      severity: 'error',
      message:
        `volume ${doc.name} lives on this node (home ${home.node}, pool ${home.pool}), but its image is missing from ${pool}` +
        (doc.status.filesystem ? `: it held a ${doc.status.filesystem} filesystem, and latch refuses to make an empty one` : ''),
      note: `restore it from a backup (latch volume restore), or delete the volume once nobody needs it (latch volume delete ${doc.name})`,
    });
  }
  return problems;
}

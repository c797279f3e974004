// doctor: the pool's free space against what its volumes may still grow into (images are sparse).
import { lstat, statfs } from 'node:fs/promises';
import { join } from 'node:path';
import { imageFileName } from '../../backend/loop.js';
import type { Config } from '../../config.js';
import { errorMessage } from '../../errors.js';
import type { Inventory } from '../../host/inventory.js';
import { formatApproxSize } from '../../size.js';
import type { AddFinding } from './report.js';

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

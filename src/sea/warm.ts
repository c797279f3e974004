// Build step of bin/latch-sea (build.mjs): `node warm.cjs BUNDLE DIR [CACHE]` loads the driver bundle as the single
// executable will and runs its warm-up in the scratch directory DIR (src/sea/driver.ts); with CACHE, it then writes
// the V8 code cache of everything compiled by then. It must run on the node binary that the single executable is a
// copy of: V8 takes a cache only from its own version and flags.
import { readFileSync, writeFileSync } from 'node:fs';
import { DRIVER_ASSET, loadBundle, type DriverBundle } from './load.js';

const [bundlePath, dir, cachePath] = process.argv.slice(2);
if (!bundlePath || !dir) throw new Error('usage: node warm.cjs BUNDLE DIR [CACHE]');
const { exports: driver, script } = loadBundle<DriverBundle>(DRIVER_ASSET, readFileSync(bundlePath, 'utf8'));
void driver.warmUp(dir).then(() => {
  if (cachePath) writeFileSync(cachePath, script.createCachedData());
});

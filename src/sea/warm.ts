// Build step of bin/latch-sea (build.mjs): `node warm.cjs BUNDLE DIR [CACHE]` loads the driver bundle as the single
// executable will and runs its warm-up in the scratch directory DIR (src/sea/driver.ts); with CACHE, it writes the V8
// code cache of everything compiled by the time the warm-up ends the process. It must run on the node binary that the
// single executable is a copy of: V8 takes a cache only from its own version and flags.
import { readFileSync, writeFileSync } from 'node:fs';
import { DRIVER_ASSET, loadBundle, type DriverBundle } from './load.js';

const [bundlePath, dir, cachePath] = process.argv.slice(2);
if (!bundlePath || !dir) throw new Error('usage: node warm.cjs BUNDLE DIR [CACHE]');
const { exports: driver, script } = loadBundle<DriverBundle>(DRIVER_ASSET, readFileSync(bundlePath, 'utf8'));
// The warm-up ends the process with its last call (src/sea/driver.ts): the cache is taken on the way out, and the
// build fails on the exit code of a call that failed.
if (cachePath) process.on('exit', () => writeFileSync(cachePath, script.createCachedData()));
void driver.warmUp(dir);

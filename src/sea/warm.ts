// Build step of bin/latch-sea (build.mjs): `node warm.cjs BUNDLE CACHE` loads the driver bundle as the single
// executable will, runs its warm-up and writes the V8 code cache of everything compiled by then. It must run on the
// node binary that the single executable is a copy of: V8 takes a cache only from its own version and flags.
import { readFileSync, writeFileSync } from 'node:fs';
import { DRIVER_ASSET, loadBundle, type DriverBundle } from './load.js';

const [bundlePath, cachePath] = process.argv.slice(2);
if (!bundlePath || !cachePath) throw new Error('usage: node warm.cjs BUNDLE CACHE');
const { exports: driver, script } = loadBundle<DriverBundle>(DRIVER_ASSET, readFileSync(bundlePath, 'utf8'));
void driver.warmUp().then(() => writeFileSync(cachePath, script.createCachedData()));

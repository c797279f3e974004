// Build step of bin/latch-sea (build.mjs): `node warm.cjs NAME BUNDLE DIR [CACHE]` loads a driver bundle as the single
// executable will (under its asset name NAME, src/sea/load.ts) and runs its warm-up in the scratch directory DIR
// (src/sea/bundle.ts); with CACHE, it writes the V8 code cache of everything compiled by the time the warm-up ends the
// process. It must run on the node binary that the single executable is a copy of: V8 takes a cache only from its own
// version and flags.
import { readFileSync, writeFileSync } from 'node:fs';
import * as configSchema from '../config-schema.js';
import type { DriverBundle } from './bundle.js';
import { loadBundle } from './load.js';

const [name, bundlePath, dir, cachePath] = process.argv.slice(2);
if (!name || !bundlePath || !dir) throw new Error('usage: node warm.cjs NAME BUNDLE DIR [CACHE]');
// The schema from this script's own bundle: the first run validates the scratch configuration.
const { exports: driver, script } = loadBundle<DriverBundle>(name, readFileSync(bundlePath, 'utf8'), { schema: () => configSchema });
// The warm-up ends the process with its last call (src/sea/bundle.ts): the cache is taken on the way out, and the
// build fails on the exit code of a call that failed.
if (cachePath) process.on('exit', () => writeFileSync(cachePath, script.createCachedData()));
void driver.warmUp(dir);

// Entry point of bin/latch-sea, the single executable: its main script, a loader kept this small so that Node compiles
// almost nothing before a call runs (src/sea/load.ts).
import { writeSync } from 'node:fs';
import { getAsset, getRawAsset } from 'node:sea';
import type { Script } from 'node:vm';
import { isAdminCall } from '../cli/command-names.js';
import { ADMIN_ASSET, DRIVER_ASSET, DRIVER_CODE_CACHE_ASSET, loadBundle, type DriverBundle } from './load.js';

const first = process.argv[2];
if (first === undefined || isAdminCall(first)) {
  // src/bin.ts: runs latch's main at load.
  loadBundle(ADMIN_ASSET, getAsset(ADMIN_ASSET, 'utf8'));
} else {
  let loaded: { exports: DriverBundle; script: Script };
  try {
    // The cache as the executable holds it, not a copy: V8 only reads it.
    const codeCache = getRawAsset(DRIVER_CODE_CACHE_ASSET);
    if (!(codeCache instanceof ArrayBuffer)) throw new Error(`${DRIVER_CODE_CACHE_ASSET} is not binary`);
    loaded = loadBundle<DriverBundle>(DRIVER_ASSET, getAsset(DRIVER_ASSET, 'utf8'), Buffer.from(codeCache));
  } catch (err) {
    // Still one JSON reply, on stdout only: kubelet reads nothing else (a damaged or half-copied executable).
    const message = `the latch executable cannot load its code (${String(err).slice(0, 200)}): reinstall it`;
    writeSync(1, JSON.stringify({ status: 'Failure', message }));
    process.exit(1);
  }
  // A driver call's log line says when V8 refused the code cache (a build that ran another node).
  void loaded.exports.runDriverCall(first, process.argv.slice(3), { codeCacheRejected: loaded.script.cachedDataRejected === true });
}

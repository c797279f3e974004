// Entry point of bin/latch-sea, the single executable: its main script, a loader kept this small so that Node compiles
// almost nothing before a call runs (src/sea/load.ts).
import { writeSync } from 'node:fs';
import { getAsset, getRawAsset } from 'node:sea';
import type { Script } from 'node:vm';
import { isAdminCall } from '../cli/command-names.js';
import { isControlPlaneOp } from '../protocol/control-plane-ops.js';
import type { DriverBundle } from './bundle.js';
import {
  ADMIN_ASSET,
  CONFIG_SCHEMA_ASSET,
  CONTROL_ASSET,
  CONTROL_CODE_CACHE_ASSET,
  DRIVER_ASSET,
  DRIVER_CODE_CACHE_ASSET,
  loadBundle,
} from './load.js';

const first = process.argv[2];
if (first === undefined || isAdminCall(first)) {
  // src/bin.ts: runs latch's main at load.
  loadBundle(ADMIN_ASSET, getAsset(ADMIN_ASSET, 'utf8'));
} else {
  const [asset, cacheAsset] = isControlPlaneOp(first) ? [CONTROL_ASSET, CONTROL_CODE_CACHE_ASSET] : [DRIVER_ASSET, DRIVER_CODE_CACHE_ASSET];
  let loaded: { exports: DriverBundle; script: Script };
  try {
    // The cache as the executable holds it, not a copy: V8 only reads it.
    const codeCache = getRawAsset(cacheAsset);
    if (!(codeCache instanceof ArrayBuffer)) throw new Error(`${cacheAsset} is not binary`);
    loaded = loadBundle<DriverBundle>(asset, getAsset(asset, 'utf8'), {
      cachedData: Buffer.from(codeCache),
      // No code cache: compiled once per configuration change (or new build), by the call that validates it.
      schema: () => loadBundle(CONFIG_SCHEMA_ASSET, getAsset(CONFIG_SCHEMA_ASSET, 'utf8')).exports,
    });
  } catch (err) {
    // Still one JSON reply, on stdout only: kubelet reads nothing else (a damaged or half-copied executable).
    const message = `the latch executable cannot load its code (${String(err).slice(0, 200)}): reinstall it`;
    writeSync(1, JSON.stringify({ status: 'Failure', message }));
    process.exit(1);
  }
  // A driver call's log line says when V8 refused the code cache (a build that ran another node).
  void loaded.exports.runDriverCall(first, process.argv.slice(3), { codeCacheRejected: loaded.script.cachedDataRejected === true });
}

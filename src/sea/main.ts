// Entry point of bin/latch-sea, the single executable: its main script, a loader kept this small so that Node compiles
// almost nothing before a call runs (src/sea/load.ts).
import { isAdminCall } from '../cli/command-names.js';
import { getAsset } from 'node:sea';
import { ADMIN_ASSET, DRIVER_ASSET, DRIVER_CODE_CACHE_ASSET, loadBundle, type DriverBundle } from './load.js';

const first = process.argv[2];
if (first === undefined || isAdminCall(first)) {
  // src/bin.ts: runs latch's main at load.
  loadBundle(ADMIN_ASSET, getAsset(ADMIN_ASSET, 'utf8'));
} else {
  const { exports: driver, script } = loadBundle<DriverBundle>(
    DRIVER_ASSET,
    getAsset(DRIVER_ASSET, 'utf8'),
    Buffer.from(getAsset(DRIVER_CODE_CACHE_ASSET)),
  );
  // A driver call's log line says when V8 refused the code cache (a build that ran another node).
  void driver.runDriverCall(first, process.argv.slice(3), { codeCacheRejected: script.cachedDataRejected === true });
}

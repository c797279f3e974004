// How bin/latch-sea runs latch's code: as assets of the single executable, compiled by its main script (src/sea/main.ts)
// as CommonJS module bodies, whose require is the single executable's own (Node's built-in modules, all a bundle
// needs). Two bundles: the driver calls' (src/sea/driver.ts), with a V8 code cache taken at build time after the
// control plane's calls ran (src/sea/warm.ts), so a call starts with the bytecode of what it runs instead of parsing
// and compiling it; and the whole of latch for admin commands (src/bin.ts), which no kubelet waits for.
import { Script } from 'node:vm';
import type { StartupFacts } from '../protocol/driver.js';

/** Asset names, as build.mjs embeds them. */
export const DRIVER_ASSET = 'driver.js';
export const DRIVER_CODE_CACHE_ASSET = 'driver.codecache';
export const ADMIN_ASSET = 'latch.js';

/** What src/sea/driver.ts exports. */
export interface DriverBundle {
  runDriverCall(op: string, argv: string[], startup: StartupFacts): Promise<void>;
  warmUp(dir: string): Promise<never>;
}

/**
 * Compiles and evaluates a bundle, whose text build.mjs wrapped as a CommonJS module body
 * (`(function (exports, require, module) {...})`), so that V8 compiles the asset as it is, with no copy made to wrap
 * it; returns its exports. The file name must be the same at build time and at run time: V8 takes a code cache only
 * for the source it was made from.
 */
export function loadBundle<T>(name: string, source: string, cachedData?: Buffer): { exports: T; script: Script } {
  const script = new Script(source, { filename: name, ...(cachedData && { cachedData }) });
  const module = { exports: {} as T };
  (script.runInThisContext() as (e: object, r: NodeJS.Require, m: object) => void)(module.exports as object, require, module);
  return { exports: module.exports, script };
}

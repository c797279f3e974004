// How bin/latch-sea runs latch's code: as assets of the single executable, compiled by its main script (src/sea/main.ts)
// as CommonJS module bodies, whose require is the single executable's own (Node's built-in modules, all a bundle
// needs). The bundles:
// - the control plane's calls (src/sea/control.ts) and every driver call (src/sea/driver.ts), each with a V8 code
//   cache taken at build time after the control plane's calls ran (src/sea/warm.ts), so that a call starts with the
//   bytecode of what it runs instead of parsing and compiling it;
// - the configuration schema (src/config-schema.ts, with zod), which the driver bundles leave out: only a call that
//   finds no validated copy of the configuration needs it (src/config.ts, loadDriverConfig);
// - the whole of latch for admin commands (src/bin.ts), which no kubelet waits for.
import { Script } from 'node:vm';

/** Asset names, as build.mjs embeds them. */
export const CONTROL_ASSET = 'control.js';
export const CONTROL_CODE_CACHE_ASSET = 'control.codecache';
export const DRIVER_ASSET = 'driver.js';
export const DRIVER_CODE_CACHE_ASSET = 'driver.codecache';
export const CONFIG_SCHEMA_ASSET = 'config-schema.js';
export const ADMIN_ASSET = 'latch.js';

/** What a driver bundle requires for src/config-schema.ts (build.mjs): the host provides it (`schema` below). */
const CONFIG_SCHEMA_MODULE = 'latch:config-schema';

/**
 * Compiles and evaluates a bundle, whose text build.mjs wrapped as a CommonJS module body
 * (`(function (exports, require, module) {...})`), so that V8 compiles the asset as it is, with no copy made to wrap
 * it; returns its exports. The file name must be the same at build time and at run time: V8 takes a code cache only
 * for the source it was made from. `schema` gives the configuration schema to a driver bundle that asks for it.
 */
export function loadBundle<T>(
  name: string,
  source: string,
  options: { cachedData?: Buffer; schema?: () => unknown } = {},
): { exports: T; script: Script } {
  const { cachedData, schema } = options;
  const script = new Script(source, { filename: name, ...(cachedData && { cachedData }) });
  const module = { exports: {} as T };
  // The bundle's require: Node's built-in modules, and the schema where it is provided (a name that is not a literal,
  // which the rule against require() cannot check).
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const bundleRequire = schema ? (id: string): unknown => (id === CONFIG_SCHEMA_MODULE ? schema() : require(id)) : require;
  (script.runInThisContext() as (e: object, r: (id: string) => unknown, m: object) => void)(
    module.exports as object,
    bundleRequire,
    module,
  );
  return { exports: module.exports, script };
}

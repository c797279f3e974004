// latch's native helper (src/native/helper.c), for what Node does not do, or does at a cost every driver call pays:
// starting a child with vfork (run.ts) and holding a host-wide lock (lock.ts). Where it does not load, both do without
// it, as before it existed.
import { errorMessage } from '../errors.js';

export interface NativeHelper {
  /** Starts `file` (argv[0] included in `argv`, env as NAME=value) on the three descriptors; -1 for stdin: /dev/null. */
  spawn(file: string, argv: string[], env: string[], fds: [number, number, number]): number;
  /** undefined while the child runs; else its exit code (-1 when a signal killed it) and that signal's name (or ''). */
  reap(pid: number): [number, string] | undefined;
  /**
   * Takes the flock of the file `name` in the lock directory `dir` (created 0700 when missing; refused when a link or
   * writable by others) without waiting: its descriptor, or -1 when another holder has it.
   */
  lockFile(dir: string, name: string): number;
}

/**
 * The file name the helper is loaded by. By name, not by path: the loader looks it up on the executable's RPATH, which
 * names the self-contained build's runtime directory, where the build puts it and from where `latch install` installs
 * it beside the driver. Plain node has no RPATH, and so does without.
 */
const NATIVE_HELPER = 'latch-helper.node';

/** undefined: not looked for yet; null: not there (or not loadable). */
let helper: NativeHelper | null | undefined;
/** Why the helper did not load, when it was looked for and did not. */
let helperError: string | undefined;

/** The helper, loaded on first use; undefined where it does not load. */
export function nativeHelper(): NativeHelper | undefined {
  if (helper === undefined) {
    try {
      helper = loadHelper(NATIVE_HELPER);
    } catch (err) {
      helper = null;
      helperError = errorMessage(err);
    }
  }
  return helper ?? undefined;
}

/**
 * Why this process does without the helper (the loader's message), once it has looked for it; undefined when it has
 * not or the helper loaded. For the call's log line: a self-contained build without it works, at 10-15 ms more a
 * child and about 10 ms more a lock.
 */
export function nativeHelperUnavailable(): string | undefined {
  return helper === null ? helperError : undefined;
}

/**
 * For tests: use the helper at `path` (it must load), or none (false), or look it up as a driver does (undefined: by
 * name on first use).
 */
export function useNativeHelper(path: string | false | undefined): void {
  helper = path === false ? null : path === undefined ? undefined : loadHelper(path);
  helperError = path === false ? 'not used (a test)' : undefined;
}

function loadHelper(file: string): NativeHelper {
  const module = { exports: {} as NativeHelper };
  process.dlopen(module, file);
  return module.exports;
}

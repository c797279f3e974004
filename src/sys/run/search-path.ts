// Where the tools a child runs are found: the host's bin and sbin directories, looked up inline.
import { accessSync, constants, existsSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { CommandError, showCommand } from './command-error.js';

// kubelet's PATH often lacks the sbin directories where losetup, mkfs and friends live.
const EXTRA_PATH = ['/usr/local/sbin', '/usr/sbin', '/sbin'];
const FALLBACK_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

let setprivFound: string | null | undefined;

/** util-linux's setpriv, looked up on first use (once a call runs a child). */
export function setprivPath(): string | undefined {
  setprivFound ??= ['/usr/bin/setpriv', '/bin/setpriv'].find((p) => existsSync(p)) ?? null;
  return setprivFound ?? undefined;
}

/** The directories children are looked up in: PATH (or a fallback when it is empty) plus the sbin directories. */
function extendedPath(current: string | undefined): string[] {
  const parts = (current || FALLBACK_PATH).split(':').filter((p) => p.length > 0);
  for (const dir of EXTRA_PATH) if (!parts.includes(dir)) parts.push(dir);
  return parts;
}

/**
 * Where the tools latch runs are found: the directories run() searches, or exactly $LATCH_TOOL_PATH when it is set
 * (tests, and doctor's view of a host with tools elsewhere).
 */
export function toolSearchPath(env: NodeJS.ProcessEnv = process.env): string[] {
  if (env.LATCH_TOOL_PATH !== undefined) return env.LATCH_TOOL_PATH.split(':').filter((p) => p.length > 0);
  return extendedPath(env.PATH);
}

/** The full path of an executable file named `tool` in the first of `searchPath` that has one, or undefined. */
export function findTool(tool: string, searchPath: readonly string[]): string | undefined {
  for (const dir of searchPath) {
    const candidate = join(dir, tool);
    if (isExecutableFile(candidate)) return candidate;
  }
  return undefined;
}

/** What `command` runs: itself when it is a path, else the first match on the search path; undefined when none. */
export function findExecutable(command: string, searchPath: readonly string[]): string | undefined {
  if (command.includes('/')) return isExecutableFile(command) ? command : undefined;
  return findTool(command, searchPath);
}

/**
 * Inline, not through the thread pool: the search path is the host's own bin and sbin directories, and every child
 * a call runs looks its tool up there. Two asynchronous calls a directory cost 2-3 ms a child (measured: a pod's
 * lifecycle runs five), the inline ones a few microseconds.
 */
function isExecutableFile(path: string): boolean {
  try {
    if (!statSync(path).isFile()) return false;
    accessSync(path, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

/**
 * What every way of starting a child looks up first: the executable `command` names on the extended search path, and
 * that path; a CommandError, as of a child that could not start, when there is none.
 */
export function locateCommand(command: string, args: string[]): { executable: string; searchPath: string[] } {
  const searchPath = extendedPath(process.env.PATH);
  const executable = findExecutable(command, searchPath);
  if (executable === undefined) {
    throw new CommandError(`${showCommand(command, args)} could not be started: command not found (PATH=${searchPath.join(':')})`, {
      command,
      args: [...args],
      exitCode: undefined,
      stderrTail: '',
      timedOut: false,
      durationMs: 0,
    });
  }
  return { executable, searchPath };
}

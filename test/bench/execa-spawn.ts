// The bench's stand-in for src/sys/run/spawn.ts (npm run bench -- --only execa): children started by execa, as the
// design first named it, with everything else of run() unchanged (deadline, process group, output checks). build.mjs
// --spawn-module bundles it in place of spawn.ts into bin/latch-sea-execa, where the warm-up's code cache holds
// execa's compiled code as it holds latch's. execa cannot set PR_SET_PDEATHSIG, so every child goes through
// util-linux's setpriv, as run() without the native helper does.
import type { Options, Result } from 'execa';
import type { Collected, SpawnOptions, Started } from '../../src/sys/run/spawn.js';
import { MAX_BUFFER } from '../../src/sys/run/output-files.js';
import { setprivPath } from '../../src/sys/run/search-path.js';

type Execa = (file: string, args: string[], options: Options) => Promise<Result> & { pid?: number };

let loaded: Execa | undefined;

/** Loads execa ahead, for a process that cannot require it (the bench under tsx, whose CommonJS require meets execa's ESM-only dependencies). */
export async function loadExeca(): Promise<void> {
  loaded ??= (await import('execa')).execa as Execa;
}

/** execa, evaluated on the first child a call starts (a call that starts none never pays for it), as it once was. */
function execa(): Execa {
  // A require that esbuild bundles: execa's modules are evaluated here, not when the bundle starts.
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  loaded ??= (require('execa') as { execa: Execa }).execa;
  return loaded;
}

export function spawnCollecting(executable: string, args: string[], options: SpawnOptions): Started {
  const setpriv = setprivPath();
  const [file, argv] = setpriv ? [setpriv, ['--pdeathsig', 'SIGKILL', '--', executable, ...args]] : [executable, args];
  const child = execa()(file, argv, {
    detached: true, // own process group, so a deadline can kill grandchildren too
    cleanup: false, // run() does its own killing (killAllChildren)
    // A descriptor for stdin (the flock fallback, sys/lock.ts): execa takes one, though its types name only 0-2.
    ...(options.stdinFd !== undefined
      ? { stdin: options.stdinFd as unknown as 'inherit' }
      : options.input === undefined
        ? { stdin: 'ignore' as const }
        : { input: options.input }),
    stdout: 'pipe',
    stderr: 'pipe',
    buffer: true,
    reject: false,
    encoding: 'utf8',
    stripFinalNewline: false,
    maxBuffer: MAX_BUFFER,
    extendEnv: false,
    env: options.env,
  });
  const done = child.then((result): Collected => ({
    stdout: typeof result.stdout === 'string' ? result.stdout : '',
    stderr: typeof result.stderr === 'string' ? result.stderr : '',
    isMaxBuffer: result.isMaxBuffer,
    exitCode: result.exitCode,
    signal: result.signal,
    errorCode: (result as { code?: string }).code,
  }));
  return { pid: child.pid, done };
}

// startDaemon(): the one kind of child that outlives the call (rbd-fuse), started out of the caller's reach on purpose.
import { spawn } from 'node:child_process';
import { LatchError } from '../../errors.js';
import { forkOutsideOwnCgroup, hostRunsSystemd } from '../cgroup.js';
import { CommandError, formatDuration, lastLineSuffix, outputTail, showCommand } from './command-error.js';
import { MAX_BUFFER } from './output-files.js';
import { KILL_GRACE_MS, running, signalGroup } from './process-groups.js';
import { DEFAULT_COMMAND_TIMEOUT_MS, checkArgv, elapsedMs, type RunResult } from './run.js';
import { findExecutable, locateCommand, setprivPath } from './search-path.js';

/**
 * Starts a program that puts itself into the background (forks, setsid()s and exits 0 once it serves, as a FUSE
 * daemon does without -f) and returns when its foreground part has exited, with the stderr that part wrote.
 *
 * This is the one kind of child that must outlive the driver call: rbd-fuse serves a volume's mount for as long as
 * the volume is attached, across many calls. It escapes the call by design, not by accident: PR_SET_PDEATHSIG is
 * cleared in the child of a fork, and the daemon's setsid() takes it out of the process group that a deadline or
 * killAllChildren() kills. Nor does it stay in the caller's cgroup, where a restart of kubelet's service would kill it
 * (KillMode=control-group): it is born in a systemd scope of its own, or in latch's cgroup (sys/cgroup.ts). The
 * start-up itself is bounded like any child: the foreground part runs under setpriv --pdeathsig and its group is
 * SIGKILLed at the deadline. Only stderr is kept, and only until the foreground part exits: a daemon that kept the
 * pipe open would otherwise hold the call until its deadline.
 */
export async function startDaemon(command: string, args: string[], options: DaemonOptions = {}): Promise<RunResult> {
  checkArgv(command, args);
  if (options.scope !== undefined && !SCOPE_NAME.test(options.scope)) {
    throw new LatchError(`refusing to start ${command} in a scope named ${JSON.stringify(options.scope)}: not a systemd unit name`);
  }
  // A name too long for a unit (a long volume name): systemd names the scope itself (run-rXXXX.scope).
  const scope = options.scope !== undefined && options.scope.length <= MAX_SCOPE_NAME ? options.scope : undefined;
  const timeoutMs = options.timeoutMs ?? DEFAULT_COMMAND_TIMEOUT_MS;
  const { executable, searchPath } = locateCommand(command, args);
  const shown = showCommand(command, args);
  const details = { command, args: [...args], exitCode: undefined, stderrTail: '', timedOut: false, durationMs: 0 };
  const systemdRun = hostRunsSystemd() ? findExecutable('systemd-run', searchPath) : undefined;
  const [file, argv] = daemonCommand(executable, args, { setpriv: setprivPath(), systemdRun, scope });
  const started = process.hrtime.bigint();
  const startChild = () =>
    spawn(file, argv, {
      detached: true,
      stdio: ['ignore', 'ignore', 'pipe'],
      env: { ...process.env, LC_ALL: 'C', PATH: searchPath.join(':') },
    });
  // Out of the caller's cgroup (kubelet's: a restart of kubelet kills everything in it): systemd's own scope where
  // systemd runs the host, else latch's cgroup (sys/cgroup.ts).
  const child = systemdRun ? startChild() : forkOutsideOwnCgroup(startChild);
  const pgid = child.pid;
  if (pgid !== undefined) running.add(pgid);
  let stderr = '';
  child.stderr?.setEncoding('utf8');
  child.stderr?.on('data', (chunk: string) => {
    if (stderr.length < MAX_BUFFER) stderr += chunk;
  });
  let timedOut = false;
  const outcome = await new Promise<{ code: number | null; signal: NodeJS.Signals | null; error?: Error }>((resolve) => {
    let abandon: NodeJS.Timeout | undefined;
    const deadline = setTimeout(() => {
      timedOut = true;
      if (pgid !== undefined) signalGroup(pgid, 'SIGKILL');
      // Stuck in the kernel (a mount(2) waiting on a FUSE daemon that never answers): not waited for, as in run().
      abandon = setTimeout(() => resolve({ code: null, signal: 'SIGKILL' }), KILL_GRACE_MS);
    }, timeoutMs);
    const settle = (value: { code: number | null; signal: NodeJS.Signals | null; error?: Error }): void => {
      clearTimeout(deadline);
      clearTimeout(abandon);
      resolve(value);
    };
    child.once('error', (error) => settle({ code: null, signal: null, error }));
    child.once('exit', (code, signal) => settle({ code, signal }));
  });
  if (pgid !== undefined) running.delete(pgid);
  child.stderr?.destroy();
  const durationMs = elapsedMs(started);
  const tail = outputTail(stderr);
  const result = {
    ...details,
    exitCode: outcome.code ?? undefined,
    signal: outcome.signal ?? undefined,
    stderrTail: tail,
    timedOut,
    durationMs,
  };
  if (timedOut) throw new CommandError(`${shown} did not finish starting within ${formatDuration(timeoutMs)}`, result);
  if (outcome.error) throw new CommandError(`${shown} could not be started: ${outcome.error.message}`, result, { cause: outcome.error });
  if (outcome.code !== 0) {
    const how = outcome.code === null ? `was killed by ${outcome.signal ?? 'a signal'}` : `failed (exit ${outcome.code})`;
    throw new CommandError(`${shown} ${how}${lastLineSuffix(tail)}`, result);
  }
  return { stdout: '', stderr, exitCode: 0, durationMs };
}

export interface DaemonOptions {
  /** Deadline of the start-up (the foreground part); default DEFAULT_COMMAND_TIMEOUT_MS (120 s). */
  timeoutMs?: number;
  /**
   * The name of the transient systemd scope (without `.scope`) the daemon runs in where systemd runs the host, e.g.
   * `latch-rbd-fuse-POOL-IMAGE-TIME`: what `systemctl status` and the journal show. Letters, digits and `:_.-`; one
   * longer than a unit name may be is left to systemd to name.
   */
  scope?: string;
}

/** What a systemd unit name may hold (systemd.unit(5)), and how long it may be before `.scope` (255 with it). */
const SCOPE_NAME = /^[A-Za-z0-9:_.-]+$/;
const MAX_SCOPE_NAME = 249;

/**
 * The command line that starts a daemon: under setpriv --pdeathsig (the start-up dies with the call) where setpriv
 * is, and inside a transient scope of systemd's (`systemd-run --scope`, which moves itself into the scope and then
 * execs the rest, so the daemon it forks is born there) where systemd runs the host.
 */
export function daemonCommand(
  executable: string,
  args: string[],
  tools: { setpriv: string | undefined; systemdRun: string | undefined; scope?: string | undefined },
): [string, string[]] {
  const [file, argv] = tools.setpriv ? [tools.setpriv, ['--pdeathsig', 'SIGKILL', '--', executable, ...args]] : [executable, args];
  if (!tools.systemdRun) return [file, argv];
  const unit = tools.scope === undefined ? [] : [`--unit=${tools.scope}`];
  // --collect: a scope whose daemon failed is unloaded all the same, so its name can be used again.
  return [tools.systemdRun, ['--scope', '--quiet', '--collect', ...unit, '--', file, ...argv]];
}

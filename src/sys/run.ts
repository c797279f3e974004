// The one place that spawns child processes. Every child gets an argument array (never a shell), its own process
// group, captured stdout/stderr (the driver's stdout carries only its JSON reply) and a deadline after which the
// whole group is killed: kubelet gives most FlexVolume calls no timeout, so a hung mkfs would hang a volume forever.
import { spawn } from 'node:child_process';
import {
  accessSync,
  closeSync,
  constants,
  existsSync,
  fstatSync,
  openSync,
  readdirSync,
  readFileSync,
  readSync,
  statSync,
  writeSync,
} from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { LatchError, errorMessage } from '../errors.js';
import { forkOutsideOwnCgroup, hostRunsSystemd } from './cgroup.js';
import { nativeHelper, type NativeHelper } from './native.js';

export interface RunOptions {
  /** Deadline for the child; default: setDefaultCommandTimeout(), initially 120 s. */
  timeoutMs?: number;
  /** Written to the child's stdin (otherwise stdin is /dev/null). Never put secrets on the command line; here is fine. */
  input?: string;
  /**
   * The child's stdin instead: this descriptor, which stays this process's (flock(1) locks the open file it is given,
   * which the lock's holder keeps: sys/lock.ts).
   */
  stdinFd?: number;
  /** Exit codes besides 0 that are not failures (e.g. blkid's 2 = "nothing found"). */
  okExitCodes?: number[];
  /** The child's environment instead of this process's; LC_ALL and PATH are set over it either way. */
  env?: NodeJS.ProcessEnv;
}

export interface RunResult {
  stdout: string;
  stderr: string;
  exitCode: number;
  durationMs: number;
}

/** A child process failed: non-zero exit (not in okExitCodes), killed by a signal, past its deadline, or not startable. */
export class CommandError extends LatchError {
  override name = 'CommandError';
  readonly command: string;
  readonly args: string[];
  /** undefined when the child was killed by a signal or could not be started. */
  readonly exitCode: number | undefined;
  readonly signal: string | undefined;
  /** The last few lines of stderr (or of stdout when stderr was empty). */
  readonly stderrTail: string;
  readonly timedOut: boolean;
  readonly durationMs: number;

  constructor(
    message: string,
    details: {
      command: string;
      args: string[];
      exitCode: number | undefined;
      signal?: string | undefined;
      stderrTail: string;
      timedOut: boolean;
      durationMs: number;
    },
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.command = details.command;
    this.args = details.args;
    this.exitCode = details.exitCode;
    this.signal = details.signal;
    this.stderrTail = details.stderrTail;
    this.timedOut = details.timedOut;
    this.durationMs = details.durationMs;
  }
}

const INITIAL_TIMEOUT_MS = 120_000;
const KILL_GRACE_MS = 2_000;
const GROUP_POLL_MS = 20;
const MAX_BUFFER = 16 * 1024 * 1024;
// kubelet's PATH often lacks the sbin directories where losetup, mkfs and friends live.
const EXTRA_PATH = ['/usr/local/sbin', '/usr/sbin', '/sbin'];
const FALLBACK_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

let defaultTimeoutMs = INITIAL_TIMEOUT_MS;

/** Process group ids (= pids, since every child is a group leader) of the children still running. */
const running = new Set<number>();

/**
 * Whole milliseconds since `started` (process.hrtime.bigint()). Not performance.now(): its first use loads Node's
 * perf_hooks, about 1 ms of every call that runs a child.
 */
function elapsedMs(started: bigint): number {
  return Math.round(Number(process.hrtime.bigint() - started) / 1e6);
}

/** Sets the deadline used when a call passes no timeoutMs (from the config's commandTimeout). */
export function setDefaultCommandTimeout(ms: number): void {
  if (!Number.isFinite(ms) || ms <= 0) throw new LatchError(`command timeout must be a positive number of milliseconds, got ${ms}`);
  defaultTimeoutMs = ms;
}

/**
 * Kills the process group of every child still running, with SIGKILL, synchronously.
 * For the protocol layer's SIGTERM handler: kubelet's own deadline must not leave our children behind.
 */
export function killAllChildren(): void {
  for (const pgid of running) {
    signalGroup(pgid, 'SIGKILL');
  }
}

/** Number of children currently running (for tests and diagnostics). */
export function runningChildren(): number {
  return running.size;
}

/**
 * Runs `command args...` and returns its captured output. Throws CommandError when the exit code is neither 0 nor
 * in okExitCodes, when a signal killed it, when it could not be started, or when the deadline passed (the whole
 * process group then gets SIGTERM, and SIGKILL 2 s later; a child that has not exited 2 s after that is stuck in the
 * kernel and is no longer waited for).
 */
export async function run(command: string, args: string[], options: RunOptions = {}): Promise<RunResult> {
  checkArgv(command, args);
  const timeoutMs = options.timeoutMs ?? defaultTimeoutMs;
  if (!Number.isFinite(timeoutMs) || timeoutMs <= 0) {
    throw new LatchError(`timeout for ${command} must be a positive number of milliseconds, got ${timeoutMs}`);
  }
  const okExitCodes = options.okExitCodes ?? [];

  const searchPath = extendedPath(process.env.PATH);
  const path = searchPath.join(':');
  const executable = findExecutable(command, searchPath);
  const started = process.hrtime.bigint();
  if (executable === undefined) {
    throw new CommandError(`${showCommand(command, args)} could not be started: command not found (PATH=${path})`, {
      command,
      args: [...args],
      exitCode: undefined,
      stderrTail: '',
      timedOut: false,
      durationMs: 0,
    });
  }
  const child = spawnCollecting(executable, args, {
    input: options.input,
    stdinFd: options.stdinFd,
    env: { ...(options.env ?? process.env), LC_ALL: 'C', PATH: path },
  });

  const pgid = child.pid;
  let timedOut = false;
  let deadline: NodeJS.Timeout | undefined;
  let forceKill: NodeJS.Timeout | undefined;
  let abandon: NodeJS.Timeout | undefined;
  let forceKilled: Promise<void> | undefined;
  const unkillable = new Promise<undefined>((resolve) => {
    if (pgid === undefined) return;
    running.add(pgid);
    deadline = setTimeout(() => {
      timedOut = true;
      signalGroup(pgid, 'SIGTERM');
      forceKilled = new Promise<void>((resolveKilled) => {
        forceKill = setTimeout(() => {
          signalGroup(pgid, 'SIGKILL');
          resolveKilled();
          abandon = setTimeout(() => resolve(undefined), KILL_GRACE_MS);
        }, KILL_GRACE_MS);
      });
    }, timeoutMs);
  });

  let result;
  try {
    // A child in uninterruptible sleep (D state: a umount whose writeback waits on a stalled cluster, a stat on a
    // FUSE mount whose daemon stopped answering) does not die of SIGKILL until the kernel lets it go, perhaps never.
    // The call must still end: the child is left to the kernel (it dies, by PR_SET_PDEATHSIG at the latest, once
    // it leaves that wait) and the call fails as timed out.
    result = await Promise.race([child.done, unkillable]);
    // After a timeout the leader may be gone while other members of its group ignore SIGTERM and hold no pipe:
    // they still get their SIGKILL at the end of the grace period. A group with a live member keeps its id, so
    // this cannot hit a stranger's group.
    if (result !== undefined && timedOut && pgid !== undefined && forceKilled !== undefined) await untilGroupGone(pgid, forceKilled);
  } finally {
    clearTimeout(deadline);
    clearTimeout(forceKill);
    clearTimeout(abandon);
    if (pgid !== undefined) running.delete(pgid);
  }

  const durationMs = elapsedMs(started);
  const shown = showCommand(command, args);
  if (result === undefined) {
    throw new CommandError(
      `${shown} timed out after ${formatDuration(timeoutMs)} and did not exit when killed (it waits in the kernel, on I/O ` +
        `that does not complete); it was left to end by itself`,
      { command, args: [...args], exitCode: undefined, signal: 'SIGKILL', stderrTail: '', timedOut: true, durationMs },
    );
  }
  const { stdout, stderr, exitCode } = result;
  const tail = outputTail(stderr || stdout);
  const details = { command, args: [...args], exitCode, signal: result.signal, stderrTail: tail, timedOut, durationMs };

  if (timedOut) {
    throw new CommandError(`${shown} timed out after ${formatDuration(timeoutMs)}`, details, { cause: result });
  }
  if (result.readError !== undefined) {
    throw new CommandError(`${shown} ran, but its output could not be read: ${errorMessage(result.readError)}`, details, {
      cause: result.readError,
    });
  }
  if (result.isMaxBuffer) {
    throw new CommandError(`${shown} produced more than ${MAX_BUFFER} bytes of output`, details, { cause: result });
  }
  if (exitCode === undefined) {
    if (result.signal) {
      throw new CommandError(`${shown} was killed by ${result.signal}${lastLineSuffix(tail)}`, details, { cause: result });
    }
    const code = result.errorCode;
    const why = code === 'ENOENT' ? `command not found (PATH=${path})` : (code ?? 'unknown error');
    throw new CommandError(`${shown} could not be started: ${why}`, details, { cause: result });
  }
  if (exitCode !== 0 && !okExitCodes.includes(exitCode)) {
    throw new CommandError(`${shown} failed (exit ${exitCode})${lastLineSuffix(tail)}`, details, { cause: result });
  }
  return { stdout, stderr, exitCode, durationMs };
}

/** A child's output as collected. */
interface Output {
  stdout: string;
  stderr: string;
  isMaxBuffer: boolean;
  /** Why its output files could not be read. */
  readError?: unknown;
}

interface Collected extends Output {
  /** undefined when a signal killed the child or it could not be started. */
  exitCode: number | undefined;
  signal: NodeJS.Signals | undefined;
  /** Why it could not be started (ENOENT, EACCES, ...). */
  errorCode: string | undefined;
}

/** A started child: its pid (= its process group's id; undefined when it could not be started) and its outcome. */
interface Started {
  pid: number | undefined;
  done: Promise<Collected>;
}

/**
 * Starts `executable` in a new session (so a deadline can kill grandchildren too, through its process group) with
 * stdin from `input` or /dev/null, and collects its stdout and stderr once it has exited.
 *
 * A child must not outlive the driver: kubelet SIGKILLs a driver call without telling it, and an orphaned
 * `losetup -d /dev/loop3` that runs later detaches whichever volume has loop3 by then. So the kernel kills every child
 * with us (PR_SET_PDEATHSIG): set by the native helper where it loads, else by util-linux's setpriv, which execs the
 * command with it set.
 *
 * The output goes to two files without a name (outputFiles), read once the child is gone, rather than to pipes: a pipe
 * is a libuv handle and a stream to read it through, which measured 4 ms more per child (a first spawn 10.4 ms
 * against 6.5, its exit 3.5 against 1.5), five times in a pod's lifecycle. Where such a file cannot be made, pipes.
 */
interface SpawnOptions {
  input: string | undefined;
  stdinFd: number | undefined;
  env: NodeJS.ProcessEnv;
}

function spawnCollecting(executable: string, args: string[], options: SpawnOptions): Started {
  const files = outputFiles();
  const helper = files && nativeHelper();
  if (files && helper) return spawnThroughHelper(helper, executable, args, files, options);
  const setpriv = setprivPath();
  const [file, argv] = setpriv ? [setpriv, ['--pdeathsig', 'SIGKILL', '--', executable, ...args]] : [executable, args];
  return spawnThroughNode(file, argv, files, options);
}

/**
 * node:child_process (rather than execa: every driver call that runs a tool paid for evaluating execa and for its
 * per-child machinery, measured 10-25 ms of a call's CPU, more than the tool itself).
 */
function spawnThroughNode(file: string, argv: string[], files: { out: number; err: number } | undefined, options: SpawnOptions): Started {
  let child;
  try {
    child = spawn(file, argv, {
      detached: true,
      stdio: [options.stdinFd ?? (options.input === undefined ? 'ignore' : 'pipe'), files?.out ?? 'pipe', files?.err ?? 'pipe'],
      env: options.env,
    });
  } catch (err) {
    if (files) closeFiles(files);
    throw err;
  }
  const done = new Promise<Collected>((resolve) => {
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    let size = 0;
    let isMaxBuffer = false;
    const collect = (into: Buffer[]) => (chunk: Buffer) => {
      if (isMaxBuffer) return;
      size += chunk.length;
      if (size > MAX_BUFFER) {
        isMaxBuffer = true;
        if (child.pid !== undefined) signalGroup(child.pid, 'SIGKILL');
        return;
      }
      into.push(chunk);
    };
    child.stdout?.on('data', collect(out));
    child.stderr?.on('data', collect(err));
    const text = (chunks: Buffer[]) => Buffer.concat(chunks).toString('utf8');
    // Taken once: a child that could not be started sends 'error' and then 'close', and the files are closed after
    // the first read.
    let collected: Output | undefined;
    const output = (): Output => (collected ??= files ? readFiles(files) : { stdout: text(out), stderr: text(err), isMaxBuffer });
    child.once('error', (error: NodeJS.ErrnoException) => {
      // Not started; an error after the start (a failed kill) changes nothing, and 'close' reports the exit.
      if (child.pid !== undefined) return;
      resolve({ ...output(), exitCode: undefined, signal: undefined, errorCode: error.code });
    });
    child.once('close', (code, signal) =>
      resolve({ ...output(), exitCode: code ?? undefined, signal: signal ?? undefined, errorCode: undefined }),
    );
  });
  if (options.input !== undefined && child.stdin) {
    // A child that exits without reading its input closes the pipe under us: that is its business, not an error.
    child.stdin.on('error', () => {});
    child.stdin.end(options.input);
  }
  return { pid: child.pid, done };
}

/**
 * vfork and execve through the helper. Its children are not libuv's, so they are reaped here, when SIGCHLD says that
 * one has exited; the listener is there only while a child of the helper's runs (Node's signal listeners do not keep
 * the process alive).
 */
function spawnThroughHelper(
  helper: NativeHelper,
  executable: string,
  args: string[],
  files: { out: number; err: number },
  options: SpawnOptions,
): Started {
  let stdin = -1;
  let pid: number;
  try {
    if (options.stdinFd === undefined && options.input !== undefined) {
      stdin = unnamedFile();
      // At position 0, which leaves the file's offset where the child starts reading: at its start.
      writeSync(stdin, options.input, 0);
    }
    const env = Object.entries(options.env).flatMap(([name, value]) => (value === undefined ? [] : [`${name}=${value}`]));
    if (!exited.size) process.on('SIGCHLD', reapExited);
    pid = helper.spawn(executable, [executable, ...args], env, [options.stdinFd ?? stdin, files.out, files.err]);
  } catch (error) {
    if (!exited.size) process.off('SIGCHLD', reapExited);
    closeFiles(files);
    const errorCode = (error as NodeJS.ErrnoException).code ?? errorMessage(error);
    return {
      pid: undefined,
      done: Promise.resolve({ stdout: '', stderr: '', isMaxBuffer: false, exitCode: undefined, signal: undefined, errorCode }),
    };
  } finally {
    if (stdin >= 0) closeSync(stdin);
  }
  const done = new Promise<Collected>((resolve) => {
    exited.set(pid, {
      helper,
      settle: (status) => {
        const [code, signal] = status ?? [-1, ''];
        resolve({
          ...readFiles(files),
          exitCode: code >= 0 ? code : undefined,
          signal: signal ? (signal as NodeJS.Signals) : undefined,
          errorCode: status ? undefined : 'ECHILD',
        });
      },
    });
  });
  reapExited(); // one that exited already
  return { pid, done };
}

/**
 * The helper's running children: the helper that started each (which reaps it) and what to do when it has exited
 * (with undefined when it could not be waited for).
 */
const exited = new Map<number, { helper: NativeHelper; settle: (status: [number, string] | undefined) => void }>();

function reapExited(): void {
  for (const [pid, { helper, settle }] of exited) {
    let status: [number, string] | undefined;
    try {
      status = helper.reap(pid);
      if (status === undefined) continue;
    } catch {
      // ECHILD: not ours to wait for any more. Nothing else can happen to a pid of our own.
    }
    exited.delete(pid);
    settle(status);
  }
  if (!exited.size) process.off('SIGCHLD', reapExited);
}

/** Where a child's output files are made: a tmpfs that Linux hosts mount, so nothing of it is ever written to a disk. */
const OUTPUT_DIR = '/dev/shm';
/** open(2)'s O_TMPFILE (with O_DIRECTORY, as the kernel defines it), which node:fs does not name. */
const O_TMPFILE = 0o20000000 | constants.O_DIRECTORY;

/**
 * Two files for a child's stdout and stderr: readable and writable by root only, and without a name (O_TMPFILE), so
 * that nothing is left behind whatever happens to the call, and nobody else can open them. undefined where the
 * directory or the flag is not there (the caller uses pipes).
 */
function outputFiles(): { out: number; err: number } | undefined {
  const make = (): number | undefined => {
    try {
      return unnamedFile();
    } catch {
      return undefined;
    }
  };
  const out = make();
  if (out === undefined) return undefined;
  const err = make();
  if (err === undefined) {
    closeSync(out);
    return undefined;
  }
  return { out, err };
}

/** A file in OUTPUT_DIR without a name, readable and writable by root only; throws where it cannot be made. */
function unnamedFile(): number {
  return openSync(OUTPUT_DIR, constants.O_RDWR | O_TMPFILE, 0o600);
}

/**
 * What the child wrote to its output files, which are closed after. Over MAX_BUFFER, isMaxBuffer and nothing of it: a
 * child cannot be stopped at that size as with a pipe, its deadline bounds what it writes. A file that cannot be read
 * is readError: an output taken as empty could read as "nothing found".
 */
function readFiles(files: { out: number; err: number }): Output {
  try {
    const stdout = readOutput(files.out);
    const stderr = readOutput(files.err);
    if (stdout === undefined || stderr === undefined) return { stdout: '', stderr: '', isMaxBuffer: true };
    return { stdout, stderr, isMaxBuffer: false };
  } catch (readError) {
    return { stdout: '', stderr: '', isMaxBuffer: false, readError };
  } finally {
    closeFiles(files);
  }
}

/** One output file from its start; undefined when it is over MAX_BUFFER. */
function readOutput(fd: number): string | undefined {
  const size = fstatSync(fd).size;
  if (size > MAX_BUFFER) return undefined;
  const buffer = Buffer.allocUnsafe(size);
  let read = 0;
  while (read < size) {
    const n = readSync(fd, buffer, read, size - read, read);
    if (n === 0) break;
    read += n;
  }
  return buffer.toString('utf8', 0, read);
}

function closeFiles(files: { out: number; err: number }): void {
  closeSync(files.out);
  closeSync(files.err);
}

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
  const timeoutMs = options.timeoutMs ?? defaultTimeoutMs;
  const searchPath = extendedPath(process.env.PATH);
  const executable = findExecutable(command, searchPath);
  const shown = showCommand(command, args);
  const details = { command, args: [...args], exitCode: undefined, stderrTail: '', timedOut: false, durationMs: 0 };
  if (executable === undefined) {
    throw new CommandError(`${shown} could not be started: command not found (PATH=${searchPath.join(':')})`, details);
  }
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
  /** Deadline of the start-up (the foreground part); default: setDefaultCommandTimeout(). */
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

function checkArgv(command: string, args: string[]): void {
  if (typeof command !== 'string' || command.length === 0 || command.includes('\0')) {
    throw new LatchError('refusing to run an empty or malformed command name');
  }
  if (!Array.isArray(args)) throw new LatchError(`arguments for ${command} must be an array`);
  for (const arg of args) {
    if (typeof arg !== 'string' || arg.includes('\0')) {
      throw new LatchError(`refusing to run ${command}: an argument is not a string or contains a NUL byte`);
    }
  }
}

let setprivFound: string | null | undefined;

/** util-linux's setpriv, looked up on first use (once a call runs a child). */
function setprivPath(): string | undefined {
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
function findExecutable(command: string, searchPath: readonly string[]): string | undefined {
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

function signalGroup(pgid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pgid, signal);
  } catch {
    // ESRCH: the group is already gone.
  }
}

/**
 * Whether any process of the group is still running. Zombies do not count: an orphan that died keeps its group
 * "alive" for kill(2) until init reaps it, and it needs no SIGKILL.
 */
/**
 * Waits until every member of the group has exited (those that obey SIGTERM take a moment to die, more under load),
 * or until the grace period's SIGKILL has been sent.
 */
async function untilGroupGone(pgid: number, killed: Promise<void>): Promise<void> {
  let sent = false;
  void killed.then(() => {
    sent = true;
  });
  while (!sent && groupAlive(pgid)) await sleep(GROUP_POLL_MS);
}

function groupAlive(pgid: number): boolean {
  let entries: string[];
  try {
    entries = readdirSync('/proc');
  } catch {
    try {
      process.kill(-pgid, 0);
      return true;
    } catch (err) {
      return (err as NodeJS.ErrnoException).code === 'EPERM';
    }
  }
  for (const entry of entries) {
    if (entry.charCodeAt(0) < 48 || entry.charCodeAt(0) > 57) continue;
    let stat: string;
    try {
      stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
    } catch {
      continue;
    }
    // pid (comm) state ppid pgrp ...; comm may contain spaces and parentheses, so split after the last ')'.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    if (Number(fields[2]) === pgid && fields[0] !== 'Z' && fields[0] !== 'X') return true;
  }
  return false;
}

function showCommand(command: string, args: string[]): string {
  const text = [command, ...args].map((a) => (/^[\w@%+=:,./-]+$/.test(a) ? a : JSON.stringify(a))).join(' ');
  return text.length > 200 ? `${text.slice(0, 197)}...` : text;
}

function outputTail(text: string): string {
  const lines = text
    .split('\n')
    .map((l) => l.trimEnd())
    .filter((l) => l.length > 0);
  const tail = lines.slice(-5).join('\n');
  return tail.length > 1000 ? tail.slice(-1000) : tail;
}

function lastLineSuffix(tail: string): string {
  const last = tail.split('\n').pop() ?? '';
  if (!last) return '';
  return `: ${last.length > 300 ? `${last.slice(0, 297)}...` : last}`;
}

function formatDuration(ms: number): string {
  if (ms < 1000) return `${ms} ms`;
  const s = ms / 1000;
  return `${Number.isInteger(s) ? s : s.toFixed(1)} s`;
}

/** A child whose stdout is read as it comes (runStreaming). */
export interface StreamingChild {
  /** The child's stdout; reading it slowly slows the child down (the pipe's back-pressure), nothing piles up here. */
  stdout: NodeJS.ReadableStream & AsyncIterable<Buffer>;
  /** Settles once the child is gone: resolves on exit 0, rejects with a CommandError otherwise (a deadline, a kill). */
  done: Promise<RunResult>;
  /** Kills the child's process group (a reader that stops early). */
  kill(): void;
}

/**
 * Runs `command args...` with its stdout as a stream, for output too large to hold (an rbd export-diff of a volume):
 * the same rules as run() (no shell, its own process group, killed with this process through setpriv --pdeathsig, a
 * deadline after which the group gets SIGKILL), stderr kept to its last lines. Through node:child_process: the helper
 * writes children's output to files, and a stream must come from a pipe.
 */
export function runStreaming(command: string, args: string[], options: { timeoutMs: number }): StreamingChild {
  checkArgv(command, args);
  const { timeoutMs } = options;
  if (!Number.isFinite(timeoutMs) || timeoutMs <= 0) {
    throw new LatchError(`timeout for ${command} must be a positive number of milliseconds, got ${timeoutMs}`);
  }
  const searchPath = extendedPath(process.env.PATH);
  const executable = findExecutable(command, searchPath);
  const shown = showCommand(command, args);
  const details = { command, args: [...args], exitCode: undefined, stderrTail: '', timedOut: false, durationMs: 0 };
  if (executable === undefined) {
    throw new CommandError(`${shown} could not be started: command not found (PATH=${searchPath.join(':')})`, details);
  }
  const setpriv = setprivPath();
  const [file, argv] = setpriv ? [setpriv, ['--pdeathsig', 'SIGKILL', '--', executable, ...args]] : [executable, args];
  const started = process.hrtime.bigint();
  const child = spawn(file, argv, {
    detached: true,
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, LC_ALL: 'C', PATH: searchPath.join(':') },
  });
  const pgid = child.pid;
  if (pgid !== undefined) running.add(pgid);
  let stderr = '';
  child.stderr?.setEncoding('utf8');
  child.stderr?.on('data', (text: string) => {
    stderr = (stderr + text).slice(-4096);
  });
  let timedOut = false;
  // A reader that stopped reading leaves the pipe full: its end is dropped too, or the child's 'close' never comes.
  const stop = () => {
    if (pgid !== undefined) signalGroup(pgid, 'SIGKILL');
    child.stdout?.destroy();
  };
  const deadline = setTimeout(() => {
    timedOut = true;
    stop();
  }, timeoutMs);
  const done = new Promise<RunResult>((resolve, reject) => {
    const settle = (code: number | null, signal: NodeJS.Signals | null, error?: NodeJS.ErrnoException) => {
      clearTimeout(deadline);
      if (pgid !== undefined) running.delete(pgid);
      const durationMs = elapsedMs(started);
      const tail = outputTail(stderr);
      const info = { ...details, exitCode: code ?? undefined, signal: signal ?? undefined, stderrTail: tail, timedOut, durationMs };
      if (timedOut) reject(new CommandError(`${shown} timed out after ${formatDuration(timeoutMs)}`, info));
      else if (error) reject(new CommandError(`${shown} could not be started: ${error.code ?? error.message}`, info));
      else if (code === null) reject(new CommandError(`${shown} was killed by ${signal ?? 'a signal'}${lastLineSuffix(tail)}`, info));
      else if (code !== 0) reject(new CommandError(`${shown} failed (exit ${code})${lastLineSuffix(tail)}`, info));
      else resolve({ stdout: '', stderr, exitCode: 0, durationMs });
    };
    child.once('error', (error: NodeJS.ErrnoException) => {
      if (child.pid === undefined) settle(null, null, error);
    });
    child.once('close', (code, signal) => settle(code, signal));
  });
  // Awaited by the caller in its turn; until then a failure must not count as an unhandled rejection.
  done.catch(() => undefined);
  return {
    stdout: child.stdout as NodeJS.ReadableStream & AsyncIterable<Buffer>,
    done,
    kill: stop,
  };
}

// FUSE mounts and the rbd-fuse daemons behind them, seen only through the kernel's own tables: /proc/self/mountinfo
// for the mount (and its connection number), /proc/PID/cmdline for the daemon. Nothing here stats or opens anything
// below a FUSE mount unless it goes through guardFuse(): a daemon that no longer answers (a fenced rbd-fuse) leaves
// every such call in D state, beyond any signal, and only aborting the connection through fusectl ends the wait.
import { readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { basename } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { LatchError } from '../errors.js';
import { readMountInfo, type MountInfo } from './mounts.js';
import { cephClientArgs, redactedError, type CephIdentity } from './rbd.js';
import { run, startDaemon } from './run.js';

const FUSECTL = '/sys/fs/fuse/connections';
// A guarded child's own deadline comes this much after the abort, so that the abort (not the kill, which cannot
// reach a process waiting on FUSE) is what ends a hung one.
const GUARD_MARGIN_MS = 5_000;

/** The FUSE mounts exactly at `mountPoint` (a canonical path, as mountinfo spells it), bottom first. */
export async function fuseMountsAt(mountPoint: string, table?: MountInfo[]): Promise<MountInfo[]> {
  return (table ?? (await readMountInfo())).filter(
    (m) => m.mountPoint === mountPoint && (m.fsType === 'fuse' || m.fsType.startsWith('fuse.')),
  );
}

/**
 * Aborts the FUSE connection of `mount`: every request waiting on it, and every later one, fails at once (ENOTCONN)
 * instead of hanging. The connection is named after the mount's device minor in mountinfo, so the mount point itself
 * is never touched. Mounts fusectl first if needed. Returns false when the connection was already gone.
 */
export async function abortFuseConnection(mount: MountInfo): Promise<boolean> {
  const [major, minor] = mount.majorMinor.split(':').map(Number);
  if (major !== 0 || minor === undefined || !Number.isInteger(minor)) {
    throw new LatchError(`${mount.mountPoint} (${mount.majorMinor}) is not a FUSE mount`);
  }
  if (!(await readMountInfo()).some((m) => m.fsType === 'fusectl')) {
    await run('mount', ['-t', 'fusectl', 'fusectl', FUSECTL], { timeoutMs: 10_000 }).catch(() => undefined);
  }
  try {
    await writeFile(`${FUSECTL}/${minor}/abort`, '1');
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return false;
    throw new LatchError(`cannot abort the FUSE connection of ${mount.mountPoint} through ${FUSECTL}/${minor}/abort`, { cause: err });
  }
}

/**
 * Runs `op`, a child process that touches the FUSE mount at `mountPoint` and whose own deadline is `timeoutMs` plus
 * GUARD_MARGIN_MS (see guardedTimeout), and aborts the mount's connection if it is still running after `timeoutMs`.
 */
export async function guardFuse<T>(mountPoint: string, timeoutMs: number, op: (childTimeoutMs: number) => Promise<T>): Promise<T> {
  let aborted = false;
  const timer = setTimeout(() => {
    aborted = true;
    void fuseMountsAt(mountPoint)
      .then((mounts) => Promise.all(mounts.map((m) => abortFuseConnection(m))))
      .catch(() => undefined);
  }, timeoutMs);
  const abortedError = (cause?: unknown): LatchError =>
    new LatchError(`the FUSE mount at ${mountPoint} did not answer within ${timeoutMs} ms; its connection was aborted`, { cause });
  let result: T;
  try {
    result = await op(timeoutMs + GUARD_MARGIN_MS);
  } catch (err) {
    if (aborted) throw abortedError(err);
    throw err;
  } finally {
    clearTimeout(timer);
  }
  // An op that still got through (losetup has set up its device before it reads the size) worked on a connection
  // that is dead now: whatever it made is no good.
  if (aborted) throw abortedError();
  return result;
}

/** The size of a file below a FUSE mount (stat in a child under guardFuse), or undefined when it does not exist. */
export async function guardedFileSize(mountPoint: string, file: string, timeoutMs: number): Promise<number | undefined> {
  const { stdout, exitCode } = await guardFuse(mountPoint, timeoutMs, (childTimeoutMs) =>
    run('stat', ['--format', '%s', file], { timeoutMs: childTimeoutMs, okExitCodes: [1] }),
  );
  if (exitCode !== 0) return undefined;
  const size = Number(stdout.trim());
  if (!Number.isSafeInteger(size)) throw new LatchError(`stat ${file} printed ${JSON.stringify(stdout.slice(0, 40))}, not a size`);
  return size;
}

/** umount(8) of a FUSE mount under guardFuse. */
export async function guardedUnmount(mountPoint: string, timeoutMs: number): Promise<void> {
  await guardFuse(mountPoint, timeoutMs, (childTimeoutMs) => run('umount', [mountPoint], { timeoutMs: childTimeoutMs }));
}

// librbd's cache off, on the command line so that no conf file or monitor setting turns it back on: rbd-fuse's fsync
// calls rbd_flush and returns 0 whatever it returned, so with the cache on (librbd's default) a write the OSDs refuse
// (this client blocklisted by a fence) is acknowledged from the cache and its failure is lost at the flush. Without
// the cache each write waits for the OSDs and returns their error itself (docs/design/rbd-backend.md j).
const NO_RBD_CACHE = ['--rbd-cache', 'false'];

/** Whether an rbd-fuse command line turns librbd's cache off as startRbdFuse does (an older latch's did not). */
export function runsWithoutRbdCache(argv: string[]): boolean {
  return argv.some((arg, i) => arg === NO_RBD_CACHE[0] && argv[i + 1] === NO_RBD_CACHE[1]);
}

export interface RbdFuseOptions {
  identity: CephIdentity;
  pool: string;
  image: string;
  mountPoint: string;
  timeoutMs: number;
  /**
   * The daemon's own log, with the monitor client at level 5: each of its client instances logs the global id the
   * monitor gave it ("authenticate success, global_id N"), which is how the node tells its watcher of the image from
   * any other (rbdFuseGlobalIds). Written afresh by each daemon; nothing else is logged at that level.
   */
  logFile: string;
}

/**
 * Starts `rbd-fuse -p POOL -r IMAGE MOUNTPOINT` (that image only, so the instance watches nothing else), with librbd's
 * cache off so that a write the OSDs refuse fails itself, as a daemon that outlives this call (startDaemon), and
 * returns once its mount is in mountinfo. rbd-fuse connects to the monitors before it mounts, so a bad identity or
 * keyring fails here with its message.
 */
export async function startRbdFuse(options: RbdFuseOptions): Promise<void> {
  const { identity, pool, image, mountPoint, timeoutMs, logFile } = options;
  await rm(logFile, { force: true });
  // On the command line, so that no conf turns it off (log_to_file) or sends it elsewhere.
  const log = ['--log-to-file', 'true', '--log-file', logFile, '--debug-monc', '5/5'];
  try {
    // The scope's name says which volume the daemon serves (`systemctl list-units 'latch-rbd-fuse-*'`); the start
    // time makes it unique: the scope of a daemon that just exited may not be gone yet when its volume is mapped again.
    const scope = `latch-rbd-fuse-${pool}-${image}-${Date.now().toString(36)}`;
    await startDaemon('rbd-fuse', [...cephClientArgs(identity), ...log, ...NO_RBD_CACHE, '-p', pool, '-r', image, mountPoint], {
      timeoutMs,
      scope,
    });
  } catch (err) {
    throw redactedError(err);
  }
  if ((await fuseMountsAt(mountPoint)).length === 0) {
    throw new LatchError(
      `rbd-fuse for ${pool}/${image} exited as if it had mounted ${mountPoint}, but mountinfo shows no FUSE mount there`,
    );
  }
}

/** The global ids of the client instances an rbd-fuse daemon started with `logFile` logged (startRbdFuse). */
export async function rbdFuseGlobalIds(logFile: string): Promise<Set<number>> {
  const text = await readFile(logFile, 'utf8').catch(() => '');
  return new Set([...text.matchAll(/ monclient: authenticate success, global_id ([0-9]{1,19})$/gm)].map((m) => Number(m[1])));
}

/** The live rbd-fuse processes serving `mountPoint` (by their command line in /proc, never by the mount). */
export async function rbdFusePids(mountPoint: string): Promise<number[]> {
  return (await rbdFuseProcesses()).filter((p) => p.argv.includes(mountPoint)).map((p) => p.pid);
}

/** Every live rbd-fuse process on this host with its command line, from /proc (what doctor looks for leftovers in). */
export async function rbdFuseProcesses(): Promise<{ pid: number; argv: string[] }[]> {
  const found: { pid: number; argv: string[] }[] = [];
  for (const entry of await readdir('/proc')) {
    if (!/^[0-9]+$/.test(entry) || Number(entry) === process.pid) continue;
    let argv: string[];
    try {
      argv = (await readFile(`/proc/${entry}/cmdline`, 'utf8')).split('\0');
    } catch {
      continue;
    }
    if (basename(argv[0] ?? '') !== 'rbd-fuse') continue;
    if (await isAlive(Number(entry))) found.push({ pid: Number(entry), argv });
  }
  return found;
}

/** Whether `pid` runs (a zombie does not: it is only waiting for its parent to reap it). */
async function isAlive(pid: number): Promise<boolean> {
  try {
    const stat = await readFile(`/proc/${pid}/stat`, 'utf8');
    const state = stat.slice(stat.lastIndexOf(')') + 2).split(' ')[0];
    return state !== 'Z' && state !== 'X';
  } catch {
    return false;
  }
}

/** Waits up to `timeoutMs` for every one of `pids` to be gone; returns those still alive. */
export async function waitForExit(pids: number[], timeoutMs: number): Promise<number[]> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const alive: number[] = [];
    for (const pid of pids) if (await isAlive(pid)) alive.push(pid);
    if (alive.length === 0 || Date.now() >= deadline) return alive;
    await sleep(50);
  }
}

/** SIGKILLs `pids` and waits up to `timeoutMs` for them to be gone (a large rbd-fuse takes ~1.4 s); returns survivors. */
export async function killAndWait(pids: number[], timeoutMs: number): Promise<number[]> {
  for (const pid of pids) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
  return waitForExit(pids, timeoutMs);
}

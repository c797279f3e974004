// fsfreeze: a mounted filesystem flushed and held still, so that a snapshot of its device is consistent.
//
// A frozen filesystem blocks every writer until it is thawed, and the kernel does not thaw it when the process that
// froze it dies. So a freeze is bounded: it is held at most `boundMs` (the configuration's freezeSeconds), after which
// it is thawed whether the work done under it is finished or not (the caller then says its copy is crash-consistent);
// a freeze that does not take within the bound is given up and thawed (a thaw right away, and again once fsfreeze has
// exited, in case the freeze landed after its deadline). And it is recorded: a root-only marker file per frozen mount
// in `markerDir`, written before the freeze and removed after the thaw, so that what a killed process left frozen is
// found and thawed (`thawLeftoverFreezes`: the agent at start and every interval; doctor reports it).
// By hand: `fsfreeze --unfreeze MOUNTPOINT`.
import { mkdir, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { isAbsolute, join } from 'node:path';
import { sha256Hex } from '../hash.js';
import { readMountInfo } from './mounts.js';
import { processExists, processStartTime } from './processes.js';
import { CommandError, run } from './run.js';

const THAW_TIMEOUT_MS = 30_000;
/** A live process's marker older than its bound by this much is a freeze its process lost track of. */
const LEFTOVER_GRACE_MS = 30_000;
const MARKER_SUFFIX = '.json';

export interface FreezeOptions {
  /** The longest the filesystem may stay frozen (and the longest the freeze itself may take to land). */
  boundMs: number;
  /** Where the freeze's marker file goes (root-only; made 0700). */
  markerDir: string;
}

export type FreezeOutcome<T> =
  | { value: T; frozen: true }
  /** The work ran (or went on) unfrozen: why, for people. */
  | { value: T; frozen: false; why: string };

/** What a marker file holds: which mount, which process (and its start time: pids are reused), since when, how long. */
export interface FreezeMarker {
  mountPoint: string;
  pid: number;
  /** The process's start time (/proc/<pid>/stat), so that another process with a reused pid is not taken for it. */
  startTime?: string;
  since: string;
  boundMs: number;
}

/**
 * Freezes the filesystem mounted at `mountPoint`, runs `fn`, and thaws it: at the latest `boundMs` after the freeze
 * was asked for (fn then goes on unfrozen, and the outcome says so). A freeze that fails or does not land within the
 * bound is thawed and fn runs unfrozen. Throws only when fn throws, or when a thaw fails (the marker then stays).
 */
export async function withFrozenFilesystem<T>(mountPoint: string, options: FreezeOptions, fn: () => Promise<T>): Promise<FreezeOutcome<T>> {
  const started = Date.now();
  const marker = await writeMarker(options.markerDir, mountPoint, options.boundMs);
  try {
    await run('fsfreeze', ['--freeze', mountPoint], { timeoutMs: options.boundMs });
  } catch (err) {
    const timedOut = err instanceof CommandError && err.timedOut;
    // It may have landed anyway, after its deadline: thaw whatever there is. When nothing was frozen yet and fsfreeze
    // timed out, it may still be stuck in the kernel and land later: its marker stays, and the leftover sweep (the
    // agent's, every interval, once the marker is past its bound) thaws it then.
    if ((await thawLeftover(mountPoint)) || !timedOut) await rm(marker, { force: true });
    const why = timedOut
      ? `the freeze did not take within ${options.boundMs / 1000} s (freezeSeconds)`
      : `the freeze failed (${err instanceof Error ? err.message : String(err)})`;
    return { value: await fn(), frozen: false, why };
  }
  let thawed: Promise<void> | undefined;
  const thawOnce = () => (thawed ??= thawLeftover(mountPoint).then(() => rm(marker, { force: true })));
  let overran = false;
  const remaining = Math.max(0, options.boundMs - (Date.now() - started));
  const timer = setTimeout(() => {
    overran = true;
    // The writers wait no longer than the bound; fn goes on against a live filesystem.
    thawOnce().catch(() => undefined);
  }, remaining);
  let value: T;
  try {
    value = await fn();
  } finally {
    clearTimeout(timer);
    await thawOnce();
  }
  if (overran)
    return { value, frozen: false, why: `the copy took longer than the ${options.boundMs / 1000} s a freeze may last (freezeSeconds)` };
  return { value, frozen: true };
}

/** Thaws the filesystem if it is frozen; returns whether it was. (Thawing one that is not frozen fails with EINVAL.) */
export async function thawLeftover(mountPoint: string): Promise<boolean> {
  try {
    await run('fsfreeze', ['--unfreeze', mountPoint], { timeoutMs: THAW_TIMEOUT_MS });
    return true;
  } catch (err) {
    if (err instanceof CommandError && err.exitCode !== undefined) return false;
    throw err;
  }
}

function markerPath(markerDir: string, mountPoint: string): string {
  return join(markerDir, `${sha256Hex(mountPoint).slice(0, 32)}${MARKER_SUFFIX}`);
}

async function writeMarker(markerDir: string, mountPoint: string, boundMs: number): Promise<string> {
  await mkdir(markerDir, { recursive: true, mode: 0o700 });
  const path = markerPath(markerDir, mountPoint);
  const startTime = processStartTime(process.pid);
  const marker: FreezeMarker = {
    mountPoint,
    pid: process.pid,
    ...(startTime !== undefined && { startTime }),
    since: new Date().toISOString(),
    boundMs,
  };
  await writeFile(path, `${JSON.stringify(marker)}\n`, { mode: 0o600 });
  return path;
}

/** A marker found in the marker directory, with whether it is a leftover (its process gone, or far past its bound). */
export interface FoundFreeze {
  file: string;
  marker: FreezeMarker;
  leftover: boolean;
  /** Why it is a leftover, for people. */
  why: string;
}

/** The freezes the marker directory records (an unreadable or malformed marker is reported as a leftover of its own). */
export async function recordedFreezes(markerDir: string, now = Date.now()): Promise<FoundFreeze[]> {
  const names = await readdir(markerDir).catch((err: NodeJS.ErrnoException) => {
    if (err.code === 'ENOENT') return [] as string[];
    throw err;
  });
  const found: FoundFreeze[] = [];
  for (const name of names.filter((n) => n.endsWith(MARKER_SUFFIX)).sort()) {
    const file = join(markerDir, name);
    const marker = parseMarker(await readFile(file, 'utf8').catch(() => ''));
    if (!marker) continue;
    const alive = processExists(marker.pid) && (marker.startTime === undefined || processStartTime(marker.pid) === marker.startTime);
    const age = now - Date.parse(marker.since);
    if (!alive) found.push({ file, marker, leftover: true, why: `process ${marker.pid} that froze it is gone` });
    else if (age > marker.boundMs + LEFTOVER_GRACE_MS)
      found.push({ file, marker, leftover: true, why: `process ${marker.pid} froze it ${Math.round(age / 1000)} s ago, past its bound` });
    else found.push({ file, marker, leftover: false, why: `process ${marker.pid} holds it (since ${marker.since})` });
  }
  return found;
}

function parseMarker(text: string): FreezeMarker | undefined {
  try {
    const m = JSON.parse(text) as Partial<FreezeMarker>;
    if (
      typeof m.mountPoint !== 'string' ||
      !isAbsolute(m.mountPoint) ||
      /[\0\n]/.test(m.mountPoint) ||
      !Number.isSafeInteger(m.pid) ||
      (m.pid as number) <= 0 ||
      typeof m.since !== 'string' ||
      !Number.isFinite(Date.parse(m.since)) ||
      typeof m.boundMs !== 'number'
    ) {
      return undefined;
    }
    return m as FreezeMarker;
  } catch {
    return undefined;
  }
}

/**
 * Thaws every leftover freeze the marker directory records (a process killed while it held a freeze, or one that
 * lost track of it), and removes its marker. Only a mount point that is mounted now is thawed (a marker of one that
 * is gone is just removed). Returns what it thawed or cleared.
 */
export async function thawLeftoverFreezes(
  markerDir: string,
  now = Date.now(),
): Promise<{ mountPoint: string; thawed: boolean; why: string }[]> {
  const done: { mountPoint: string; thawed: boolean; why: string }[] = [];
  const leftovers = (await recordedFreezes(markerDir, now)).filter((f) => f.leftover);
  if (leftovers.length === 0) return done;
  const mounted = new Set((await readMountInfo()).map((m) => m.mountPoint));
  for (const { file, marker, why } of leftovers) {
    const thawed = mounted.has(marker.mountPoint) ? await thawLeftover(marker.mountPoint) : false;
    await rm(file, { force: true });
    done.push({ mountPoint: marker.mountPoint, thawed, why });
  }
  return done;
}

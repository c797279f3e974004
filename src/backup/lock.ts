// One writer at a time per backup target, across nodes: `<target>/lock`, created whole by a hard link (atomic on
// local filesystems and on NFSv3+ and CephFS), holding who took it. Creating a backup, deleting one and collecting garbage
// take it; list, verify and restore only read and do not. Simple and correct: garbage collection can never remove a
// chunk that a backup in progress has just found present and skipped. The price: backups to one target run one
// after another.
//
// A holder that dies leaves the file behind. It is stale, and the next writer takes it over, when its holder is a
// process of this host that no longer exists, or when its holder has not touched it (a heartbeat every minute) for
// `staleAfterMs` (default 10 minutes), which covers a holder on a node that died.
//
// An S3 target's lock is the object `<prefix>lock`, with the same rules, made of conditional writes (s3-lock.ts);
// target-lock.ts takes the one or the other.
import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import { link, open, readFile, rename, stat, unlink, utimes } from 'node:fs/promises';
import { setTimeout as sleep } from 'node:timers/promises';
import { tempPathFor } from '../atomic-file.js';
import { LatchError } from '../errors.js';
import { processExists } from '../sys/processes.js';
import { describeTarget, lockPath, type BackupTarget, type DirTarget } from './layout.js';

export interface LockOptions {
  /** Who holds it, for people reading the lock file and error messages (the node name). */
  node?: string | undefined;
  /** How long to wait for another holder; default 60 s. */
  waitMs?: number | undefined;
  /** A lock untouched for this long is stale; default 10 minutes. */
  staleAfterMs?: number | undefined;
  /** How often the holder touches the lock; default 60 s. */
  heartbeatMs?: number | undefined;
}

export interface LockOwner {
  node?: string | undefined;
  host: string;
  pid: number;
  purpose: string;
  startedAt: string;
  token: string;
}

export interface HeldLock {
  /** Throws if another writer took the lock over (it thought us dead): nothing may be published then. */
  check(): Promise<void>;
}

export const DEFAULT_WAIT_MS = 60_000;
export const DEFAULT_STALE_MS = 10 * 60_000;
export const DEFAULT_HEARTBEAT_MS = 60_000;

/** Who is about to take a lock, counted as held by this process until `forgetOwner` (target-lock.ts). */
export function newOwner(purpose: string, options: LockOptions): LockOwner {
  const owner: LockOwner = {
    ...(options.node !== undefined && { node: options.node }),
    host: hostname(),
    pid: process.pid,
    purpose,
    startedAt: new Date().toISOString(),
    token: randomBytes(12).toString('hex'),
  };
  heldHere.add(owner.token);
  return owner;
}

export function forgetOwner(owner: LockOwner): void {
  heldHere.delete(owner.token);
}

// The tokens of the locks this process holds now: a lock of this process with another token is one it could not
// release (an S3 store that was down when it tried), and is stale at once, like a dead process's.
const heldHere = new Set<string>();

/** Whether a holder is a process of this host that no longer exists, or this process, done with it (stale at once). */
export function holderIsDeadHere(holder: LockOwner | undefined): boolean {
  if (holder === undefined || holder.host !== hostname()) return false;
  return holder.pid === process.pid ? !heldHere.has(holder.token) : !processExists(holder.pid);
}

/** A directory target's lock (above). */
export async function withDirLock<T>(
  target: DirTarget,
  owner: LockOwner,
  options: LockOptions,
  fn: (lock: HeldLock) => Promise<T>,
): Promise<T> {
  const path = lockPath(target);
  const waitMs = options.waitMs ?? DEFAULT_WAIT_MS;
  const staleAfterMs = options.staleAfterMs ?? DEFAULT_STALE_MS;
  const deadline = Date.now() + waitMs;
  for (let attempt = 0; !(await tryCreate(path, owner)); attempt++) {
    const holder = await readOwner(path);
    if (holder === 'gone') continue;
    if (await isStale(path, holder, staleAfterMs)) {
      await breakStale(path, holder);
      continue;
    }
    if (Date.now() >= deadline) throw busy(target, holder, staleAfterMs, `remove ${lockPath(target)}`);
    await sleep(Math.min(1000, 50 + attempt * 50));
  }

  let lost = false;
  const heartbeat = setInterval(() => {
    readOwner(path)
      .then((now) => {
        if (now === 'gone' || now === undefined || now.token !== owner.token) lost = true;
        else return utimes(path, new Date(), new Date());
      })
      // A share that does not answer now may answer at the next beat; check() before publishing decides.
      .catch(() => undefined);
  }, options.heartbeatMs ?? DEFAULT_HEARTBEAT_MS);
  heartbeat.unref();
  const held: HeldLock = {
    check: async () => {
      const now = await readOwner(path);
      if (lost || now === 'gone' || now === undefined || now.token !== owner.token) {
        throw new LatchError(
          `lost the lock of the backup target ${describeTarget(target)} (another writer took it over, thinking this one dead); nothing was published`,
        );
      }
    },
  };
  try {
    return await fn(held);
  } finally {
    clearInterval(heartbeat);
    const now = await readOwner(path).catch(() => undefined);
    if (now !== 'gone' && now?.token === owner.token) await unlink(path).catch(() => undefined);
  }
}

/**
 * Creates the lock with its contents already in it: written to a private temp file, fsynced, then hard-linked to the
 * lock's name (link fails with EEXIST like O_EXCL, atomically on local filesystems, NFS and CephFS). Created with
 * O_EXCL and then written, a writer SIGKILLed in between left an empty lock that nobody could read or take over for
 * 10 minutes (the agent's kill test hit it).
 */
async function tryCreate(path: string, owner: LockOwner): Promise<boolean> {
  const temp = tempPathFor(path);
  const handle = await open(temp, 'wx', 0o600);
  try {
    try {
      await handle.writeFile(`${JSON.stringify(owner)}\n`);
      await handle.sync();
    } finally {
      await handle.close();
    }
    await link(temp, path);
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'EEXIST') return false;
    throw err;
  } finally {
    await unlink(temp).catch(() => undefined);
  }
}

/** The holder; 'gone' when the file vanished meanwhile; undefined when it is unreadable (a holder mid-write, or junk). */
async function readOwner(path: string): Promise<LockOwner | 'gone' | undefined> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return 'gone';
    throw err;
  }
  try {
    const parsed = JSON.parse(text) as LockOwner;
    return typeof parsed.token === 'string' ? parsed : undefined;
  } catch {
    return undefined;
  }
}

async function isStale(path: string, holder: LockOwner | undefined, staleAfterMs: number): Promise<boolean> {
  if (holderIsDeadHere(holder)) return true;
  try {
    return Date.now() - (await stat(path)).mtimeMs > staleAfterMs;
  } catch {
    return false;
  }
}

/**
 * Moves a stale lock aside and removes it. Two writers may both find it stale: the rename lets one of them have the
 * file; if what it moved is not the stale lock it examined (the other already replaced it with a fresh one), it puts
 * that one back.
 */
async function breakStale(path: string, examined: LockOwner | undefined): Promise<void> {
  const aside = `${path}.stale.${randomBytes(6).toString('hex')}`;
  try {
    await rename(path, aside);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return;
    throw err;
  }
  const moved = await readOwner(aside).catch(() => undefined);
  const sameLock = moved !== 'gone' && (examined === undefined ? moved === undefined : moved?.token === examined.token);
  if (!sameLock) await link(aside, path).catch(() => undefined);
  await unlink(aside).catch(() => undefined);
}

/** `removal`: how a person removes the lock by hand ("remove PATH"). */
export function busy(target: BackupTarget, holder: LockOwner | undefined, staleAfterMs: number, removal: string): LatchError {
  const who = holder
    ? `${holder.purpose} on ${holder.node ? `node ${holder.node}` : `host ${holder.host}`} (pid ${holder.pid}, since ${holder.startedAt})`
    : 'a writer whose lock file cannot be read';
  return new LatchError(
    `the backup target ${describeTarget(target)} is busy: ${who}. Try again when it is done; a lock whose holder died is taken over ` +
      `by itself after ${Math.round(staleAfterMs / 60_000)} minutes without a heartbeat (or ${removal} once you are sure no latch process uses the target)`,
  );
}

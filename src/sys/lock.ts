// Host-wide locks between latch processes: a lock is the flock(2) of a file in LOCK_DIR, a directory only root may
// write. The kernel releases a flock when the holder exits, even on SIGKILL, so a killed call can never wedge it; and
// no other user can open the files, so none can hold a lock to stall latch (as any could bind the abstract unix socket
// names the locks used to be). The lock is taken by the native helper where it loads (a few system calls), else by a
// child, util-linux's flock(1), on a descriptor this process keeps open: a flock belongs to the open file, so it stays
// held when the child exits, until this process closes the descriptor or ends. Both exclude each other.
import { closeSync, constants, lstatSync, mkdirSync, openSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { LatchError, errorMessage } from '../errors.js';
import { sha256Hex } from '../hash.js';
import { nativeHelper } from './native.js';

/** Where the locks are (the native helper keeps its turns there too): under /var/lib/latch, which the agent's container shares. */
const LOCK_DIR = '/var/lib/latch/locks';

let lockDir = LOCK_DIR;

/** For tests: the lock directory to use, or LOCK_DIR again (undefined). */
export function useLockDir(dir: string | undefined): void {
  lockDir = dir ?? LOCK_DIR;
}

/**
 * Runs `fn` while holding the host-wide lock named by `parts` (hashed into the file's name); waits up to `waitMs`
 * for another holder to finish, then throws `busyMessage()`.
 */
export async function withHostLock<T>(parts: string[], waitMs: number, busyMessage: () => string, fn: () => Promise<T>): Promise<T> {
  const name = `latch-volume-${sha256Hex(parts.join('\0')).slice(0, 40)}`;
  let fd: number | undefined;
  try {
    fd = nativeHelper() ? await pollHelper(name, waitMs) : await flockByChild(name, waitMs);
  } catch (err) {
    throw new LatchError(`cannot take the node-local volume lock: ${errorMessage(err)}`, { cause: err });
  }
  if (fd === undefined) throw new LatchError(busyMessage());
  try {
    return await fn();
  } finally {
    closeSync(fd);
  }
}

/** The lock's descriptor, taken by the helper (which never waits: tried again until the deadline); undefined when busy. */
async function pollHelper(name: string, waitMs: number): Promise<number | undefined> {
  const helper = nativeHelper();
  const deadline = Date.now() + waitMs;
  for (let attempt = 0; helper; attempt++) {
    const fd = helper.lockFile(lockDir, name);
    if (fd >= 0) return fd;
    if (Date.now() >= deadline) return undefined;
    await sleep(Math.min(200, 10 + attempt * 10));
  }
  return undefined;
}

/** flock(1)'s exit code when the lock stayed busy to its deadline (-E): not 1, which is also some of its errors'. */
const FLOCK_BUSY = 75;

/**
 * The lock's descriptor, taken without the helper: util-linux's flock(1) locks the descriptor it is given as its stdin
 * (the open file this process shares with it), waiting up to waitMs; undefined when busy.
 */
async function flockByChild(name: string, waitMs: number): Promise<number | undefined> {
  checkLockDir(lockDir);
  const fd = openSync(join(lockDir, name), constants.O_RDWR | constants.O_CREAT | constants.O_NOFOLLOW | constants.O_NOCTTY, 0o600);
  try {
    const { run } = await import('./run.js');
    const wait = waitMs > 0 ? ['-w', (waitMs / 1000).toFixed(3)] : ['-n'];
    const { exitCode } = await run('flock', ['-E', String(FLOCK_BUSY), ...wait, '0'], {
      stdinFd: fd,
      timeoutMs: waitMs + 10_000,
      okExitCodes: [FLOCK_BUSY],
    });
    if (exitCode === 0) return fd;
  } catch (err) {
    closeSync(fd);
    throw err;
  }
  closeSync(fd);
  return undefined;
}

/**
 * Creates the lock directory (0700) when missing, and refuses it when it is a symbolic link, not a directory, owned by
 * another user than root or this process's, or writable by its group or others: whoever could write it could hold
 * every lock. The native helper checks the same (openLockDir in src/native/helper.c).
 */
function checkLockDir(dir: string): void {
  mkdirSync(dirname(dir), { recursive: true, mode: 0o755 });
  try {
    mkdirSync(dir, { mode: 0o700 });
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
  }
  const status = lstatSync(dir);
  const refusal = status.isSymbolicLink()
    ? 'is a symbolic link'
    : !status.isDirectory()
      ? 'is not a directory'
      : status.uid !== 0 && status.uid !== process.geteuid?.()
        ? 'is owned by another user'
        : status.mode & 0o022
          ? 'is writable by its group or others'
          : undefined;
  if (refusal) throw new Error(`the lock directory ${dir} ${refusal}: refused`);
}

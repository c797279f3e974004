// fsfreeze: a mounted filesystem flushed and held still, so that a snapshot of its device is consistent.
//
// A frozen filesystem blocks every writer until it is thawed, and the kernel does not thaw it when the process that
// froze it dies. So the freeze lasts only as long as the point-in-time copy (a reflink or the storage's own
// snapshot), the thaw runs in `finally` with its own deadline, and `thawLeftover` lets the next snapshot of the
// volume (under the node's volume lock) thaw what a killed one left frozen. By hand: `fsfreeze --unfreeze MOUNTPOINT`.
import { CommandError, run } from './run.js';

const FREEZE_TIMEOUT_MS = 60_000;
const THAW_TIMEOUT_MS = 30_000;

/** Freezes the filesystem mounted at `mountPoint`, runs `fn`, and always thaws it. */
export async function withFrozenFilesystem<T>(mountPoint: string, fn: () => Promise<T>): Promise<T> {
  await run('fsfreeze', ['--freeze', mountPoint], { timeoutMs: FREEZE_TIMEOUT_MS });
  try {
    return await fn();
  } finally {
    await run('fsfreeze', ['--unfreeze', mountPoint], { timeoutMs: THAW_TIMEOUT_MS });
  }
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

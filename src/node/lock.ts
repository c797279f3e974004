// A node-local lock per volume, so that mount, unmount and resizing calls for one volume on one node (kubelet runs
// them for different pods in parallel) never interleave. The lock is the flock of a file in a root-only directory
// (sys/lock.ts): the kernel frees it when the holder exits, even on SIGKILL, so a killed call can never wedge it, and no
// other user can hold it.
import type { Config } from '../config.js';
import { withHostLock } from '../sys/lock.js';

const LOCK_WAIT_MS = 4 * 60 * 1000;

/** Runs `fn` while holding this node's lock on the volume; waits up to `waitMs` for another holder to finish. */
export async function withVolumeLock<T>(
  config: Pick<Config, 'stateDir' | 'nodeName'>,
  name: string,
  fn: () => Promise<T>,
  waitMs = LOCK_WAIT_MS,
): Promise<T> {
  return withHostLock(
    [config.stateDir, config.nodeName, name],
    waitMs,
    () =>
      `another latch call has been working on volume ${name} on node ${config.nodeName} for over ${Math.round(waitMs / 1000)} s; try again`,
    fn,
  );
}

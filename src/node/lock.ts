// A node-local lock per volume, so that mount, unmount and resizing calls for one volume on one node (kubelet runs
// them for different pods in parallel) never interleave. The lock is an abstract unix socket name: the kernel frees
// it when the holder exits, even on SIGKILL, so a killed call can never wedge it.
import { createHash } from 'node:crypto';
import { createServer, type Server } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Config } from '../config.js';
import { LatchError, errorMessage } from '../errors.js';

const LOCK_WAIT_MS = 4 * 60 * 1000;

/** Runs `fn` while holding this node's lock on the volume; waits up to `waitMs` for another holder to finish. */
export async function withVolumeLock<T>(
  config: Pick<Config, 'stateDir' | 'nodeName'>,
  name: string,
  fn: () => Promise<T>,
  waitMs = LOCK_WAIT_MS,
): Promise<T> {
  const key = createHash('sha256').update(`${config.stateDir}\0${config.nodeName}\0${name}`).digest('hex').slice(0, 40);
  const address = `\0latch-volume-${key}`;
  const deadline = Date.now() + waitMs;
  let server: Server | undefined;
  for (let attempt = 0; ; attempt++) {
    server = await tryListen(address);
    if (server) break;
    if (Date.now() >= deadline) {
      throw new LatchError(
        `another latch call has been working on volume ${name} on node ${config.nodeName} for over ${Math.round(waitMs / 1000)} s; try again`,
      );
    }
    await sleep(Math.min(200, 10 + attempt * 10));
  }
  try {
    return await fn();
  } finally {
    server.close();
  }
}

function tryListen(address: string): Promise<Server | undefined> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', (err: NodeJS.ErrnoException) => {
      if (err.code === 'EADDRINUSE') resolve(undefined);
      else reject(new LatchError(`cannot take the node-local volume lock: ${errorMessage(err)}`, { cause: err }));
    });
    server.listen({ path: address }, () => {
      server.unref();
      resolve(server);
    });
  });
}

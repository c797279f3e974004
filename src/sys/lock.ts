// Host-wide locks between latch processes: a lock is an abstract unix socket name that one process listens on. The
// kernel frees it when the holder exits, even on SIGKILL, so a killed call can never wedge it, and nothing is left
// in the filesystem.
import { createServer, type Server } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { LatchError, errorMessage } from '../errors.js';
import { sha256Hex } from '../hash.js';

/**
 * Runs `fn` while holding the host-wide lock named by `parts` (hashed into the socket name); waits up to `waitMs`
 * for another holder to finish, then throws `busyMessage()`.
 */
export async function withHostLock<T>(parts: string[], waitMs: number, busyMessage: () => string, fn: () => Promise<T>): Promise<T> {
  const key = sha256Hex(parts.join('\0')).slice(0, 40);
  const address = `\0latch-volume-${key}`;
  const deadline = Date.now() + waitMs;
  let server: Server | undefined;
  for (let attempt = 0; ; attempt++) {
    server = await tryListen(address);
    if (server) break;
    if (Date.now() >= deadline) throw new LatchError(busyMessage());
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

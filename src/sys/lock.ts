// Host-wide locks between latch processes: a lock is an abstract unix socket name that one process has bound. The
// kernel frees it when the holder exits, even on SIGKILL, so a killed call can never wedge it, and nothing is left
// in the filesystem. The name is bound by the native helper where it loads (two system calls), else by a node:net
// server listening on it (about 10 ms of a call: loading node:net and its cluster support); both bind the same
// address, so processes of either kind exclude each other.
import { closeSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { LatchError, errorMessage } from '../errors.js';
import { sha256Hex } from '../hash.js';
import { nativeHelper } from './native.js';

/**
 * Runs `fn` while holding the host-wide lock named by `parts` (hashed into the socket name); waits up to `waitMs`
 * for another holder to finish, then throws `busyMessage()`.
 */
export async function withHostLock<T>(parts: string[], waitMs: number, busyMessage: () => string, fn: () => Promise<T>): Promise<T> {
  const name = `latch-volume-${sha256Hex(parts.join('\0')).slice(0, 40)}`;
  const deadline = Date.now() + waitMs;
  let release: (() => void) | undefined;
  for (let attempt = 0; ; attempt++) {
    release = await tryHold(name);
    if (release) break;
    if (Date.now() >= deadline) throw new LatchError(busyMessage());
    await sleep(Math.min(200, 10 + attempt * 10));
  }
  try {
    return await fn();
  } finally {
    release();
  }
}

/** Takes the name if nobody holds it: what releases it, or undefined when another process holds it. */
async function tryHold(name: string): Promise<(() => void) | undefined> {
  const helper = nativeHelper();
  if (helper) {
    let fd: number;
    try {
      fd = helper.holdName(name);
    } catch (err) {
      throw new LatchError(`cannot take the node-local volume lock: ${errorMessage(err)}`, { cause: err });
    }
    return fd < 0 ? undefined : () => closeSync(fd);
  }
  const server = await tryListen(`\0${name}`);
  return server && (() => server.close());
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

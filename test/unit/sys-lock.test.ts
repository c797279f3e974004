// Host-wide locks (src/sys/lock.ts), taken through the native helper (a driver's way) and through node:net: each way
// excludes a second holder, processes of the other way too (the same abstract name), and frees the name after.
import assert from 'node:assert/strict';
import { createServer } from 'node:net';
import { after, before, describe, it } from 'node:test';
import { useNativeHelper } from '../../src/sys/native.js';
import { withHostLock } from '../../src/sys/lock.js';
import { sha256Hex } from '../../src/hash.js';
import { helperWays } from '../fixtures/native-helper.js';

/** The abstract address of the lock named by `parts`, as node:net writes it (lock.ts hashes the parts into it). */
function lockAddress(parts: string[]): string {
  return `\0latch-volume-${sha256Hex(parts.join('\0')).slice(0, 40)}`;
}

/** What node:net makes of the lock's name: whether a server can listen on it now (and lets it go at once). */
async function netCanTake(parts: string[]): Promise<boolean> {
  const address = lockAddress(parts);
  const server = createServer();
  return new Promise((resolvePromise, reject) => {
    server.once('error', (err: NodeJS.ErrnoException) => (err.code === 'EADDRINUSE' ? resolvePromise(false) : reject(err)));
    server.listen({ path: address }, () => server.close(() => resolvePromise(true)));
  });
}

const busy = () => 'busy';

for (const way of helperWays('node:net')) {
  describe(`host locks, through ${way.name}`, { skip: way.skip }, () => {
    before(() => useNativeHelper(way.helper));
    after(() => useNativeHelper(undefined));

    it('a second taker waits, and gives up at its deadline; the name is free after the holder', async () => {
      const parts = ['lock-test', String(process.pid), way.name];
      let second: string | undefined;
      const first = await withHostLock(parts, 1_000, busy, async () => {
        assert.equal(await netCanTake(parts), false, 'node:net cannot take a held name');
        await assert.rejects(
          withHostLock(parts, 100, busy, async () => (second = 'ran')),
          /^LatchError: busy$/,
        );
        return 'held';
      });
      assert.equal(first, 'held');
      assert.equal(second, undefined);
      assert.equal(await netCanTake(parts), true, 'released');
      assert.equal(await withHostLock(parts, 100, busy, async () => 'again'), 'again');
    });

    it('a name node:net holds (a process of the other kind) is not taken until it is let go', async () => {
      const parts = ['lock-test-other', String(process.pid), way.name];
      const address = lockAddress(parts);
      const holder = createServer();
      await new Promise<void>((done) => holder.listen({ path: address }, done));
      setTimeout(() => holder.close(), 300);
      const started = Date.now();
      assert.equal(await withHostLock(parts, 5_000, busy, async () => 'taken'), 'taken');
      assert.ok(Date.now() - started >= 250, 'waited for the holder');
    });

    it('the holder is released when its work throws', async () => {
      const parts = ['lock-test-throw', String(process.pid), way.name];
      await assert.rejects(
        withHostLock(parts, 100, busy, async () => {
          throw new Error('work failed');
        }),
        /work failed/,
      );
      assert.equal(await netCanTake(parts), true);
    });
  });
}

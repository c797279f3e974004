// Host-wide locks (src/sys/lock.ts), taken through the native helper (a driver's way) and through util-linux's flock(1)
// (without it): each way excludes a second holder, a holder of the other way too (the same file's flock), frees the
// lock after, and refuses a lock directory that others could write or that is a link. A local user who holds the names
// the locks used to be (abstract unix sockets) or tries to hold the files delays no lock.
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { chmodSync, chownSync, mkdirSync, mkdtempSync, rmSync, statSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { useNativeHelper } from '../../src/sys/native.js';
import { useLockDir, withHostLock } from '../../src/sys/lock.js';
import { sha256Hex } from '../../src/hash.js';
import { LOCK_DIR, NOBODY, helperWays } from '../fixtures/native-helper.js';
import { trackChild } from '../fixtures/tracked-children.js';

/** The file name of the lock named by `parts` (lock.ts hashes the parts into it). */
function lockName(parts: string[]): string {
  return `latch-volume-${sha256Hex(parts.join('\0')).slice(0, 40)}`;
}

/** Whether flock(1), a process of neither way, can take the lock now (and lets it go at once). */
function canTake(dir: string, parts: string[]): boolean {
  return spawnSync('flock', ['-n', join(dir, lockName(parts)), 'true']).status === 0;
}

const busy = () => 'busy';

for (const way of helperWays('flock(1)')) {
  describe(`host locks, through ${way.name}`, { skip: way.skip }, () => {
    let dir: string;
    before(() => {
      useNativeHelper(way.helper);
      dir = join(mkdtempSync(join(tmpdir(), 'latch-locks-')), 'locks');
      useLockDir(dir);
    });
    after(() => {
      useNativeHelper(undefined);
      useLockDir(undefined);
      rmSync(dirname(dir), { recursive: true, force: true });
    });

    it('a second taker waits, and gives up at its deadline; the lock is free after the holder', async () => {
      const parts = ['lock-test', String(process.pid), way.name];
      let second: string | undefined;
      const first = await withHostLock(parts, 1_000, busy, async () => {
        assert.equal(statSync(dir).mode & 0o777, 0o700, 'the directory is made root-only');
        assert.equal(canTake(dir, parts), false, 'another process cannot take a held lock');
        const started = Date.now();
        await assert.rejects(
          withHostLock(parts, 300, busy, async () => (second = 'ran')),
          /^LatchError: busy$/,
        );
        assert.ok(Date.now() - started >= 250, 'waited to its deadline');
        return 'held';
      });
      assert.equal(first, 'held');
      assert.equal(second, undefined);
      assert.equal(canTake(dir, parts), true, 'released');
      assert.equal(await withHostLock(parts, 100, busy, async () => 'again'), 'again');
    });

    it('a lock another process holds is not taken until it is let go', async () => {
      const parts = ['lock-test-other', String(process.pid), way.name];
      const holder = spawn('flock', [join(dir, lockName(parts)), 'sleep', '0.3']);
      trackChild(holder);
      for (let i = 0; i < 100 && canTake(dir, parts); i++) await new Promise((done) => setTimeout(done, 10));
      const started = Date.now();
      assert.equal(await withHostLock(parts, 5_000, busy, async () => 'taken'), 'taken');
      assert.ok(Date.now() - started >= 100, 'waited for the holder');
    });

    it('the holder is released when its work throws', async () => {
      const parts = ['lock-test-throw', String(process.pid), way.name];
      await assert.rejects(
        withHostLock(parts, 100, busy, async () => {
          throw new Error('work failed');
        }),
        /work failed/,
      );
      assert.equal(canTake(dir, parts), true);
    });

    it('refuses a lock directory that is a link, writable by others, or owned by another user', async () => {
      const parent = dirname(dir);
      const cases: [string, () => void, RegExp][] = [
        [join(parent, 'link'), () => symlinkSync(dir, join(parent, 'link')), /is a symbolic link: refused/],
        [
          join(parent, 'open'),
          () => (mkdirSync(join(parent, 'open')), chmodSync(join(parent, 'open'), 0o777)),
          /writable by its group or others: refused/,
        ],
        [
          join(parent, 'nobodys'),
          () => (mkdirSync(join(parent, 'nobodys'), 0o700), chownSync(join(parent, 'nobodys'), 65534, 65534)),
          /owned by another user: refused/,
        ],
        [join(parent, 'file'), () => spawnSync('touch', [join(parent, 'file')]), /is not a directory: refused/],
      ];
      for (const [where, make, refusal] of cases) {
        make();
        useLockDir(where);
        try {
          let ran = false;
          await assert.rejects(
            withHostLock(['refused', way.name], 100, busy, async () => (ran = true)),
            (err: Error) => err.message.startsWith('cannot take the node-local volume lock: ') && refusal.test(err.message),
            where,
          );
          assert.equal(ran, false);
        } finally {
          useLockDir(dir);
        }
      }
    });

    describe('a local user (nobody)', () => {
      const volume = ['/var/lib/latch/state', 'node-a', `pv-nobody-${process.pid}`];
      const agent = ['/var/lib/latch/state', 'node-a', '', 'agent'];
      before(() => useLockDir(undefined));
      after(() => useLockDir(dir));

      it('who holds the names the locks used to be, and tries to hold their files, delays neither a volume lock nor the agent lock', async () => {
        // The names as the locks bound them (node:net's abstract names), bound by nobody, who then tries flock(1) on
        // the files of the same locks and stays.
        const script = `
          const net = require('node:net');
          const { spawnSync } = require('node:child_process');
          const names = ${JSON.stringify([volume, agent].map(lockName))};
          Promise.all(names.map((n) => new Promise((done) => net.createServer().listen({ path: '\\0' + n }, done)))).then(() => {
            const opened = names.map((n) => spawnSync('flock', ['-n', ${JSON.stringify(LOCK_DIR)} + '/' + n, 'true']).status);
            console.log(JSON.stringify(opened));
          });`;
        // The host's directory, made by a lock as a call would.
        await withHostLock(['lock-test-nobody', String(process.pid)], 100, busy, async () => undefined);
        const squatter = spawn(NOBODY[0] ?? 'setpriv', [...NOBODY.slice(1), process.execPath, '-e', script], {
          stdio: ['ignore', 'pipe', 'inherit'],
        });
        trackChild(squatter);
        try {
          const opened = await new Promise<number[]>((done, fail) => {
            squatter.stdout.once('data', (chunk: Buffer) => done(JSON.parse(chunk.toString()) as number[]));
            squatter.once('exit', (code) => fail(new Error(`the squatter exited (${code})`)));
          });
          assert.ok(
            opened.every((status) => typeof status === 'number' && status !== 0),
            `nobody took a lock's file: ${JSON.stringify(opened)}`,
          );
          for (const [parts, waitMs] of [
            [volume, 240_000],
            [agent, 0],
          ] as const) {
            const started = Date.now();
            assert.equal(await withHostLock([...parts], waitMs, busy, async () => 'taken'), 'taken');
            assert.ok(Date.now() - started < 1_000, `${parts.join(' ')}: waited ${Date.now() - started} ms`);
          }
        } finally {
          squatter.kill('SIGKILL');
        }
      });
    });
  });
}

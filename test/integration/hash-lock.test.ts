// A host lock under the name an earlier build computed with node:crypto still excludes: held by flock(1), a child
// process. The temp names and tags are in test/integration/atomic-file.test.ts.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { test } from 'node:test';
import { useLockDir, withHostLock } from '../../src/sys/lock.js';
import { trackChild } from '../fixtures/tracked-children.js';

test('a host lock held under the name an earlier build computed with node:crypto still excludes (rolling upgrade)', async () => {
  const parts = ['volume', `hash-test-${process.pid}`];
  const oldName = `latch-volume-${createHash('sha256').update(parts.join('\0')).digest('hex').slice(0, 40)}`;
  const dir = join(mkdtempSync(join(tmpdir(), 'latch-hash-')), 'locks');
  useLockDir(dir);
  // The lock's file, held by another process (flock(1)) until the test lets it go.
  await withHostLock(
    ['make the directory'],
    0,
    () => 'busy',
    async () => undefined,
  );
  const holder = spawn('flock', [join(dir, oldName), 'cat'], { stdio: ['pipe', 'ignore', 'ignore'] });
  trackChild(holder);
  try {
    while (spawnSync('flock', ['-n', join(dir, oldName), 'true']).status === 0) await new Promise((done) => setTimeout(done, 10));
    let ran = false;
    await assert.rejects(
      withHostLock(
        parts,
        150,
        () => 'busy',
        async () => {
          ran = true;
        },
      ),
      /busy/,
    );
    assert.equal(ran, false);
  } finally {
    holder.stdin.end();
    await new Promise((done) => holder.once('exit', done));
  }
  // Once it is free, the same parts take it.
  assert.equal(
    await withHostLock(
      parts,
      150,
      () => 'busy',
      async () => 'taken',
    ),
    'taken',
  );
  useLockDir(undefined);
  rmSync(dirname(dir), { recursive: true, force: true });
});

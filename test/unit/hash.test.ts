import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { test } from 'node:test';
import { tempTag } from '../../src/hash.js';
import { useLockDir, withHostLock } from '../../src/sys/lock.js';
import { trackChild } from '../fixtures/tracked-children.js';

test('temp tags are eight hex digits, and different from one call to the next', () => {
  const tags = Array.from({ length: 200 }, () => tempTag());
  for (const tag of tags) assert.match(tag, /^[0-9a-f]{8}$/);
  // 200 draws from 2^32: a repeat would mean the tag is not random.
  assert.equal(new Set(tags).size, tags.length);
  // Every digit position varies (a tag that is not padded or is cut short would fix some).
  for (let i = 0; i < 8; i++) assert.ok(new Set(tags.map((t) => t[i])).size > 4, `digit ${i} hardly varies`);
});

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

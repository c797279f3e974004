// The file store's directories and files get their modes whatever the umask (root: with umask 0277 the store makes
// its directories in ones it cannot write to as another user). The rest of the file store is in
// test/unit/store-file.test.ts.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import * as fs from 'node:fs/promises';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { FileStore } from '../../src/store/file.js';

let base: string;
let n = 0;
/** A fresh, not yet existing state directory below the suite's temp dir. */
function stateDir(): string {
  return join(base, `state-${++n}`);
}

before(() => {
  base = mkdtempSync(join(tmpdir(), 'latch-store-file-'));
});
after(() => {
  rmSync(base, { recursive: true, force: true });
});

async function exists(path: string): Promise<boolean> {
  return fs.stat(path).then(
    () => true,
    () => false,
  );
}

describe('file store: files on disk', () => {
  it('creates directories 0700 and files 0600 whatever the umask, and only on the first write', async () => {
    const root = join(stateDir(), 'deeper', 'state');
    const s = new FileStore(root);
    assert.equal(await s.get('volumes/a'), undefined);
    assert.deepEqual(await s.list('volumes'), []);
    await s.delete('volumes/a', 0);
    assert.equal(await exists(join(root, '..', '..')), false, 'get/list/delete must not create directories');

    const old = process.umask(0o277);
    try {
      await s.put('volumes/a', 1, 0);
      await s.put('volumes/a', 2, 1);
      await s.put('pvs/b', 2, 0);
    } finally {
      process.umask(old);
    }
    for (const d of [
      join(root, '..', '..'),
      join(root, '..'),
      root,
      join(root, 'volumes'),
      join(root, 'volumes', 'a'),
      join(root, 'pvs', 'b'),
    ]) {
      const st = await fs.stat(d);
      assert.ok(st.isDirectory());
      assert.equal((st.mode & 0o777).toString(8), '700', d);
    }
    for (const f of ['volumes/a/1.json', 'volumes/a/2.json', 'pvs/b/1.json']) {
      assert.equal(((await fs.stat(join(root, f))).mode & 0o777).toString(8), '600', f);
    }
  });
});

import { after, afterEach, before, beforeEach, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import assert from 'node:assert/strict';
import * as fs from 'node:fs/promises';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { FileStore, STALE_TEMP_MS, type FileStoreFs } from '../../src/store/file.js';
import { openStore } from '../../src/store/index.js';
import { parseConfig } from '../../src/config.js';
import { ConflictError, DamagedDocumentError, LatchError, StoreError } from '../../src/errors.js';

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

async function revisionFiles(dir: string): Promise<string[]> {
  return (await fs.readdir(dir)).filter((f) => /^\d+\.json$/.test(f)).sort((a, b) => parseInt(a) - parseInt(b));
}

async function exists(path: string): Promise<boolean> {
  return fs.stat(path).then(
    () => true,
    () => false,
  );
}

/** An fs for the store that records [call, path] for every call. */
function countingFs(calls: Array<[string, string]>): FileStoreFs {
  const wrap = <K extends keyof FileStoreFs>(name: K): FileStoreFs[K] =>
    ((...args: unknown[]) => {
      calls.push([name, String(args[0])]);
      return (fs[name] as (...a: unknown[]) => unknown)(...args);
    }) as FileStoreFs[K];
  return {
    open: wrap('open'),
    readdir: wrap('readdir'),
    readFile: wrap('readFile'),
    link: wrap('link'),
    unlink: wrap('unlink'),
    mkdir: wrap('mkdir'),
    chmod: wrap('chmod'),
    lstat: wrap('lstat'),
  };
}

describe('file store: semantics', () => {
  it('put, get, delete and list', async () => {
    const s = new FileStore(stateDir());
    assert.equal(s.kind, 'file');
    assert.equal(await s.get('volumes/a'), undefined);
    assert.deepEqual(await s.list('volumes'), []);

    assert.equal(await s.put('volumes/a', { size: 1, tags: ['x'] }, 0), 1);
    assert.deepEqual(await s.get('volumes/a'), { value: { size: 1, tags: ['x'] }, revision: 1 });
    assert.equal(await s.put('volumes/a', { size: 2 }, 1), 2);
    assert.deepEqual(await s.get('volumes/a'), { value: { size: 2 }, revision: 2 });
    assert.equal(await s.put('volumes/b', null, 0), 1);
    assert.deepEqual(await s.get('volumes/b'), { value: null, revision: 1 });
    assert.equal(await s.put('pvs/a', 'x', 0), 1);
    assert.deepEqual(await s.list('volumes'), ['a', 'b']);
    assert.deepEqual(await s.list('pvs'), ['a']);
    assert.deepEqual(await s.list('tickets'), []);
    // Strays in a kind directory are not keys.
    await fs.writeFile(join(s.root, 'volumes', 'c'), 'an editor backup');
    await fs.mkdir(join(s.root, 'volumes', 'Not-A-Key'));
    assert.deepEqual(await s.list('volumes'), ['a', 'b']);

    await s.delete('volumes/a', 2);
    assert.equal(await s.get('volumes/a'), undefined);
    assert.deepEqual(await s.list('volumes'), ['b']);
    // Deleting a missing (or deleted) key with 0 is a no-op.
    await s.delete('volumes/a', 0);
    await s.delete('volumes/never', 0);
    assert.equal(await exists(join(s.root, 'volumes', 'never')), false);
  });

  it('re-creating a deleted key continues the revisions (no ABA)', async () => {
    const s = new FileStore(stateDir());
    assert.equal(await s.put('volumes/a', 1, 0), 1);
    await s.delete('volumes/a', 1); // tombstone is revision 2
    // The tombstone's revision is not a valid "expected": the key does not exist.
    await assert.rejects(s.put('volumes/a', 2, 2), ConflictError);
    await assert.rejects(s.put('volumes/a', 2, 1), ConflictError);
    assert.equal(await s.put('volumes/a', 2, 0), 3);
    assert.deepEqual(await s.get('volumes/a'), { value: 2, revision: 3 });
    await s.delete('volumes/a', 3);
    assert.equal(await s.put('volumes/a', 3, 0), 5);
    assert.deepEqual(await s.list('volumes'), ['a']);
  });

  it('rejects a stale expected revision with ConflictError', async () => {
    const s = new FileStore(stateDir());
    await assert.rejects(s.put('volumes/a', 1, 1), ConflictError); // does not exist
    await s.put('volumes/a', 1, 0);
    await s.put('volumes/a', 2, 1);
    await assert.rejects(s.put('volumes/a', 3, 0), ConflictError); // exists
    await assert.rejects(s.put('volumes/a', 3, 1), ConflictError); // stale
    await assert.rejects(s.put('volumes/a', 3, 7), ConflictError); // from the future
    await assert.rejects(s.delete('volumes/a', 1), ConflictError);
    await assert.rejects(s.delete('volumes/a', 0), ConflictError);
    assert.deepEqual(await s.get('volumes/a'), { value: 2, revision: 2 });
    // A conflict leaves no temp file behind.
    assert.deepEqual(
      (await fs.readdir(join(s.root, 'volumes', 'a'))).filter((f) => f.startsWith('.tmp-')),
      [],
    );
  });

  it('of racing puts with the same expected revision exactly one wins', async () => {
    const dir = stateDir();
    const stores = Array.from({ length: 6 }, () => new FileStore(dir));
    let expected = 0;
    for (let round = 0; round < 25; round++) {
      const results = await Promise.allSettled(stores.map((s, i) => s.put('volumes/race', { round, i }, expected)));
      const won = results.flatMap((r, i) => (r.status === 'fulfilled' ? [{ i, revision: r.value }] : []));
      assert.equal(won.length, 1, `round ${round}: ${won.length} winners`);
      for (const r of results) {
        if (r.status === 'rejected') assert.ok(r.reason instanceof ConflictError, String(r.reason));
      }
      assert.equal(won[0]!.revision, expected + 1);
      assert.deepEqual(await stores[0]!.get('volumes/race'), { value: { round, i: won[0]!.i }, revision: expected + 1 });
      expected += 1;
    }
  });

  it('a writer that stalls between reading and linking cannot resurrect a collected revision', async () => {
    const dir = stateDir();
    const fast = new FileStore(dir);
    await fast.put('volumes/a', 'v1', 0);

    let paused!: () => void;
    const reachedLink = new Promise<void>((r) => (paused = r));
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const slowFs: FileStoreFs = {
      ...countingFs([]),
      link: async (from, to) => {
        paused();
        await gate;
        return fs.link(from, to);
      },
    };
    const slow = new FileStore(dir, { fs: slowFs });
    const slowPut = slow.put('volumes/a', 'stale', 1); // read revision 1, now wants to link 2.json
    await reachedLink;
    // Meanwhile others move on far enough that revision 2 would be collected under the plain scheme.
    assert.equal(await fast.put('volumes/a', 'v2', 1), 2);
    assert.equal(await fast.put('volumes/a', 'v3', 2), 3);
    assert.equal(await fast.put('volumes/a', 'v4', 3), 4);
    release();
    await assert.rejects(slowPut, ConflictError);
    assert.deepEqual(await fast.get('volumes/a'), { value: 'v4', revision: 4 });
    // Once nobody is mid-write, collection catches up and keeps the newest two.
    assert.equal(await fast.put('volumes/a', 'v5', 4), 5);
    assert.deepEqual(await revisionFiles(join(dir, 'volumes', 'a')), ['4.json', '5.json']);
  });

  it('keeps only the newest two revision files', async () => {
    const s = new FileStore(stateDir());
    for (let i = 0; i < 10; i++) await s.put('volumes/a', i, i);
    const dir = join(s.root, 'volumes', 'a');
    assert.deepEqual(await revisionFiles(dir), ['9.json', '10.json']);
    await s.delete('volumes/a', 10);
    assert.deepEqual(await revisionFiles(dir), ['10.json', '11.json']);
    assert.deepEqual(await fs.readdir(dir).then((f) => f.filter((x) => x.startsWith('.'))), []);
  });

  it('a new instance on the same directory sees exactly what the last one wrote', async () => {
    const dir = stateDir();
    const first = new FileStore(dir);
    await first.put('volumes/a', { n: 1 }, 0);
    await first.put('volumes/a', { n: 2 }, 1);
    await first.put('volumes/b', { n: 1 }, 0);
    await first.delete('volumes/b', 1);
    await first.put('pvs/p', ['x'], 0);
    await first.close();

    const second = new FileStore(dir);
    assert.deepEqual(await second.get('volumes/a'), { value: { n: 2 }, revision: 2 });
    assert.equal(await second.get('volumes/b'), undefined);
    assert.deepEqual(await second.get('pvs/p'), { value: ['x'], revision: 1 });
    assert.deepEqual(await second.list('volumes'), ['a']);
    await assert.rejects(second.put('volumes/a', { n: 3 }, 1), ConflictError);
    assert.equal(await second.put('volumes/b', { n: 2 }, 0), 3);
    assert.deepEqual(await new FileStore(dir).get('volumes/b'), { value: { n: 2 }, revision: 3 });
  });

  it('rejects bad arguments as LatchError, not as a retryable StoreError', async () => {
    const s = new FileStore(stateDir());
    for (const rev of [-1, 1.5, NaN, Infinity]) {
      await assert.rejects(s.put('volumes/a', 1, rev), (e) => e instanceof LatchError && !(e instanceof StoreError));
    }
    await assert.rejects(s.put('volumes/a', undefined, 0), (e) => e instanceof LatchError && !(e instanceof StoreError));
    await assert.rejects(s.put('volumes/a', 10n, 0), (e) => e instanceof LatchError && !(e instanceof StoreError));
    assert.equal(await exists(s.root), false);
  });
});

describe('file store: keys', () => {
  const bad = [
    'volumes/../x',
    'volumes/a/b',
    '',
    'volumes/',
    '/volumes/a',
    'Volumes/a',
    'volumes/A',
    'volumes/a..b',
    '../a',
    'volumes/.a',
    'a',
  ];
  it('rejects invalid keys in every call and touches nothing', async () => {
    const s = new FileStore(stateDir());
    for (const key of bad) {
      await assert.rejects(s.get(key), /invalid store key/, `get ${JSON.stringify(key)}`);
      await assert.rejects(s.put(key, 1, 0), /invalid store key/, `put ${JSON.stringify(key)}`);
      await assert.rejects(s.delete(key, 0), /invalid store key/, `delete ${JSON.stringify(key)}`);
    }
    for (const kind of ['', '..', 'a/b', 'Volumes', '.']) {
      await assert.rejects(s.list(kind), LatchError, `list ${JSON.stringify(kind)}`);
    }
    assert.equal(await exists(s.root), false);
  });
});

describe('file store: files on disk', () => {
  it('stores {"revision","deleted","value"} documents', async () => {
    const s = new FileStore(stateDir());
    await s.put('volumes/a', { x: 1 }, 0);
    await s.delete('volumes/a', 1);
    const dir = join(s.root, 'volumes', 'a');
    assert.deepEqual(JSON.parse(await fs.readFile(join(dir, '1.json'), 'utf8')), { revision: 1, deleted: false, value: { x: 1 } });
    assert.deepEqual(JSON.parse(await fs.readFile(join(dir, '2.json'), 'utf8')), { revision: 2, deleted: true });
  });

  it('ignores leftover and truncated temp files, and removes them once stale', async () => {
    const s = new FileStore(stateDir());
    await s.put('volumes/a', 'good', 0);
    const dir = join(s.root, 'volumes', 'a');
    // A killed writer's leftovers: a complete temp that never got linked and a truncated one.
    await fs.writeFile(join(dir, '.tmp-111-aaaa'), JSON.stringify({ revision: 2, deleted: false, value: 'orphan' }));
    await fs.writeFile(join(dir, '.tmp-222-bbbb'), '{"revision":2,"dele');
    await fs.writeFile(join(dir, '.tmp-333-cccc'), '');
    assert.deepEqual(await s.get('volumes/a'), { value: 'good', revision: 1 });
    assert.deepEqual(await s.list('volumes'), ['a']);
    assert.equal(await s.put('volumes/a', 'next', 1), 2);
    assert.equal(await s.put('volumes/a', 'more', 2), 3);
    assert.deepEqual(await s.get('volumes/a'), { value: 'more', revision: 3 });
    // Fresh leftovers stay (they might belong to a live writer), and so do the revisions they could still target.
    assert.equal((await fs.readdir(dir)).filter((f) => f.startsWith('.tmp-')).length, 3);
    // Once they are older than the limit the next write removes them, then collects old revisions.
    const old = new Date(Date.now() - STALE_TEMP_MS - 5_000);
    for (const f of ['.tmp-111-aaaa', '.tmp-222-bbbb', '.tmp-333-cccc']) await fs.utimes(join(dir, f), old, old);
    assert.equal(await s.put('volumes/a', 'last', 3), 4);
    assert.deepEqual(await fs.readdir(dir).then((f) => f.sort()), ['3.json', '4.json']);
  });

  it('reports a corrupt revision file as a DamagedDocumentError (a StoreError) naming the file, and still lists it', async () => {
    const s = new FileStore(stateDir());
    await s.put('volumes/a', 1, 0);
    await s.put('volumes/b', 1, 0);
    const file = join(s.root, 'volumes', 'a', '2.json');
    const cases: Array<[string, RegExp]> = [
      ['{"revision":2,"deleted":false,"val', /not valid JSON/],
      ['', /empty/],
      ['[1,2]', /not a JSON object/],
      ['{"revision":3,"deleted":false,"value":1}', /says revision 3 but its name says 2/],
      ['{"revision":2,"value":1}', /"deleted"/],
      ['{"revision":2,"deleted":false}', /no "value"/],
    ];
    for (const [content, why] of cases) {
      await fs.writeFile(file, content);
      const check = (e: unknown) => {
        assert.ok(e instanceof DamagedDocumentError && !(e instanceof ConflictError), String(e));
        assert.ok(e.message.includes(file), e.message);
        assert.match(e.message, why);
        return true;
      };
      await assert.rejects(s.get('volumes/a'), check);
      await assert.rejects(s.put('volumes/a', 2, 1), check);
      // Listed all the same (reading it says what is wrong), with the other keys: one damaged key does not hide them.
      assert.deepEqual(await s.list('volumes'), ['a', 'b']);
    }
    // Other keys are unaffected.
    assert.deepEqual(await s.get('volumes/b'), { value: 1, revision: 1 });
  });

  it('reports I/O failures as StoreError naming the path', async () => {
    const root = join(stateDir(), 'file-in-the-way');
    await fs.mkdir(join(root, '..'), { recursive: true });
    await fs.writeFile(root, 'not a directory');
    const s = new FileStore(root);
    await assert.rejects(s.put('volumes/a', 1, 0), (e) => e instanceof StoreError && e.message.includes(root));
    await assert.rejects(s.get('volumes/a'), (e) => e instanceof StoreError && e.message.includes(root));
  });
});

describe('file store: cost', () => {
  it('get and put of one key touch only that key, however many other keys exist', async () => {
    const calls: Array<[string, string]> = [];
    const root = stateDir();
    const s = new FileStore(root, { fs: countingFs(calls) });
    const plain = new FileStore(root);
    await plain.put('volumes/target', 0, 0);
    await plain.put('volumes/target', 1, 1);
    await plain.put('volumes/target', 2, 2);
    const keyDir = join(root, 'volumes', 'target');

    const measure = async (others: number) => {
      // Other keys written as the store would write them, without 2000 fsyncs.
      for (let i = 0; i < others; i++) {
        const dir = join(root, 'volumes', `other-${i}`);
        if (await exists(dir)) continue;
        await fs.mkdir(dir, { mode: 0o700 });
        await fs.writeFile(join(dir, '1.json'), JSON.stringify({ revision: 1, deleted: false, value: i }), { mode: 0o600 });
      }
      if (others > 10) assert.equal((await plain.list('volumes')).length, others + 1);
      calls.length = 0;
      const got = await s.get('volumes/target');
      const getCalls = calls.splice(0);
      await s.put('volumes/target', got!.value, got!.revision);
      const putCalls = calls.splice(0);
      return { getCalls, putCalls };
    };
    const small = await measure(10);
    const big = await measure(2000);
    assert.equal((await fs.readdir(join(root, 'volumes'))).length, 2001);

    for (const { getCalls, putCalls } of [small, big]) {
      assert.deepEqual(getCalls, [
        ['readdir', keyDir],
        ['readFile', join(keyDir, getCalls[1]![1].slice(keyDir.length + 1))],
      ]);
      for (const [call, path] of putCalls) {
        assert.ok(path === keyDir || path.startsWith(keyDir + '/'), `put called ${call} on ${path} outside ${keyDir}`);
      }
    }
    assert.equal(big.getCalls.length, small.getCalls.length);
    assert.deepEqual(
      big.putCalls.map(([c]) => c),
      small.putCalls.map(([c]) => c),
    );
  });
});

describe('openStore', () => {
  it('opens the file store rooted at stateDir, and the etcd store for an etcd config', async () => {
    const dir = stateDir();
    const s = await openStore(parseConfig({ stateDir: dir }, 'test'));
    assert.equal(s.kind, 'file');
    await s.put('volumes/a', 1, 0);
    assert.equal(await exists(join(dir, 'volumes', 'a', '1.json')), true);
    await s.close();
    // Opening does not connect: the first request does, so no etcd needs to run here.
    const etcd = await openStore(parseConfig({ stateDir: dir, store: { type: 'etcd', endpoints: ['http://127.0.0.1:2379'] } }, 'test'));
    assert.equal(etcd.kind, 'etcd');
    await etcd.close();
  });
});

describe('file store: watch', () => {
  // The watchers do not keep a process alive (the agent's own timer does), and the store's writes are synchronous:
  // without a timer of its own, a test waiting for a change would see its event loop run empty.
  let keepAlive: NodeJS.Timeout | undefined;
  beforeEach(() => {
    keepAlive = setInterval(() => {}, 1000);
  });
  afterEach(() => clearInterval(keepAlive));

  it('yields after a key of its kind is created or written (by any store on the directory), and ends on abort', async () => {
    const dir = stateDir();
    const watcher = new FileStore(dir);
    const writer = new FileStore(dir);
    const stop = new AbortController();
    const changes = watcher.watch('volumes', stop.signal)[Symbol.asyncIterator]();
    let next = changes.next(); // sets the watch up, then waits for a change

    // A write to another kind first (its directory is not watched), then a new key of ours.
    await writer.put('pvs/x', { volume: 'a' }, 0);
    const r1 = await writer.put('volumes/a', { v: 1 }, 0);
    assert.deepEqual(await next, { done: false, value: undefined });
    next = changes.next();
    // A later revision of an existing key (its directory is followed, not only the kind's).
    await writer.put('volumes/a', { v: 2 }, r1);
    assert.deepEqual(await next, { done: false, value: undefined });
    stop.abort();
    assert.equal((await changes.next()).done, true);
  });

  it('a reader that breaks out of its loop stops the watch', async () => {
    const dir = stateDir();
    const s = new FileStore(dir);
    const stop = new AbortController();
    let seen = 0;
    const writing = (async () => {
      for (let i = 0, rev = 0; i < 50 && seen === 0; i++) {
        rev = await s.put('volumes/b', { i }, rev);
        await sleep(20); // the store's writes never wait on the event loop: let the watcher's events in
      }
    })();
    for await (const _ of s.watch('volumes', stop.signal)) {
      seen++;
      break;
    }
    await writing;
    assert.equal(seen, 1);
  });
});

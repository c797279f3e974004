// The backup engine (src/backup/) on image files in temp dirs: holes, dedup, incremental backups, verify, restore,
// delete and gc, damaged manifests, the target's lock, backups interrupted by an exception or a SIGKILL, holes skipped
// through the kernel's map, and the two manifest formats' image checksums (v2 chunk list, v1 whole-image sha256).
// What a target that others can write may hold: decompression bombs and oversized chunk files (verify and restore
// fail cleanly, in bounded memory), forged manifests (refused with a backup key), old unauthenticated backups (read,
// flagged, refused with a key until signed), key files that are not root's alone; and the modes latch writes with.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { chmodSync, chownSync, lstatSync, symlinkSync } from 'node:fs';
import { constants as zlibConstants, createBrotliCompress } from 'node:zlib';
import { authenticateBackup } from '../../src/backup/authenticate.js';
import {
  closeSync,
  ftruncateSync,
  openSync,
  writeSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
  copyFileSync,
  unlinkSync,
  utimesSync,
  existsSync,
  mkdirSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createBackup, defaultBackupName } from '../../src/backup/create.js';
import { collectGarbage, deleteBackup } from '../../src/backup/delete.js';
import { checkBackupName, chunkPath, lockPath, type DirTarget as BackupTarget } from '../../src/backup/layout.js';
import { dataRanges, overlapsData, parseSeekMap } from '../../src/backup/extents.js';
import { chunkListDigest, chunkListSha256OfImage, listBackups, readManifest, type Manifest } from '../../src/backup/manifest.js';
import { restoreBackup } from '../../src/backup/restore.js';
import { storeOf } from '../../src/backup/store.js';
import { verifyBackup } from '../../src/backup/verify.js';
import { bundleForNode } from '../fixtures/bundle.js';
import { trackChild } from '../fixtures/tracked-children.js';

const CHUNK = 64 * 1024;
const CHUNKS = 64;
const SIZE = CHUNK * CHUNKS;

let work: string;
let workerJs: string;
let readerJs: string;

before(async () => {
  work = mkdtempSync(join(tmpdir(), 'latch-backup-engine-'));
  workerJs = join(work, 'backup-worker.cjs');
  readerJs = join(work, 'backup-reader.cjs');
  await bundleForNode('test/fixtures/backup-worker.ts', workerJs);
  await bundleForNode('test/fixtures/backup-reader.ts', readerJs);
});
after(() => {
  if (work) rmSync(work, { recursive: true, force: true });
});

let counter = 0;
function freshDir(what: string): string {
  return mkdtempSync(join(work, `${what}-${counter++}-`));
}

function freshTarget(): BackupTarget {
  return { type: 'dir', path: freshDir('target') };
}

/** An image of CHUNKS chunks: `dataChunks` of them random (compressible halves), the rest zero. Written sparse. */
function makeImage(dataChunks: number[]): { path: string; bytes: Buffer } {
  const bytes = Buffer.alloc(SIZE);
  for (const i of dataChunks) {
    randomBytes(CHUNK / 2).copy(bytes, i * CHUNK);
    bytes.fill(i + 1, i * CHUNK + CHUNK / 2, (i + 1) * CHUNK);
  }
  return { path: imageFile(bytes), bytes };
}

/** A new image file in a dir of its own holding `bytes`, sparse (writeImage). */
function imageFile(bytes: Buffer, name = 'volume.img'): string {
  const path = join(freshDir('image'), name);
  writeFileSync(path, Buffer.alloc(0));
  writeImage(path, bytes);
  return path;
}

/** Writes only the non-zero chunks, so the file is sparse like a pool image. */
function writeImage(path: string, bytes: Buffer): void {
  const fd = openSync(path, 'r+');
  ftruncateSync(fd, bytes.length);
  for (let i = 0; i < bytes.length / CHUNK; i++) {
    const chunk = bytes.subarray(i * CHUNK, (i + 1) * CHUNK);
    if (chunk.some((b) => b !== 0)) writeSync(fd, chunk, 0, CHUNK, i * CHUNK);
  }
  closeSync(fd);
}

function storedChunks(target: BackupTarget): string[] {
  const dir = join(target.path, 'chunks');
  if (!existsSync(dir)) return [];
  return readdirSync(dir).flatMap((shard) => readdirSync(join(dir, shard)).filter((f) => !f.endsWith('.tmp')));
}

function tempFiles(target: BackupTarget): string[] {
  const found: string[] = [];
  const walk = (dir: string) => {
    for (const entry of readdirSync(dir, { withFileTypes: true })) {
      if (entry.isDirectory()) walk(join(dir, entry.name));
      else if (entry.name.endsWith('.tmp')) found.push(entry.name);
    }
  };
  walk(target.path);
  return found;
}

const DATA = Array.from({ length: 40 }, (_, i) => (i * 3) % CHUNKS).sort((a, b) => a - b);

describe('create, list and restore', () => {
  it('stores data chunks once, records holes without storing them, and restores identical bytes, sparse', async () => {
    const target = freshTarget();
    const image = makeImage([...new Set(DATA)]);
    const dataCount = new Set(DATA).size;
    const manifest = await createBackup({ target, source: image.path, volume: 'vol-a', name: 'one', chunkSize: CHUNK });
    assert.equal(manifest.stats.dataChunks, dataCount);
    assert.equal(manifest.stats.holeChunks, CHUNKS - dataCount);
    assert.equal(manifest.stats.newChunks, dataCount);
    assert.equal(manifest.chunks.filter((c) => c === null).length, CHUNKS - dataCount);
    assert.equal(storedChunks(target).length, dataCount, 'one file per data chunk, none for holes');
    assert.ok(manifest.stats.newBytesStored < dataCount * CHUNK * 0.75, `compressed: ${manifest.stats.newBytesStored}`);
    assert.deepEqual(
      (await listBackups(target)).map((b) => b.name),
      ['one'],
    );
    // A listing keeps manifests without their chunk lists (its memory grows with the backups, not their sizes).
    const { chunks, ...summary } = manifest;
    assert.deepEqual((await listBackups(target))[0]?.manifest, summary);
    const seen: (string | null)[][] = [];
    await listBackups(target, undefined, (c) => seen.push([...c]));
    assert.deepEqual(seen, [chunks], 'a caller that asks sees each chunk list once');

    const out = join(freshDir('restore'), 'restored.img');
    const report = await restoreBackup({ target, name: 'one', destination: out });
    assert.equal(report.dataChunks, dataCount);
    assert.ok(readFileSync(out).equals(image.bytes), 'restored bytes are identical');
    const allocated = statSync(out).blocks * 512;
    assert.ok(
      allocated <= dataCount * CHUNK + 64 * 1024,
      `restored file is sparse: ${allocated} bytes allocated for ${dataCount * CHUNK} of data`,
    );

    await assert.rejects(restoreBackup({ target, name: 'one', destination: out }), /already exists/);
    writeFileSync(out, 'garbage');
    await restoreBackup({ target, name: 'one', destination: out, overwriteFile: true });
    assert.ok(readFileSync(out).equals(image.bytes), 'an overwritten file is restored exactly');
  });

  it('second backup of a lightly changed image writes only the changed chunks; another volume with the same data writes none', async () => {
    const target = freshTarget();
    const image = makeImage(DATA);
    const first = await createBackup({ target, source: image.path, volume: 'vol-a', name: 'a1', chunkSize: CHUNK });
    const before = storedChunks(target).length;

    const changed = [0, 9, 30];
    for (const i of changed) randomBytes(100).copy(image.bytes, i * CHUNK + 10);
    writeImage(image.path, image.bytes);
    const second = await createBackup({ target, source: image.path, volume: 'vol-a', name: 'a2', chunkSize: CHUNK });
    assert.equal(second.stats.newChunks, changed.length, 'only the changed chunks were stored');
    assert.equal(second.stats.presentChunks, second.stats.dataChunks - changed.length);
    assert.ok(second.stats.newBytesStored < first.stats.newBytesStored / 5, 'bytes written follow the change');
    assert.equal(storedChunks(target).length, before + changed.length);
    assert.equal(second.parent, 'a1');

    const copy = join(freshDir('image'), 'copy.img');
    copyFileSync(image.path, copy);
    const other = await createBackup({ target, source: copy, volume: 'vol-b', name: 'b1', chunkSize: CHUNK });
    assert.equal(other.stats.newChunks, 0, 'dedup across volumes');
    assert.equal(other.parent, undefined, "vol-b's first backup has no parent");
    assert.deepEqual(
      (await listBackups(target, 'vol-a')).map((b) => b.name),
      ['a1', 'a2'],
    );

    const out = join(freshDir('restore'), 'a1.img');
    await restoreBackup({ target, name: 'a1', destination: out });
    assert.ok(!readFileSync(out).equals(image.bytes), 'a1 is the image before the change');
    const out2 = join(freshDir('restore'), 'a2.img');
    await restoreBackup({ target, name: 'a2', destination: out2 });
    assert.ok(readFileSync(out2).equals(image.bytes), 'a2 is the image after it');
  });

  it('refuses a taken name, a missing target and a source that is neither a file nor a block device', async () => {
    const target = freshTarget();
    const image = makeImage([1, 2]);
    await createBackup({ target, source: image.path, volume: 'v', name: 'same', chunkSize: CHUNK });
    await assert.rejects(createBackup({ target, source: image.path, volume: 'v', name: 'same', chunkSize: CHUNK }), /already exists/);
    await assert.rejects(
      createBackup({ target: { type: 'dir', path: join(work, 'no-such-share') }, source: image.path, volume: 'v', chunkSize: CHUNK }),
      /does not exist.*mount the share/,
    );
    await assert.rejects(
      createBackup({ target, source: work, volume: 'v', chunkSize: CHUNK }),
      /neither a regular file nor a block device/,
    );
    await assert.rejects(createBackup({ target, source: image.path, volume: 'v', name: '../escape', chunkSize: CHUNK }), /not allowed/);
    assert.equal(existsSync(join(work, 'no-such-share')), false, 'a missing target is never created');
  });

  it('gives a default name from the volume and the time', async () => {
    const target = freshTarget();
    const image = makeImage([1]);
    const m = await createBackup({
      target,
      source: image.path,
      volume: 'v',
      chunkSize: CHUNK,
      now: () => Date.UTC(2026, 10, 23, 12, 34, 56, 789),
    });
    assert.equal(m.name, 'v-20261123-123456-789');
  });

  it('two default names of one volume within the same second differ (milliseconds)', () => {
    const a = defaultBackupName('v', new Date(Date.UTC(2026, 10, 23, 12, 34, 56, 1)).toISOString());
    const b = defaultBackupName('v', new Date(Date.UTC(2026, 10, 23, 12, 34, 56, 2)).toISOString());
    assert.deepEqual([a, b], ['v-20261123-123456-001', 'v-20261123-123456-002']);
    assert.equal(checkBackupName(a), a);
  });
});

describe("a large volume read whole: its parent's chunks stand for a look-up each", () => {
  /** Counts the target store's look-ups of chunks (HEADs on S3) and listings from now on. */
  async function counting(target: BackupTarget) {
    const store = await storeOf(target);
    const exists = store.exists.bind(store);
    const list = store.list.bind(store);
    const seen = { lookUps: 0, listings: 0 };
    store.exists = (key) => {
      if (key.startsWith('chunks/')) seen.lookUps++;
      return exists(key);
    };
    store.list = (prefix) => {
      seen.listings++;
      return list(prefix);
    };
    return seen;
  }

  it('looks up only the changed chunk when the parent holds the rest, and looks each up again once one of them is lost', async () => {
    const target = freshTarget();
    const chunk = 4096;
    const bytes = randomBytes(1152 * chunk);
    const path = imageFile(bytes);
    const seen = await counting(target);
    await createBackup({ target, source: path, volume: 'v', name: 'one', chunkSize: chunk });
    assert.equal(seen.lookUps, 1152, 'the first backup looks each chunk up');

    randomBytes(chunk).copy(bytes, 7 * chunk);
    writeImage(path, bytes);
    Object.assign(seen, { lookUps: 0, listings: 0 });
    const two = await createBackup({ target, source: path, volume: 'v', name: 'two', chunkSize: chunk });
    assert.deepEqual([two.stats.newChunks, two.stats.presentChunks], [1, 1151]);
    // The changed chunk, and the parent's in shards where it has a lone chunk (listing takes as many requests there).
    assert.ok(seen.lookUps >= 1 && seen.lookUps < 64, `${seen.lookUps} look-ups`);
    assert.ok(seen.listings <= 256 && seen.lookUps + seen.listings < 1152 / 3, `${seen.listings} listings, ${seen.lookUps} look-ups`);

    // A chunk of "two" lost from the target: nothing stands for a look-up any more, and the lost one is stored again.
    const lost = two.chunks[500] as string;
    rmSync(chunkPath(target, lost));
    Object.assign(seen, { lookUps: 0, listings: 0 });
    const three = await createBackup({ target, source: path, volume: 'v', name: 'three', chunkSize: chunk });
    assert.equal(three.stats.newChunks, 1, 'the lost chunk is stored again');
    assert.ok(seen.lookUps >= 1152, `${seen.lookUps} look-ups`);
    assert.equal((await verifyBackup({ target, name: 'two' })).ok, true, 'which mends the backup that lost it');
    const out = join(freshDir('restore'), 'x.img');
    await restoreBackup({ target, name: 'three', destination: out });
    assert.ok(readFileSync(out).equals(bytes));
  });
});

describe('verify', () => {
  it('passes an intact backup and names a corrupted and a missing chunk', async () => {
    const target = freshTarget();
    const image = makeImage(DATA);
    const m = await createBackup({ target, source: image.path, volume: 'v', name: 'b', chunkSize: CHUNK });
    const good = await verifyBackup({ target, name: 'b' });
    assert.equal(good.ok, true);
    assert.equal(good.imageChecksumMatches, true);
    assert.equal(good.chunksChecked, m.stats.dataChunks);

    const dataIndexes = m.chunks.flatMap((c, i) => (c === null ? [] : [i]));
    const [corruptIndex, missingIndex] = [dataIndexes[2], dataIndexes[5]] as [number, number];
    const corruptHash = m.chunks[corruptIndex] as string;
    const missingHash = m.chunks[missingIndex] as string;
    writeFileSync(chunkPath(target, corruptHash), randomBytes(100));
    unlinkSync(chunkPath(target, missingHash));

    const bad = await verifyBackup({ target, name: 'b' });
    assert.equal(bad.ok, false);
    assert.deepEqual(
      bad.problems.map((p) => [p.index, p.problem]),
      [
        [corruptIndex, 'corrupt'],
        [missingIndex, 'missing'],
      ],
    );
    await assert.rejects(
      restoreBackup({ target, name: 'b', destination: join(freshDir('restore'), 'x.img') }),
      new RegExp(`chunk ${corruptIndex} .* is corrupt.*must not be used`),
    );
  });

  it('detects a chunk whose compressed bytes are valid but hold other data', async () => {
    const target = freshTarget();
    const m = await createBackup({ target, source: makeImage([3, 4]).path, volume: 'v', name: 'b', chunkSize: CHUNK });
    const [h3, h4] = m.chunks.filter((c) => c !== null) as [string, string];
    copyFileSync(chunkPath(target, h4), chunkPath(target, h3));
    const report = await verifyBackup({ target, name: 'b' });
    assert.deepEqual(
      report.problems.map((p) => [p.hash, p.problem, p.detail]),
      [[h3, 'corrupt', 'its bytes do not match its sha256']],
    );
  });
});

describe('verify: chunks at several positions, and reads ahead', () => {
  /** An image whose chunks 1, 4, 9 and 20 hold the same bytes, 2 and 30 others of their own, the rest holes. */
  function imageWithRepeats(): { path: string; bytes: Buffer } {
    const bytes = Buffer.alloc(SIZE);
    const shared = randomBytes(CHUNK);
    for (const i of [1, 4, 9, 20]) shared.copy(bytes, i * CHUNK);
    for (const i of [2, 30]) randomBytes(CHUNK).copy(bytes, i * CHUNK);
    return { path: imageFile(bytes), bytes };
  }

  it('reads a chunk that appears at several positions once, and names each position when it is damaged', async () => {
    const target = freshTarget();
    const m = await createBackup({ target, source: imageWithRepeats().path, volume: 'v', name: 'b', chunkSize: CHUNK });
    assert.equal(m.stats.dataChunks, 6);
    const good = await verifyBackup({ target, name: 'b' });
    assert.deepEqual([good.ok, good.imageChecksumMatches, good.chunksChecked], [true, true, 3]);
    for (const parallel of [1, 2, 16]) assert.equal((await verifyBackup({ target, name: 'b', parallel })).chunksChecked, 3);

    writeFileSync(chunkPath(target, m.chunks[4] as string), randomBytes(100));
    const bad = await verifyBackup({ target, name: 'b' });
    assert.equal(bad.ok, false);
    assert.deepEqual(
      bad.problems.map((p) => [p.index, p.problem]),
      [1, 4, 9, 20].map((i) => [i, 'corrupt']),
    );
  });

  it('a v1 backup (whole-image sha256) reads a repeated chunk at each position, since its check needs the bytes', async () => {
    const target = freshTarget();
    const image = imageWithRepeats();
    const m = await createBackup({ target, source: image.path, volume: 'v', name: 'old', chunkSize: CHUNK });
    const { chunkListSha256: _dropped, ...rest } = m;
    rewriteManifest(target, { ...rest, format: 'latch-backup/v1', imageSha256: createHash('sha256').update(image.bytes).digest('hex') });
    const report = await verifyBackup({ target, name: 'old' });
    assert.deepEqual([report.ok, report.imageChecksumMatches, report.chunksChecked], [true, true, 6]);
  });

  it('a chunk that cannot be read at all fails verify and restore with its error, and leaves no rejection unhandled', async () => {
    const target = freshTarget();
    const m = await createBackup({ target, source: makeImage([0, 1, 2, 3, 4, 5]).path, volume: 'v', name: 'b', chunkSize: CHUNK });
    // A directory where a chunk file should be: reading it fails with EISDIR, not as a missing or corrupt chunk.
    const path = chunkPath(target, m.chunks[3] as string);
    unlinkSync(path);
    mkdirSync(path);
    const unhandled: unknown[] = [];
    const onUnhandled = (reason: unknown) => unhandled.push(reason);
    process.on('unhandledRejection', onUnhandled);
    try {
      await assert.rejects(verifyBackup({ target, name: 'b', parallel: 8 }), { code: 'EISDIR' });
      await assert.rejects(restoreBackup({ target, name: 'b', destination: join(freshDir('restore'), 'x.img'), parallel: 8 }), {
        code: 'EISDIR',
      });
      // Node reports a rejection nobody handled once the microtasks after it have run: give any such report time.
      await new Promise((resolve) => setTimeout(resolve, 50));
    } finally {
      process.off('unhandledRejection', onUnhandled);
    }
    assert.deepEqual(unhandled, []);
  });
});

describe('damaged manifests', () => {
  it('lists a damaged manifest as damaged, refuses to use it or to collect garbage, and deletes it', async () => {
    const target = freshTarget();
    const image = makeImage(DATA);
    await createBackup({ target, source: image.path, volume: 'v', name: 'good', chunkSize: CHUNK });
    await createBackup({ target, source: makeImage([5]).path, volume: 'v', name: 'bad', chunkSize: CHUNK });
    const path = join(target.path, 'backups', 'bad.json');
    writeFileSync(path, readFileSync(path, 'utf8').replace('"sizeBytes":', '"sizeBytes":1'));

    const listed = await listBackups(target);
    assert.deepEqual(
      listed.map((b) => [b.name, b.manifest !== undefined]),
      [
        ['bad', false],
        ['good', true],
      ],
    );
    assert.match(listed[0]?.error ?? '', /manifest of backup bad .* is corrupted: its checksum does not match/);
    await assert.rejects(readManifest(target, 'bad'), /corrupted/);
    await assert.rejects(verifyBackup({ target, name: 'bad' }), /corrupted/);
    await assert.rejects(collectGarbage({ target }), /not collecting garbage: the manifest of bad/);
    await deleteBackup({ target, name: 'bad' });
    assert.equal((await verifyBackup({ target, name: 'good' })).ok, true);

    writeFileSync(join(target.path, 'backups', 'junk.json'), '{not json');
    assert.match((await listBackups(target)).find((b) => b.name === 'junk')?.error ?? '', /not JSON/);
  });
});

describe('delete and garbage collection', () => {
  it('removes only the chunks no other backup needs', async () => {
    const target = freshTarget();
    const image = makeImage(DATA);
    const a = await createBackup({ target, source: image.path, volume: 'vol-a', name: 'a', chunkSize: CHUNK });
    for (const i of [0, 3]) randomBytes(64).copy(image.bytes, i * CHUNK);
    writeImage(image.path, image.bytes);
    const b = await createBackup({ target, source: image.path, volume: 'vol-b', name: 'b', chunkSize: CHUNK });
    assert.equal(b.stats.newChunks, 2);

    const report = await deleteBackup({ target, name: 'a' });
    assert.equal(report.removedChunks, 2, "a's two chunks that b does not share");
    assert.equal(storedChunks(target).length, new Set(b.chunks.filter((c) => c !== null)).size);
    assert.equal((await verifyBackup({ target, name: 'b' })).ok, true);
    assert.deepEqual(
      (await listBackups(target)).map((x) => x.name),
      ['b'],
    );
    await assert.rejects(deleteBackup({ target, name: 'a' }), /does not exist/);
    assert.equal((await deleteBackup({ target, name: 'a', missingOk: true })).removedChunks, 0);
    void a;

    await deleteBackup({ target, name: 'b' });
    assert.equal(storedChunks(target).length, 0);
  });
});

describe('interrupted backups', () => {
  it('a backup abandoned by an exception midway is not listed, frees the lock, and the next one succeeds', async () => {
    const target = freshTarget();
    const image = makeImage(DATA);
    await assert.rejects(
      createBackup({
        target,
        source: image.path,
        volume: 'v',
        name: 'half',
        chunkSize: CHUNK,
        onChunk: (i) => {
          if (i === 30) throw new Error('interrupted');
        },
      }),
      /interrupted/,
    );
    assert.ok(storedChunks(target).length > 0, 'it had stored chunks');
    assert.deepEqual(await listBackups(target), []);
    assert.equal(existsSync(lockPath(target)), false);

    await assert.rejects(
      createBackup({
        target,
        source: image.path,
        volume: 'v',
        name: 'changed',
        chunkSize: CHUNK,
        beforePublish: () => Promise.reject(new Error('the source changed while it was read')),
      }),
      /source changed/,
    );
    assert.deepEqual(await listBackups(target), [], 'a backup refused before publishing is not listed');

    const m = await createBackup({ target, source: image.path, volume: 'v', name: 'half', chunkSize: CHUNK });
    assert.equal(m.stats.newChunks, 0, 'the chunks stored by the abandoned attempts are reused');
    assert.equal((await verifyBackup({ target, name: 'half' })).ok, true);
  });

  it('a backup SIGKILLed midway is not listed; the next one takes the dead lock over, removes temp files and succeeds', async () => {
    const target = freshTarget();
    const image = makeImage(DATA);
    const child = spawn(process.execPath, [workerJs, target.path, image.path, 'v', 'killed', String(CHUNK)], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    trackChild(child);
    let out = '';
    let errText = '';
    child.stderr.on('data', (d: Buffer) => (errText += d.toString()));
    await new Promise<void>((resolve, reject) => {
      child.stdout.on('data', (d: Buffer) => {
        out += d.toString();
        if (/chunk 20\n/.test(out)) {
          child.kill('SIGKILL');
          resolve();
        }
      });
      child.once('exit', () => reject(new Error(`the worker ended before it was killed: ${out} ${errText}`)));
    });
    await new Promise((r) => child.once('exit', r));
    assert.ok(!out.includes('done'));
    assert.ok(existsSync(lockPath(target)), 'the dead writer left its lock');
    assert.deepEqual(await listBackups(target), []);
    // What a writer killed between writing and renaming a chunk leaves behind.
    writeFileSync(join(target.path, 'backups', '.killed.json.1.0000abcd.tmp'), '{');

    const m = await createBackup({ target, source: image.path, volume: 'v', name: 'next', chunkSize: CHUNK, lock: { waitMs: 2000 } });
    assert.equal(m.stats.dataChunks, new Set(DATA).size);
    assert.deepEqual(tempFiles(target), []);
    assert.deepEqual(
      (await listBackups(target)).map((b) => b.name),
      ['next'],
    );
    assert.equal((await verifyBackup({ target, name: 'next' })).ok, true);
  });
});

describe("the target's lock", () => {
  it('is kept fresh by a heartbeat, and a writer whose lock was taken over publishes nothing', async () => {
    const target = freshTarget();
    const image = makeImage(DATA);
    const old = new Date(Date.now() - 60_000);
    let refreshed = false;
    await assert.rejects(
      createBackup({
        target,
        source: image.path,
        volume: 'v',
        name: 'usurped',
        chunkSize: CHUNK,
        lock: { heartbeatMs: 20 },
        onChunk: async (i) => {
          if (i === 1) utimesSync(lockPath(target), old, old);
          if (i === 10) refreshed = statSync(lockPath(target)).mtimeMs > old.getTime() + 1000;
          // Another node decided this writer was dead and took the lock over.
          if (i === 20)
            writeFileSync(lockPath(target), JSON.stringify({ host: 'elsewhere', pid: 1, purpose: 'gc', startedAt: '', token: 'theirs' }));
          await new Promise((r) => setTimeout(r, 10));
        },
      }),
      /lost the lock of the backup target .*nothing was published/,
    );
    assert.ok(refreshed, 'the heartbeat touched the lock');
    assert.deepEqual(await listBackups(target), []);
    assert.ok(existsSync(lockPath(target)), "the new holder's lock is left alone");
  });

  it('waits for a live holder and names it, and takes over a lock untouched for too long', async () => {
    const target = freshTarget();
    const image = makeImage([1]);
    const holder = {
      node: 'node-b',
      host: 'elsewhere',
      pid: 1,
      purpose: 'backup x of volume y',
      startedAt: '2026-11-23T10:00:00Z',
      token: 't',
    };
    writeFileSync(lockPath(target), JSON.stringify(holder));
    await assert.rejects(
      createBackup({ target, source: image.path, volume: 'v', chunkSize: CHUNK, lock: { waitMs: 300 } }),
      /backup target .* is busy: backup x of volume y on node node-b/,
    );
    const old = new Date(Date.now() - 11 * 60_000);
    utimesSync(lockPath(target), old, old);
    await createBackup({ target, source: image.path, volume: 'v', name: 'after', chunkSize: CHUNK, lock: { waitMs: 300 } });
    assert.equal(existsSync(lockPath(target)), false, 'released after use');
  });
});

describe('a full target', { skip: process.getuid?.() !== 0 ? 'needs root to mount a small tmpfs' : false }, () => {
  it('fails with a message that says so, publishes nothing, and leaves no temp files', async () => {
    const path = freshDir('full');
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=256k', 'latch-test-full', path]);
    try {
      const target: BackupTarget = { type: 'dir', path };
      await assert.rejects(
        createBackup({ target, source: makeImage(DATA).path, volume: 'v', name: 'big', chunkSize: CHUNK }),
        new RegExp(`the backup target ${path} is full .*nothing was published`),
      );
      assert.deepEqual(await listBackups(target), []);
      assert.deepEqual(tempFiles(target), []);
      assert.equal(existsSync(lockPath(target)), false);
    } finally {
      execFileSync('umount', [path]);
    }
  });
});

describe('holes skipped without reading, and the chunk-list checksum', () => {
  it("learns an image file's data ranges from the kernel, and parses and searches the map", async () => {
    const path = join(freshDir('image'), 'sparse.img');
    writeFileSync(path, Buffer.alloc(0));
    const fd = openSync(path, 'r+');
    ftruncateSync(fd, SIZE);
    writeSync(fd, randomBytes(4096), 0, 4096, 5 * CHUNK + CHUNK - 4096);
    writeSync(fd, randomBytes(8192), 0, 8192, 20 * CHUNK);
    closeSync(fd);
    const ranges = await dataRanges(path, SIZE);
    assert.ok(ranges, 'xfs_io gives the map of a file in the temp dir');
    // A filesystem may allocate around what was written, never less.
    assert.ok(overlapsData(ranges, 5 * CHUNK, CHUNK) && overlapsData(ranges, 20 * CHUNK, CHUNK), JSON.stringify(ranges));
    assert.ok(!overlapsData(ranges, 0, CHUNK) && !overlapsData(ranges, 40 * CHUNK, CHUNK), JSON.stringify(ranges));

    const map = 'Whence\tResult\nHOLE\t0\nDATA\t8192\nHOLE\t12288\nDATA\t65536\n';
    assert.deepEqual(parseSeekMap(map, 70000), [
      { offset: 8192, length: 4096 },
      { offset: 65536, length: 70000 - 65536 },
    ]);
    assert.deepEqual(parseSeekMap('Whence\tResult\nHOLE\t0\n', 4096), []);
    for (const bad of ['', 'oops\n', 'Whence\tResult\n', 'Whence\tResult\nDATA\t4096\n', 'Whence\tResult\nDATA\t0\nHOLE\t0\n']) {
      assert.equal(parseSeekMap(bad, 8192), undefined, `unbelievable map ${JSON.stringify(bad)}`);
    }
    const sample = [
      { offset: 100, length: 50 },
      { offset: 1000, length: 10 },
    ];
    assert.equal(overlapsData(sample, 0, 100), false);
    assert.equal(overlapsData(sample, 0, 101), true);
    assert.equal(overlapsData(sample, 150, 850), false);
    assert.equal(overlapsData(sample, 149, 1), true);
    assert.equal(overlapsData(sample, 1009, 5), true);
    assert.equal(overlapsData(sample, 1010, 5), false);
  });

  it('backs up a sparse image through the hole map (v2 manifest) and restores it byte for byte, sparse', async () => {
    const target = freshTarget();
    const bytes = Buffer.alloc(SIZE);
    randomBytes(4096).copy(bytes, 5 * CHUNK + CHUNK - 4096); // data only in the last page of chunk 5
    randomBytes(CHUNK).copy(bytes, 6 * CHUNK); // a whole chunk
    randomBytes(100).copy(bytes, 30 * CHUNK + 7); // a few bytes
    bytes.fill(9, SIZE - 10); // the very end
    const path = imageFile(bytes, 'sparse.img');
    // An allocated chunk of zeros: read (the map says data), found zero, recorded as a hole all the same.
    const fd = openSync(path, 'r+');
    writeSync(fd, Buffer.alloc(CHUNK), 0, CHUNK, 12 * CHUNK);
    closeSync(fd);
    assert.ok(await dataRanges(path, SIZE), 'this test is about the hole-skipping path');

    const m = await createBackup({ target, source: path, volume: 'v', name: 'sparse', chunkSize: CHUNK });
    assert.equal(m.format, 'latch-backup/v2');
    assert.equal(m.imageSha256, undefined);
    assert.equal(m.chunkListSha256, chunkListDigest(SIZE, CHUNK, m.chunks));
    assert.equal(m.chunkListSha256, await chunkListSha256OfImage(path, CHUNK), "the image's own chunk list, read whole");
    assert.deepEqual(
      m.chunks.flatMap((c, i) => (c === null ? [] : [i])),
      [5, 6, 30, CHUNKS - 1],
    );
    assert.equal(m.stats.holeChunks, CHUNKS - 4);
    const stored = m.chunks.filter((c) => c !== null).reduce((sum, c) => sum + statSync(chunkPath(target, c)).size, 0);
    assert.equal(m.stats.newBytesStored, stored, 'every stored chunk is counted (they are stored concurrently)');
    assert.equal((await verifyBackup({ target, name: 'sparse' })).ok, true);

    const out = join(freshDir('restore'), 'restored.img');
    const report = await restoreBackup({ target, name: 'sparse', destination: out });
    assert.equal(report.bytesWritten, 4 * CHUNK);
    assert.ok(readFileSync(out).equals(bytes), 'restored bytes are identical');
    assert.ok(statSync(out).blocks * 512 <= 4 * CHUNK + 64 * 1024, 'the holes were not written');
  });

  it('restore and verify refuse a v2 manifest whose chunk-list checksum does not match', async () => {
    const target = freshTarget();
    const m = await createBackup({ target, source: makeImage([1, 2]).path, volume: 'v', name: 'b', chunkSize: CHUNK });
    rewriteManifest(target, { ...m, chunkListSha256: chunkListDigest(SIZE, CHUNK, [...m.chunks].reverse()) });
    const report = await verifyBackup({ target, name: 'b' });
    assert.deepEqual([report.ok, report.imageChecksumMatches, report.problems], [false, false, []]);
    await assert.rejects(
      restoreBackup({ target, name: 'b', destination: join(freshDir('restore'), 'x.img') }),
      /does not match the manifest's checksum/,
    );
  });

  it('a v1 manifest (whole-image sha256) still verifies and restores, and its checksum and chunks are still checked', async () => {
    const target = freshTarget();
    const image = makeImage(DATA);
    const m = await createBackup({ target, source: image.path, volume: 'v', name: 'old', chunkSize: CHUNK });
    const { chunkListSha256: _dropped, ...rest } = m;
    const v1: Manifest = { ...rest, format: 'latch-backup/v1', imageSha256: createHash('sha256').update(image.bytes).digest('hex') };
    rewriteManifest(target, v1);
    assert.deepEqual(await readManifest(target, 'old'), v1);
    const good = await verifyBackup({ target, name: 'old' });
    assert.deepEqual([good.ok, good.imageChecksumMatches], [true, true]);
    const out = join(freshDir('restore'), 'old.img');
    await restoreBackup({ target, name: 'old', destination: out });
    assert.ok(readFileSync(out).equals(image.bytes), 'a v1 backup restores identical bytes');

    rewriteManifest(target, { ...v1, imageSha256: createHash('sha256').update('other').digest('hex') });
    assert.equal((await verifyBackup({ target, name: 'old' })).imageChecksumMatches, false);
    await assert.rejects(
      restoreBackup({ target, name: 'old', destination: join(freshDir('restore'), 'x.img') }),
      /does not match the manifest's checksum/,
    );

    rewriteManifest(target, v1);
    const dataIndex = m.chunks.findIndex((c) => c !== null);
    writeFileSync(chunkPath(target, m.chunks[dataIndex] as string), randomBytes(100));
    assert.deepEqual((await verifyBackup({ target, name: 'old' })).problems.map((p) => [p.index, p.problem]).slice(0, 1), [
      [dataIndex, 'corrupt'],
    ]);
    await assert.rejects(
      restoreBackup({ target, name: 'old', destination: join(freshDir('restore'), 'y.img') }),
      new RegExp(`chunk ${dataIndex} .* is corrupt`),
    );

    const { imageSha256: _gone, ...noChecksum } = v1;
    rewriteManifest(target, noChecksum);
    await assert.rejects(readManifest(target, 'old'), /corrupted: no image checksum/);
  });

  it(
    'restores onto a block device that held other data: its holes are zeroed',
    { skip: process.getuid?.() !== 0 ? 'needs root for a loop device' : false },
    async () => {
      const target = freshTarget();
      const image = makeImage([2, 40]);
      await createBackup({ target, source: image.path, volume: 'v', name: 'b', chunkSize: CHUNK });
      const backing = join(freshDir('device'), 'backing.img');
      writeFileSync(backing, randomBytes(SIZE));
      const device = execFileSync('losetup', ['--find', '--show', backing], { encoding: 'utf8' }).trim();
      try {
        await restoreBackup({ target, name: 'b', destination: device });
        assert.ok(readFileSync(device).subarray(0, SIZE).equals(image.bytes), "the device holds the backup's bytes, zeros in its holes");
      } finally {
        execFileSync('losetup', ['-d', device]);
      }
    },
  );
});

/** Replaces a backup's manifest with `manifest`, checksummed as publishManifest does (a well-formed manifest). */
function rewriteManifest(target: BackupTarget, manifest: Manifest): void {
  const body = JSON.stringify(manifest);
  const checksum = createHash('sha256').update(body).digest('hex');
  writeFileSync(join(target.path, 'backups', `${manifest.name}.json`), `${JSON.stringify({ ...manifest, checksum })}\n`);
}

/** Brotli of `bytes` zeros, streamed (never held whole): 256 MiB make about 200 bytes. */
async function brotliBomb(bytes: number): Promise<Buffer> {
  const compress = createBrotliCompress({ params: { [zlibConstants.BROTLI_PARAM_QUALITY]: 5, [zlibConstants.BROTLI_PARAM_LGWIN]: 24 } });
  const out: Buffer[] = [];
  compress.on('data', (piece: Buffer) => out.push(piece));
  const ended = new Promise((resolve, reject) => compress.on('end', resolve).on('error', reject));
  const zeros = Buffer.alloc(1024 * 1024);
  for (let written = 0; written < bytes; written += zeros.length) {
    if (!compress.write(zeros)) await new Promise((resolve) => compress.once('drain', resolve));
  }
  compress.end();
  await ended;
  return Buffer.concat(out);
}

/** A key file as an admin makes one: `openssl rand -base64 48`, mode 0600. Returns its path and its text. */
function makeKeyFile(): { path: string; text: string } {
  const text = `${randomBytes(48).toString('base64')}\n`;
  const path = join(freshDir('key'), 'backup.key');
  writeFileSync(path, text, { mode: 0o600 });
  return { path, text };
}

/** Runs backup-reader.cjs (a verify or a restore in a process of its own): its outcome and peak RSS. */
function readerRun(args: string[]): { report?: { ok?: boolean; problems?: { detail: string }[] }; error?: string; peakKiB: number } {
  const out = execFileSync(process.execPath, [readerJs, ...args], { encoding: 'utf8', timeout: 120_000 });
  return JSON.parse(out) as { report?: { ok?: boolean; problems?: { detail: string }[] }; error?: string; peakKiB: number };
}

describe('chunks from a target others can write: decompression bombs and oversized files', () => {
  let bomb: Buffer;
  before(async () => {
    bomb = await brotliBomb(256 * 1024 * 1024);
  });

  it('a chunk that inflates past its declared size is corrupt: verify names it, restore stops at it', async () => {
    assert.ok(bomb.length < 1024, `the bomb is small: ${bomb.length} bytes`);
    const target = freshTarget();
    const m = await createBackup({ target, source: makeImage([1, 2, 3, 4]).path, volume: 'v', name: 'b', chunkSize: CHUNK });
    const hashes = m.chunks.filter((c): c is string => c !== null);
    for (const hash of hashes) writeFileSync(chunkPath(target, hash), bomb);
    const report = await verifyBackup({ target, name: 'b' });
    assert.equal(report.ok, false);
    assert.deepEqual(
      report.problems.map((p) => [p.index, p.problem, p.detail]),
      [1, 2, 3, 4].map((i) => [i, 'corrupt', `it inflates past its ${CHUNK} bytes (a decompression bomb?)`]),
    );
    const out = join(freshDir('restore'), 'x.img');
    await assert.rejects(
      restoreBackup({ target, name: 'b', destination: out }),
      new RegExp(`chunk 1 \\(${hashes[0]}\\) is corrupt \\(it inflates past its ${CHUNK} bytes.*must not be used`),
    );
  });

  it('verify and restore of four bomb chunks at once stay far below 256 MiB of memory (a process of their own)', async (t) => {
    const target = freshTarget();
    const m = await createBackup({ target, source: makeImage([1, 2, 3, 4]).path, volume: 'v', name: 'b', chunkSize: CHUNK });
    for (const hash of m.chunks.filter((c): c is string => c !== null)) writeFileSync(chunkPath(target, hash), bomb);
    const verify = readerRun(['verify', target.path, 'b']);
    assert.equal(verify.report?.ok, false);
    assert.equal(verify.report?.problems?.length, 4);
    const restore = readerRun(['restore', target.path, 'b', join(freshDir('restore'), 'x.img')]);
    assert.match(restore.error ?? '', /is corrupt \(it inflates past/);
    t.diagnostic(`peak RSS: verify ${Math.round(verify.peakKiB / 1024)} MiB, restore ${Math.round(restore.peakKiB / 1024)} MiB`);
    for (const run of [verify, restore]) assert.ok(run.peakKiB < 256 * 1024, `peak RSS ${run.peakKiB} KiB`);
  });

  it('a chunk file larger than its chunk compresses to is corrupt without being read', async () => {
    const target = freshTarget();
    const m = await createBackup({ target, source: makeImage([7]).path, volume: 'v', name: 'b', chunkSize: CHUNK });
    writeFileSync(chunkPath(target, m.chunks[7] as string), Buffer.alloc(2 * CHUNK));
    assert.deepEqual(
      (await verifyBackup({ target, name: 'b' })).problems.map((p) => p.detail),
      [`its file holds ${2 * CHUNK} bytes, more than a chunk of ${CHUNK} bytes compresses to`],
    );
  });

  it('a manifest that declares chunks above 16 MiB is refused (the reads ahead must stay bounded)', async () => {
    const target = freshTarget();
    const m = await createBackup({ target, source: makeImage([1]).path, volume: 'v', name: 'b', chunkSize: CHUNK });
    const chunkSize = 32 * 1024 * 1024;
    rewriteManifest(target, { ...m, chunkSize, sizeBytes: chunkSize, chunks: [m.chunks[1] ?? null], chunkListSha256: m.chunkListSha256 });
    await assert.rejects(verifyBackup({ target, name: 'b' }), /corrupted: bad size or chunk size/);
    await assert.rejects(createBackup({ target, source: makeImage([1]).path, volume: 'v', name: 'c', chunkSize }), /up to 16777216/);
  });

  it("a manifest's base snapshot is a name and an ID, and nothing else: anything else is corrupt", async () => {
    const target = freshTarget();
    const baseSnapshot = { name: 'latch-base-b', id: '10e5b2ae8944@12' };
    const m = await createBackup({ target, source: makeImage([1]).path, volume: 'v', name: 'b', chunkSize: CHUNK, baseSnapshot });
    assert.deepEqual((await readManifest(target, 'b')).baseSnapshot, baseSnapshot);
    for (const bad of [
      { name: 'latch-base-b' },
      { name: '', id: '1@2' },
      { name: 'latch-base-b', id: 'x y' },
      { name: 'latch-base-b', id: '1@2', other: 1 },
      'latch-base-b',
      null,
    ]) {
      rewriteManifest(target, { ...m, baseSnapshot: bad as never });
      await assert.rejects(readManifest(target, 'b'), /corrupted: bad baseSnapshot/, JSON.stringify(bad));
    }
  });
});

describe('modes under the target', () => {
  /** Every file and directory below the target (not the target itself: it is the admin's), with its mode and what it should be. */
  function modes(root: string): { path: string; mode: string; wanted: string }[] {
    const found: { path: string; mode: string; wanted: string }[] = [];
    const walk = (dir: string) => {
      for (const entry of readdirSync(dir, { withFileTypes: true })) {
        const path = join(dir, entry.name);
        found.push({
          path: path.slice(root.length),
          mode: (lstatSync(path).mode & 0o7777).toString(8),
          wanted: entry.isDirectory() ? '700' : '600',
        });
        if (entry.isDirectory()) walk(path);
      }
    };
    walk(root);
    return found;
  }

  it('every file latch writes is 0600 and every directory 0700, the lock too, whatever the umask', async () => {
    const target = freshTarget();
    const previous = process.umask(0);
    try {
      const seenWhileWriting: { path: string; mode: string; wanted: string }[] = [];
      await createBackup({
        target,
        source: makeImage(DATA).path,
        volume: 'v',
        name: 'one',
        chunkSize: CHUNK,
        onChunk: (index) => {
          if (index === 20) seenWhileWriting.push(...modes(target.path));
        },
      });
      assert.ok(
        seenWhileWriting.some(({ path }) => path === '/lock'),
        'the lock was there while the backup ran',
      );
      assert.deepEqual(
        seenWhileWriting.filter(({ mode, wanted }) => mode !== wanted),
        [],
      );
      await createBackup({ target, source: makeImage([1, 2, 50]).path, volume: 'v', name: 'two', chunkSize: CHUNK });
      await deleteBackup({ target, name: 'one' });
      const after = modes(target.path);
      assert.ok(after.length > 5, `${after.length} entries`);
      assert.deepEqual(
        after.filter(({ mode, wanted }) => mode !== wanted),
        [],
      );
    } finally {
      process.umask(previous);
    }
  });

  it("an older target's chunks/ and backups/ (0755) are made 0700 by the next writer, which closes what is below them", async () => {
    const target = freshTarget();
    await createBackup({ target, source: makeImage([1]).path, volume: 'v', name: 'old', chunkSize: CHUNK });
    for (const dir of ['chunks', 'backups']) chmodSync(join(target.path, dir), 0o755);
    await collectGarbage({ target });
    for (const dir of ['chunks', 'backups']) assert.equal(statSync(join(target.path, dir)).mode & 0o777, 0o700, dir);
    for (const dir of ['chunks', 'backups']) chmodSync(join(target.path, dir), 0o755);
    await createBackup({ target, source: makeImage([2]).path, volume: 'v', name: 'new', chunkSize: CHUNK });
    for (const dir of ['chunks', 'backups']) assert.equal(statSync(join(target.path, dir)).mode & 0o777, 0o700, dir);
  });
});

describe('manifests authenticated with the backup key', () => {
  it('a backup made with a key is authenticated; its manifest holds an HMAC and the key id, never the key', async () => {
    const key = makeKeyFile();
    const target: BackupTarget = { ...freshTarget(), keyFile: key.path };
    const image = makeImage([1, 5]);
    await createBackup({ target, source: image.path, volume: 'v', name: 'b', chunkSize: CHUNK });
    const text = readFileSync(join(target.path, 'backups', 'b.json'), 'utf8');
    const stored = JSON.parse(text) as Record<string, unknown>;
    assert.match(String(stored.hmacSha256), /^[0-9a-f]{64}$/);
    assert.match(String(stored.keyId), /^[0-9a-f]{16}$/);
    assert.equal(stored.checksum, undefined);
    assert.ok(!text.includes(key.text.trim()), 'the key is not in the manifest');
    assert.deepEqual(
      (await listBackups(target)).map((b) => [b.name, b.authenticated]),
      [['b', true]],
    );
    const verify = await verifyBackup({ target, name: 'b' });
    assert.deepEqual([verify.ok, verify.authenticated], [true, true]);
    const out = join(freshDir('restore'), 'x.img');
    assert.equal((await restoreBackup({ target, name: 'b', destination: out })).authenticated, true);
    assert.ok(readFileSync(out).equals(image.bytes));
    // Without the key (another node's configuration lacks it), it cannot be checked and is not used.
    await assert.rejects(verifyBackup({ target: { type: 'dir', path: target.path }, name: 'b' }), /no backup key is configured here/);
  });

  it("a manifest rewritten by someone without the key is refused by verify and restore: another volume's chunks behind a fixed-up sha256, a changed body with the old HMAC, another key's HMAC", async () => {
    const key = makeKeyFile();
    const target: BackupTarget = { ...freshTarget(), keyFile: key.path };
    const a = await createBackup({ target, source: makeImage([1, 2]).path, volume: 'a', name: 'a', chunkSize: CHUNK });
    const b = await createBackup({ target, source: makeImage([3, 4]).path, volume: 'b', name: 'b', chunkSize: CHUNK });
    const path = join(target.path, 'backups', 'b.json');
    const original = readFileSync(path, 'utf8');
    const swapped: Manifest = { ...b, chunks: a.chunks, chunkListSha256: a.chunkListSha256 };
    const out = join(freshDir('restore'), 'x.img');

    // 1. What anyone could always do: a well-formed manifest with an unkeyed sha256.
    rewriteManifest(target, swapped);
    await assert.rejects(
      verifyBackup({ target, name: 'b' }),
      /backup b .* is not authenticated .* a backup key is configured, so it is refused/,
    );
    await assert.rejects(restoreBackup({ target, name: 'b', destination: out }), /is not authenticated/);
    await assert.rejects(readManifest(target, 'b'), /is not authenticated/);
    assert.ok(!existsSync(out), 'nothing was written');
    assert.deepEqual(
      (await listBackups(target)).map((l) => [l.name, l.authenticated]),
      [
        ['a', true],
        ['b', false],
      ],
    );

    // 2. The authentic manifest's HMAC kept, its chunk list replaced.
    const stored = JSON.parse(original) as Record<string, unknown>;
    writeFileSync(path, JSON.stringify({ ...stored, chunks: a.chunks, chunkListSha256: a.chunkListSha256 }));
    await assert.rejects(
      verifyBackup({ target, name: 'b' }),
      /is not authentic: its authentication code does not match the configured key;/,
    );
    await assert.rejects(restoreBackup({ target, name: 'b', destination: out }), /is not authentic/);

    // 3. Signed with a key of the forger's own.
    const forger: BackupTarget = { type: 'dir', path: freshDir('forger'), keyFile: makeKeyFile().path };
    await createBackup({ target: forger, source: makeImage([1, 2]).path, volume: 'b', name: 'b', chunkSize: CHUNK });
    copyFileSync(join(forger.path, 'backups', 'b.json'), path);
    await assert.rejects(
      verifyBackup({ target, name: 'b' }),
      /does not match the configured key \(it names key [0-9a-f]{16}, the configured key is [0-9a-f]{16}\)/,
    );
    await assert.rejects(restoreBackup({ target, name: 'b', destination: out }), /is not authentic/);
    assert.ok(!existsSync(out), 'nothing was written');

    writeFileSync(path, original);
    assert.equal((await verifyBackup({ target, name: 'b' })).ok, true);
  });

  it('an old unauthenticated backup is read and flagged without a key; with one, it is listed but refused until signed', async () => {
    const plain = freshTarget();
    const image = makeImage([1, 9]);
    await createBackup({ target: plain, source: image.path, volume: 'v', name: 'old', chunkSize: CHUNK });
    await createBackup({ target: plain, source: makeImage([2]).path, volume: 'v', name: 'damaged', chunkSize: CHUNK });
    assert.match(readFileSync(join(plain.path, 'backups', 'old.json'), 'utf8'), /"checksum":"[0-9a-f]{64}"/);
    assert.deepEqual(
      (await listBackups(plain)).map((b) => [b.name, b.authenticated]),
      [
        ['old', false],
        ['damaged', false],
      ],
    );
    const verify = await verifyBackup({ target: plain, name: 'old' });
    assert.deepEqual([verify.ok, verify.authenticated], [true, false]);
    const out = join(freshDir('restore'), 'old.img');
    assert.equal((await restoreBackup({ target: plain, name: 'old', destination: out })).authenticated, false);
    assert.ok(readFileSync(out).equals(image.bytes));

    const target: BackupTarget = { ...plain, keyFile: makeKeyFile().path };
    assert.deepEqual(
      (await listBackups(target)).map((b) => [b.name, b.authenticated, b.error]),
      [
        ['old', false, undefined],
        ['damaged', false, undefined],
      ],
    );
    await assert.rejects(verifyBackup({ target, name: 'old' }), /not authenticated .* sign it once: latch backup authenticate old/);
    await assert.rejects(restoreBackup({ target, name: 'old', destination: join(freshDir('restore'), 'x.img') }), /not authenticated/);

    await assert.rejects(authenticateBackup({ target: plain, name: 'old' }), /no backup key is configured/);
    assert.deepEqual(await authenticateBackup({ target, name: 'old' }).then((r) => [r.signed, r.verify?.ok]), [true, true]);
    assert.deepEqual(await authenticateBackup({ target, name: 'old' }), { signed: false });
    const signed = await verifyBackup({ target, name: 'old' });
    assert.deepEqual([signed.ok, signed.authenticated], [true, true]);
    const again = join(freshDir('restore'), 'old.img');
    await restoreBackup({ target, name: 'old', destination: again });
    assert.ok(readFileSync(again).equals(image.bytes));

    // A damaged one is not signed.
    const m = readManifestUnchecked(plain, 'damaged');
    writeFileSync(chunkPath(target, m.chunks[2] as string), randomBytes(100));
    const refused = await authenticateBackup({ target, name: 'damaged' });
    assert.deepEqual([refused.signed, refused.verify?.ok], [false, false]);
    assert.match(readFileSync(join(plain.path, 'backups', 'damaged.json'), 'utf8'), /"checksum"/);
  });

  it("refuses a key file that others can read or write, that is a link, not root's, too short or missing; the key is in no message", async () => {
    const cases: [string, (path: string) => void, RegExp][] = [
      ['group-readable', (path) => chmodSync(path, 0o640), /is readable or writable by others \(mode 640\); chmod 600 it/],
      ['world-writable', (path) => chmodSync(path, 0o602), /readable or writable by others/],
      [
        'a symbolic link',
        (path) => {
          const real = `${path}.real`;
          copyFileSync(path, real);
          unlinkSync(path);
          symlinkSync(real, path);
        },
        /is a symbolic link/,
      ],
      ['too short', (path) => writeFileSync(path, 'short-key\n'), /holds fewer than 32 bytes of key/],
      ['missing', (path) => unlinkSync(path), /does not exist/],
      [
        'a directory',
        (path) => {
          unlinkSync(path);
          mkdirSync(path, { mode: 0o700 });
        },
        /is not a regular file/,
      ],
    ];
    if (process.getuid?.() === 0)
      cases.push(['owned by another user', (path) => chownSync(path, 1000, 1000), /is owned by uid 1000, not by uid 0/]);
    for (const [what, spoil, message] of cases) {
      const key = makeKeyFile();
      spoil(key.path);
      const target: BackupTarget = { ...freshTarget(), keyFile: key.path };
      const refusal = await createBackup({ target, source: makeImage([1]).path, volume: 'v', name: 'b', chunkSize: CHUNK }).then(
        () => assert.fail(`${what}: the backup went ahead`),
        (err: Error) => err.message,
      );
      assert.match(refusal, message, what);
      assert.match(refusal, /^the backup key file .* \(backupTarget\.keyFile\)/, what);
      assert.ok(!refusal.includes(key.text.trim()), `${what}: the key is not in the message`);
      assert.deepEqual(storedChunks(target), [], `${what}: nothing was written`);
      await assert.rejects(listBackups(target), message, what);
    }
  });
});

/** A manifest's contents, without any check (the test's own view of the file). */
function readManifestUnchecked(target: BackupTarget, name: string): Manifest {
  return JSON.parse(readFileSync(join(target.path, 'backups', `${name}.json`), 'utf8')) as Manifest;
}

// The S3 backup target (src/backup/s3-store.ts, s3-lock.ts) against a real S3 server: Ceph's RADOS Gateway on the
// one-host test cluster (test/ceph/rgw.ts). Round trip, dedup and incremental, verify, gc and delete; then bad input
// and faults: wrong credentials, a missing bucket, the gateway stopped mid-upload, objects altered in the bucket, and
// a SIGKILL of the process making a backup or a restore. Each is a clear failure, nothing half-made is listed, and
// the next run completes.
import assert from 'node:assert/strict';
import { spawn, spawnSync, execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { CreateBucketCommand, PutObjectCommand, S3Client } from '@aws-sdk/client-s3';
import { missingChunk } from '../../src/backup/chunks.js';
import { createBackup } from '../../src/backup/create.js';
import { collectGarbage, deleteBackup } from '../../src/backup/delete.js';
import type { DirTarget, S3Target } from '../../src/backup/layout.js';
import { listBackups } from '../../src/backup/manifest.js';
import { restoreBackup } from '../../src/backup/restore.js';
import { storeOf } from '../../src/backup/store.js';
import { verifyBackup } from '../../src/backup/verify.js';
import { cephSkipReason, startCephCluster, type CephCluster } from '../ceph/cluster.js';
import { rgwSkipReason, startRgw, type Rgw } from '../ceph/rgw.js';
import { bundleForNode } from '../fixtures/bundle.js';

const CHUNK = 256 * 1024;
const skip = cephSkipReason() ?? rgwSkipReason();
let ceph: CephCluster | undefined;
let rgw: Rgw;
let s3: S3Client;
let work: string;
let workerJs: string;
let readerJs: string;
let buckets = 0;

before(async () => {
  if (skip) return;
  work = mkdtempSync(join(tmpdir(), 'latch-backup-s3-'));
  workerJs = await bundleForNode('test/fixtures/backup-worker.ts', join(work, 'backup-worker.cjs'));
  readerJs = await bundleForNode('test/fixtures/backup-reader.ts', join(work, 'backup-reader.cjs'));
  ceph = await startCephCluster();
  rgw = await startRgw(ceph);
  s3 = new S3Client({
    endpoint: rgw.endpoint,
    region: 'us-east-1',
    forcePathStyle: true,
    credentials: { accessKeyId: rgw.accessKeyId, secretAccessKey: rgw.secretAccessKey },
  });
});

after(async () => {
  s3?.destroy();
  await ceph?.stop();
  if (work) rmSync(work, { recursive: true, force: true });
});

let counter = 0;
const fresh = (what: string) => mkdtempSync(join(work, `${what}-${counter++}-`));

function keyFile(): string {
  const path = join(fresh('key'), 'backup.key');
  writeFileSync(path, `${randomBytes(48).toString('base64')}\n`, { mode: 0o600 });
  return path;
}

/** A new bucket, and an S3 target in it (encrypted with a key of its own unless told otherwise). */
async function s3Target(options: { key?: boolean; prefix?: string } = {}): Promise<S3Target> {
  const bucket = `latch-test-${buckets++}`;
  await s3.send(new CreateBucketCommand({ Bucket: bucket }));
  return {
    type: 's3',
    endpoint: rgw.endpoint,
    bucket,
    prefix: options.prefix ?? 'cluster-a/',
    credentialsFile: rgw.credentialsFile,
    ...(options.key !== false && { keyFile: keyFile() }),
  };
}

/** An image of `chunks` chunks, each half random and half a fill byte (compressible), sparse where `holes` says. */
function image(chunks: number, holes: number[] = []): { path: string; bytes: Buffer } {
  const bytes = Buffer.alloc(chunks * CHUNK);
  for (let i = 0; i < chunks; i++) {
    if (holes.includes(i)) continue;
    randomBytes(CHUNK / 2).copy(bytes, i * CHUNK);
    bytes.fill(i + 1, i * CHUNK + CHUNK / 2, (i + 1) * CHUNK);
  }
  const path = join(fresh('image'), 'v.img');
  writeFileSync(path, bytes);
  return { path, bytes };
}

const sha256 = (data: Buffer) => createHash('sha256').update(data).digest('hex');

async function objects(target: S3Target, prefix: string): Promise<string[]> {
  return (await (await storeOf(target)).list(prefix)).map((o) => o.key);
}

describe('backups to S3 (Ceph RADOS Gateway)', { skip }, () => {
  it('round trip, dedup and incremental, verify, gc and delete: the layout of a directory target, below the prefix', async () => {
    const target = await s3Target();
    const src = image(8, [3]);
    const first = await createBackup({ target, source: src.path, volume: 'v', name: 'one', chunkSize: CHUNK });
    assert.deepEqual([first.format, first.stats.newChunks, first.stats.holeChunks], ['latch-backup/v3', 7, 1]);
    const out = join(fresh('restore'), 'x.img');
    const report = await restoreBackup({ target, name: 'one', destination: out });
    assert.deepEqual([report.authenticated, report.encrypted], [true, true]);
    assert.equal(sha256(readFileSync(out)), sha256(src.bytes), 'restored byte for byte');

    // Incremental: one chunk changed, only it is stored again; another volume with the same data stores nothing.
    randomBytes(100).copy(src.bytes, 5 * CHUNK);
    writeFileSync(src.path, src.bytes);
    const second = await createBackup({ target, source: src.path, volume: 'v', name: 'two', chunkSize: CHUNK });
    assert.deepEqual([second.stats.newChunks, second.stats.presentChunks, second.parent], [1, 6, 'one']);
    const copy = await createBackup({ target, source: src.path, volume: 'w', name: 'three', chunkSize: CHUNK });
    assert.equal(copy.stats.newChunks, 0);
    assert.deepEqual(
      (await listBackups(target)).map((b) => [b.name, b.authenticated]),
      [
        ['one', true],
        ['two', true],
        ['three', true],
      ],
    );
    assert.equal((await verifyBackup({ target, name: 'two' })).ok, true);
    // The look-up of the chunks an incremental backup builds on: a shard with two IDs sought is listed (one request
    // names its objects), a lone ID is looked up (a HEAD); a missing one is found either way.
    const held = second.chunks.filter((c): c is string => c !== null);
    assert.equal(await missingChunk(target, held), undefined);
    const beside = `${(held[0] as string).slice(0, 2)}${'0'.repeat(62)}`;
    assert.equal(await missingChunk(target, [...held, beside]), beside, 'found by the listing of its shard');
    assert.equal(await missingChunk(target, [...held.slice(1), `ff${'0'.repeat(62)}`]), `ff${'0'.repeat(62)}`);
    const keys = await objects(target, '');
    assert.ok(keys.includes('backups/one.json') && keys.includes('lock'), keys.join(' '));
    assert.ok(keys.filter((k) => k.startsWith('chunks/')).every((k) => /^chunks\/[0-9a-f]{2}\/[0-9a-f]{64}$/.test(k)));

    // gc with every chunk needed removes nothing; delete removes what only that backup needed.
    assert.equal((await collectGarbage({ target })).removedChunks, 0);
    const gone = await deleteBackup({ target, name: 'one' });
    assert.equal(gone.removedChunks, 1, 'the chunk only "one" had');
    await deleteBackup({ target, name: 'two' });
    await deleteBackup({ target, name: 'three' });
    assert.deepEqual(await objects(target, 'chunks/'), []);
    assert.deepEqual(await listBackups(target), []);
    await assert.rejects(deleteBackup({ target, name: 'one' }), /backup one does not exist in s3:\/\/latch-test-\d+\/cluster-a\//);
  });

  it('the built executable lists, verifies and deletes S3 backups (the S3 client evaluated from the bundle on first use)', async () => {
    const target = await s3Target();
    await createBackup({ target, source: image(3).path, volume: 'v', name: 'cli', chunkSize: CHUNK });
    const dir = fresh('cli');
    const config = join(dir, 'config.json');
    writeFileSync(
      config,
      JSON.stringify({ nodeName: 'node-a', stateDir: join(dir, 'state'), logFile: join(dir, 'latch.log'), backupTarget: target }),
    );
    const latch = (...args: string[]) => {
      const done = spawnSync(process.execPath, [join(__dirname, '../../bin/latch'), ...args], {
        encoding: 'utf8',
        env: { ...process.env, LATCH_CONFIG: config },
        timeout: 60_000,
      });
      assert.deepEqual([done.status, done.stderr], [0, ''], `latch ${args.join(' ')}: exit 0, nothing on stderr`);
      return done.stdout;
    };
    const listed = JSON.parse(latch('backup', 'list', '-o', 'json')) as { name: string; authenticated: boolean }[];
    assert.deepEqual(
      listed.map((b) => [b.name, b.authenticated]),
      [['cli', true]],
    );
    assert.match(
      latch('backup', 'verify', 'cli'),
      /^backup cli of volume v is intact: 3 chunk\(s\) read back and decrypted, image checksum matches, manifest authenticated/,
    );
    latch('backup', 'delete', 'cli');
    assert.deepEqual(await listBackups(target), []);
  });

  it('measures: an S3 backup against a directory backup of the same data, and a restore from S3, checksummed', async (t) => {
    const src = image(128); // 32 MiB
    const key = keyFile();
    const dir: DirTarget = { type: 'dir', path: fresh('target'), keyFile: key };
    const target = { ...(await s3Target()), keyFile: key };
    const time = async (fn: () => Promise<unknown>) => {
      const started = performance.now();
      await fn();
      return performance.now() - started;
    };
    const dirMs = await time(() => createBackup({ target: dir, source: src.path, volume: 'v', name: 'm', chunkSize: CHUNK }));
    const s3Ms = await time(() => createBackup({ target, source: src.path, volume: 'v', name: 'm', chunkSize: CHUNK }));
    const out = join(fresh('restore'), 'x.img');
    const restoreMs = await time(() => restoreBackup({ target, name: 'm', destination: out }));
    assert.equal(sha256(readFileSync(out)), sha256(src.bytes));
    const mib = src.bytes.length / 1024 ** 2;
    t.diagnostic(
      `32 MiB, 256 KiB chunks, encrypted: dir ${dirMs.toFixed(0)} ms, S3 ${s3Ms.toFixed(0)} ms (ratio ${(s3Ms / dirMs).toFixed(2)}), ` +
        `restore from S3 ${restoreMs.toFixed(0)} ms (${(mib / (restoreMs / 1000)).toFixed(0)} MiB/s), sha256 matches`,
    );
  });

  it('wrong credentials, a missing bucket, an unusable credentials file: clear refusals that name no secret, nothing written', async () => {
    const target = await s3Target();
    const src = image(2);
    const wrongFile = join(fresh('creds'), 'wrong.json');
    const wrongSecret = randomBytes(20).toString('hex');
    writeFileSync(wrongFile, JSON.stringify({ accessKeyId: rgw.accessKeyId, secretAccessKey: wrongSecret }), { mode: 0o600 });
    const wrong = { ...target, credentialsFile: wrongFile };
    const refusal = await createBackup({ target: wrong, source: src.path, volume: 'v', name: 'b', chunkSize: CHUNK }).then(
      () => assert.fail('went ahead'),
      (err: Error) => err.message,
    );
    assert.match(refusal, /refused the credentials while checking the bucket \(SignatureDoesNotMatch, HTTP 403\)/);
    for (const secret of [wrongSecret, rgw.secretAccessKey]) assert.ok(!refusal.includes(secret), 'no secret in the message');
    const unknownFile = join(fresh('creds'), 'unknown.json');
    writeFileSync(unknownFile, JSON.stringify({ accessKeyId: 'NOSUCHKEY0000000000X', secretAccessKey: wrongSecret }), { mode: 0o600 });
    await assert.rejects(
      createBackup({ target: { ...target, credentialsFile: unknownFile }, source: src.path, volume: 'v', name: 'b' }),
      /refused the credentials .*InvalidAccessKeyId/,
    );

    await assert.rejects(
      createBackup({ target: { ...target, bucket: 'no-such-bucket' }, source: src.path, volume: 'v', name: 'b' }),
      /the bucket no-such-bucket does not exist at http:\/\/127\.0\.0\.1:\d+ .*create it first; latch never creates it/,
    );
    chmodSync(wrongFile, 0o644);
    await assert.rejects(
      createBackup({ target: { ...wrong }, source: src.path, volume: 'v', name: 'b' }),
      /credentials file .* is readable or writable by others \(mode 644\)/,
    );
    const secretDir = fresh('secret');
    writeFileSync(join(secretDir, 'accessKeyId'), rgw.accessKeyId, { mode: 0o400 });
    writeFileSync(join(secretDir, 'secretAccessKey'), rgw.secretAccessKey, { mode: 0o400 });
    const fromDir: S3Target = { ...target, credentialsFile: undefined, credentialsDir: secretDir };
    await createBackup({ target: fromDir, source: src.path, volume: 'v', name: 'from-secret-dir', chunkSize: CHUNK });
    assert.deepEqual(
      (await listBackups(target)).map((b) => b.name),
      ['from-secret-dir'],
    );
  });

  it('the gateway stopped mid-upload: a clear failure, no backup listed; once it is back, the next run completes', async () => {
    const target = await s3Target();
    const src = image(24);
    let stopped = false;
    const failure = await createBackup({
      target,
      source: src.path,
      volume: 'v',
      name: 'b',
      chunkSize: CHUNK,
      onChunk: async (index) => {
        if (index === 6 && !stopped) {
          stopped = true;
          await rgw.stop();
        }
      },
    }).then(
      () => assert.fail('the backup completed without its store'),
      (err: Error) => err.message,
    );
    assert.match(failure, /the S3 target s3:\/\/latch-test-\d+\/cluster-a\/ at .* did not answer while .* \(ECONNREFUSED\)/);
    await rgw.start();
    // The test's own client: its connections went with the old gateway.
    s3.destroy();
    s3 = new S3Client({
      endpoint: rgw.endpoint,
      region: 'us-east-1',
      forcePathStyle: true,
      credentials: { accessKeyId: rgw.accessKeyId, secretAccessKey: rgw.secretAccessKey },
    });
    assert.deepEqual(await listBackups(target), [], 'nothing listed');
    const done = await createBackup({ target, source: src.path, volume: 'v', name: 'b', chunkSize: CHUNK });
    assert.equal(done.stats.dataChunks, 24);
    assert.ok(done.stats.presentChunks > 0, 'the chunks stored before the failure are reused');
    assert.deepEqual(
      (await listBackups(target)).map((b) => b.name),
      ['b'],
    );
    assert.equal((await verifyBackup({ target, name: 'b' })).ok, true);
  });

  it('a chunk or a manifest altered in the bucket: verify names it, restore refuses', async () => {
    // (The first bucket made after the gateway's restart takes ~30 s: the gateway notifies its peers' caches of the
    // change, and the killed instance's RADOS watch lingers until the OSD times it out. Objects are not affected.)
    const target = await s3Target();
    const m = await createBackup({ target, source: image(4).path, volume: 'v', name: 'b', chunkSize: CHUNK });
    const id = m.chunks[2] as string;
    const chunkObject = `${target.prefix}chunks/${id.slice(0, 2)}/${id}`;
    const store = await storeOf(target);
    const original = await store.get(`chunks/${id.slice(0, 2)}/${id}`, 10 * CHUNK);
    assert.ok(original.found && 'data' in original);
    const altered = Buffer.from(original.data);
    altered[100] = (altered[100] ?? 0) ^ 1;
    await s3.send(new PutObjectCommand({ Bucket: target.bucket, Key: chunkObject, Body: altered }));
    const verify = await verifyBackup({ target, name: 'b' });
    assert.equal(verify.ok, false);
    assert.match(verify.problems[0]?.detail ?? '', /fails authentication/);
    await assert.rejects(restoreBackup({ target, name: 'b', destination: join(fresh('restore'), 'x.img') }), /chunk 2 .* is corrupt/);
    await s3.send(new PutObjectCommand({ Bucket: target.bucket, Key: chunkObject, Body: original.data }));
    assert.equal((await verifyBackup({ target, name: 'b' })).ok, true);

    const manifest = await store.get('backups/b.json', 1024 * 1024);
    assert.ok(manifest.found && 'data' in manifest);
    const text = manifest.data.toString('utf8').replace('"volume":"v"', '"volume":"w"');
    await s3.send(new PutObjectCommand({ Bucket: target.bucket, Key: `${target.prefix}backups/b.json`, Body: text }));
    const out = join(fresh('restore'), 'x.img');
    await assert.rejects(restoreBackup({ target, name: 'b', destination: out }), /is not authentic/);
    assert.ok(!existsSync(out), 'nothing written');
  });

  it('the lock on S3: two writers take turns; a live holder elsewhere makes a third busy; a stale one is taken over; a writer that lost it publishes nothing', async () => {
    const target = await s3Target();
    const src = image(6);
    // Two target objects: two stores and clients, as two nodes would have.
    await Promise.all(
      ['a', 'b'].map((name) => createBackup({ target: { ...target }, source: src.path, volume: 'v', name, chunkSize: CHUNK })),
    );
    assert.deepEqual((await listBackups(target)).map((b) => b.name).sort(), ['a', 'b']);

    const lockKey = `${target.prefix}lock`;
    const otherNode = JSON.stringify({
      owner: {
        node: 'node-z',
        host: 'elsewhere',
        pid: 1,
        purpose: 'backup x of volume y',
        startedAt: new Date().toISOString(),
        token: 'f'.repeat(24),
      },
      beat: 0,
    });
    await s3.send(new PutObjectCommand({ Bucket: target.bucket, Key: lockKey, Body: otherNode }));
    await assert.rejects(
      createBackup({ target, source: src.path, volume: 'v', name: 'c', chunkSize: CHUNK, lock: { waitMs: 1_000 } }),
      /is busy: backup x of volume y on node node-z .*delete the object cluster-a\/lock in the bucket/,
    );
    await new Promise((r) => setTimeout(r, 2_100));
    await createBackup({
      target,
      source: src.path,
      volume: 'v',
      name: 'c',
      chunkSize: CHUNK,
      lock: { waitMs: 1_000, staleAfterMs: 1_000 },
    });

    const lost = await createBackup({
      target,
      source: src.path,
      volume: 'v',
      name: 'd',
      chunkSize: CHUNK,
      onChunk: async (index) => {
        if (index === 1) await s3.send(new PutObjectCommand({ Bucket: target.bucket, Key: lockKey, Body: otherNode }));
      },
    }).then(
      () => assert.fail('published without the lock'),
      (err: Error) => err.message,
    );
    assert.match(lost, /lost the lock of the backup target .* nothing was published/);
    assert.deepEqual((await listBackups(target)).map((b) => b.name).sort(), ['a', 'b', 'c']);
  });

  it('a SIGKILL of the process making a backup, then of one restoring: the next run completes; nothing half-made is listed', async () => {
    const target = await s3Target();
    const src = image(40);
    const targetJson = JSON.stringify(target);
    const child = spawn(process.execPath, [workerJs, targetJson, src.path, 'v', 'b', String(CHUNK)], { stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    await new Promise<void>((resolve, reject) => {
      child.stdout.on('data', (data: Buffer) => {
        output += data.toString();
        if (output.includes('chunk 10\n')) {
          child.kill('SIGKILL');
          resolve();
        }
      });
      child.on('exit', () => (output.includes('chunk 10') ? undefined : reject(new Error(`the worker ended early: ${output}`))));
    });
    await new Promise((r) => child.once('exit', r));
    assert.ok(!output.includes('done'));
    assert.deepEqual(await listBackups(target), [], 'nothing listed');
    // Its lock (a process of this host that is gone) is taken over at once, not after 10 minutes.
    const done = await createBackup({ target, source: src.path, volume: 'v', name: 'b', chunkSize: CHUNK, lock: { waitMs: 5_000 } });
    assert.ok(done.stats.presentChunks > 0, 'the killed run’s chunks are reused');
    assert.equal((await collectGarbage({ target })).removedChunks, 0);

    const out = join(fresh('restore'), 'x.img');
    const reader = spawn(process.execPath, [readerJs, 'restore', targetJson, 'b', out], { stdio: 'ignore' });
    await new Promise((r) => setTimeout(r, 300));
    reader.kill('SIGKILL');
    await new Promise((r) => reader.once('exit', r));
    const again = JSON.parse(
      execFileSync(process.execPath, [readerJs, 'restore', targetJson, 'b', `${out}.2`], { encoding: 'utf8', timeout: 120_000 }),
    ) as { report?: { bytesWritten: number } };
    assert.equal(again.report?.bytesWritten, src.bytes.length);
    assert.equal(sha256(readFileSync(`${out}.2`)), sha256(src.bytes));
  });
});

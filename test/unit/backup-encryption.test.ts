// Encryption at rest (src/backup/codec.ts, keys.ts, manifest.ts: latch-backup/v3) on a directory target: what the
// target holds reveals nothing, dedup works within one key, and every way the stored bytes or the key can be wrong is
// a refusal, never wrong data.
import assert from 'node:assert/strict';
import { after, describe, it } from 'node:test';
import { randomBytes, createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync, existsSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createBackup } from '../../src/backup/create.js';
import { restoreBackup } from '../../src/backup/restore.js';
import { verifyBackup } from '../../src/backup/verify.js';
import { listBackups, readManifest } from '../../src/backup/manifest.js';
import { chunkPath, type DirTarget } from '../../src/backup/layout.js';
import { backupKey } from '../../src/backup/keys.js';
import { codecForWriting, SEAL_OVERHEAD } from '../../src/backup/codec.js';

const CHUNK = 64 * 1024;
const work = mkdtempSync(join(tmpdir(), 'latch-backup-encryption-'));
after(() => rmSync(work, { recursive: true, force: true }));
let counter = 0;
const fresh = (what: string) => mkdtempSync(join(work, `${what}-${counter++}-`));

function keyFile(): string {
  const path = join(fresh('key'), 'backup.key');
  writeFileSync(path, `${randomBytes(48).toString('base64')}\n`, { mode: 0o600 });
  return path;
}

/** An image of 8 chunks: chunk i (in `data`) holds a recognisable text and a sha256 of it; the rest zeros. */
function image(data: number[], seed = 'x'): { path: string; bytes: Buffer } {
  const bytes = Buffer.alloc(8 * CHUNK);
  for (const i of data) bytes.fill(`secret volume text ${seed} ${i} `, i * CHUNK, (i + 1) * CHUNK);
  const path = join(fresh('image'), 'v.img');
  writeFileSync(path, bytes);
  return { path, bytes };
}

function storedFiles(target: DirTarget): string[] {
  const dir = join(target.path, 'chunks');
  return readdirSync(dir).flatMap((shard) => readdirSync(join(dir, shard)).map((f) => join(dir, shard, f)));
}

const sha256 = (data: Buffer) => createHash('sha256').update(data).digest('hex');

describe('backups encrypted with the target key', () => {
  it('with a key, chunks are encrypted and named by keyed IDs: the target holds neither the data nor its sha256s; the round trip is exact', async () => {
    const target: DirTarget = { type: 'dir', path: fresh('target'), keyFile: keyFile() };
    const src = image([0, 3, 5]);
    const m = await createBackup({ target, source: src.path, volume: 'v', name: 'b', chunkSize: CHUNK });
    assert.equal(m.format, 'latch-backup/v3');
    assert.deepEqual(m.encryption, { cipher: 'aes-256-gcm', kdf: 'hkdf-sha256', chunkIds: 'hmac-sha256' });
    const plainIds = [0, 3, 5].map((i) => sha256(src.bytes.subarray(i * CHUNK, (i + 1) * CHUNK)));
    for (const id of plainIds) assert.ok(!m.chunks.includes(id), 'no chunk is named by its sha256');
    for (const file of storedFiles(target)) {
      const stored = readFileSync(file);
      assert.ok(!stored.includes('secret volume text'), 'no plaintext in a stored chunk');
      assert.equal(stored[0], 1, 'the version byte');
    }
    assert.ok(!readFileSync(join(target.path, 'backups', 'b.json'), 'utf8').includes('secret volume'));
    const out = join(fresh('restore'), 'x.img');
    const report = await restoreBackup({ target, name: 'b', destination: out });
    assert.deepEqual([report.authenticated, report.encrypted], [true, true]);
    assert.ok(readFileSync(out).equals(src.bytes));
    const verify = await verifyBackup({ target, name: 'b' });
    assert.deepEqual([verify.ok, verify.encrypted], [true, true]);
  });

  it('dedup works within one key (a second backup and another volume store nothing new); another key names the same data differently', async () => {
    const key = keyFile();
    const target: DirTarget = { type: 'dir', path: fresh('target'), keyFile: key };
    const src = image([1, 2, 6]);
    await createBackup({ target, source: src.path, volume: 'v', name: 'one', chunkSize: CHUNK });
    const again = await createBackup({ target, source: src.path, volume: 'w', name: 'two', chunkSize: CHUNK });
    assert.deepEqual([again.stats.newChunks, again.stats.presentChunks], [0, 3]);
    const other: DirTarget = { type: 'dir', path: fresh('target'), keyFile: keyFile() };
    const theirs = await createBackup({ target: other, source: src.path, volume: 'v', name: 'one', chunkSize: CHUNK });
    const ours = await readManifest(target, 'one');
    assert.deepEqual(
      theirs.chunks.filter((c) => c !== null && ours.chunks.includes(c)),
      [],
      'no ID in common across keys',
    );
  });

  it('the same chunk sealed twice gets two random nonces: no nonce is reused, the ciphertexts differ, both open', async () => {
    const target: DirTarget = { type: 'dir', path: fresh('target'), keyFile: keyFile() };
    const codec = codecForWriting(await backupKey(target), undefined);
    const data = Buffer.alloc(CHUNK, 'same bytes ');
    const id = codec.id(data);
    const nonces = new Set<string>();
    const sealed: Buffer[] = [];
    for (let i = 0; i < 200; i++) {
      const s = await codec.seal(id, data);
      nonces.add(s.subarray(1, 13).toString('hex'));
      sealed.push(s);
    }
    assert.equal(nonces.size, 200, 'a fresh nonce each time');
    assert.ok(!sealed[0]?.equals(sealed[1] as Buffer));
    for (const s of sealed.slice(0, 3)) assert.deepEqual(await codec.open(id, s, CHUNK), { ok: true, data });
  });

  it('a tampered, truncated, swapped or foreign chunk is refused: verify names it, restore stops and writes no wrong data', async () => {
    const target: DirTarget = { type: 'dir', path: fresh('target'), keyFile: keyFile() };
    const m = await createBackup({ target, source: image([0, 1, 2, 3]).path, volume: 'v', name: 'b', chunkSize: CHUNK });
    const [a, b, c, d] = m.chunks as string[];
    const pathOf = (id: string) => chunkPath(target, id);
    const original = new Map([a, b, c, d].map((id) => [id as string, readFileSync(pathOf(id as string))]));
    const spoil: [string, (id: string) => void, RegExp][] = [
      [
        'one bit flipped in the ciphertext',
        (id) => {
          const bytes = Buffer.from(original.get(id) as Buffer);
          bytes[40] = (bytes[40] ?? 0) ^ 1;
          writeFileSync(pathOf(id), bytes);
        },
        /fails authentication \(AES-256-GCM\)/,
      ],
      ['truncated by its tag', (id) => writeFileSync(pathOf(id), (original.get(id) as Buffer).subarray(0, -16)), /fails authentication/],
      [
        'truncated to a few bytes',
        (id) => writeFileSync(pathOf(id), (original.get(id) as Buffer).subarray(0, 10)),
        /too few for an encrypted chunk/,
      ],
      [
        'another chunk copied under its name',
        (id) => writeFileSync(pathOf(id), original.get(id === a ? (b as string) : (a as string)) as Buffer),
        /fails authentication/,
      ],
      [
        'a nonce changed',
        (id) => {
          const bytes = Buffer.from(original.get(id) as Buffer);
          bytes[1] = (bytes[1] ?? 0) ^ 0xff;
          writeFileSync(pathOf(id), bytes);
        },
        /fails authentication/,
      ],
      [
        'an unknown version',
        (id) => {
          const bytes = Buffer.from(original.get(id) as Buffer);
          bytes[0] = 2;
          writeFileSync(pathOf(id), bytes);
        },
        /not an encrypted chunk of a version latch knows/,
      ],
    ];
    for (const [what, damage, detail] of spoil) {
      damage(c as string);
      const verify = await verifyBackup({ target, name: 'b' });
      assert.equal(verify.ok, false, what);
      assert.match(verify.problems[0]?.detail ?? '', detail, what);
      const out = join(fresh('restore'), 'x.img');
      await assert.rejects(restoreBackup({ target, name: 'b', destination: out }), /chunk 2 .* is corrupt .*must not be used/, what);
      // Only the chunks before the damaged one were written: never the damaged one's bytes.
      const written = readFileSync(out);
      assert.ok(written.subarray(2 * CHUNK, 3 * CHUNK).equals(Buffer.alloc(CHUNK)), `${what}: nothing of chunk 2 written`);
      writeFileSync(pathOf(c as string), original.get(c as string) as Buffer);
    }
    assert.equal((await verifyBackup({ target, name: 'b' })).ok, true, 'whole again');
    assert.ok(SEAL_OVERHEAD === 29);
  });

  it('a wrong key or none is a clear refusal before anything is written; the key is never in a message', async () => {
    const key = keyFile();
    const target: DirTarget = { type: 'dir', path: fresh('target'), keyFile: key };
    await createBackup({ target, source: image([0, 1]).path, volume: 'v', name: 'b', chunkSize: CHUNK });
    const out = join(fresh('restore'), 'x.img');
    const wrong: DirTarget = { ...target, keyFile: keyFile() };
    const refusal = await restoreBackup({ target: wrong, name: 'b', destination: out }).then(
      () => assert.fail('restored with the wrong key'),
      (err: Error) => err.message,
    );
    assert.match(refusal, /is not authentic: .* \(it names key [0-9a-f]{16}, the configured key is [0-9a-f]{16}\)/);
    assert.ok(!refusal.includes(readFileSync(key, 'utf8').trim()));
    assert.ok(!existsSync(out), 'nothing written');
    await assert.rejects(
      restoreBackup({ target: { type: 'dir', path: target.path }, name: 'b', destination: out }),
      /no backup key is configured here/,
    );
    assert.ok(!existsSync(out), 'nothing written');
    assert.match((await listBackups(wrong))[0]?.error ?? '', /not authentic/);
  });

  it('a key file replaced while a backup runs: the backup is whole under the key it started with, and refused under the new one', async () => {
    const key = keyFile();
    const oldKey = readFileSync(key);
    const target: DirTarget = { type: 'dir', path: fresh('target'), keyFile: key };
    const src = image([0, 2]);
    await createBackup({
      target,
      source: src.path,
      volume: 'v',
      name: 'b',
      chunkSize: CHUNK,
      beforePublish: async () => writeFileSync(key, `${randomBytes(48).toString('base64')}\n`),
    });
    await assert.rejects(verifyBackup({ target, name: 'b' }), /is not authentic/);
    writeFileSync(key, oldKey);
    const out = join(fresh('restore'), 'x.img');
    await restoreBackup({ target, name: 'b', destination: out });
    assert.ok(readFileSync(out).equals(src.bytes));
  });

  it('old unencrypted backups stay readable beside encrypted ones, flagged as not encrypted; encrypt: false keeps new chunks in the clear', async () => {
    const path = fresh('target');
    const src = image([0, 4]);
    await createBackup({ target: { type: 'dir', path }, source: src.path, volume: 'v', name: 'old', chunkSize: CHUNK });
    const target: DirTarget = { type: 'dir', path, keyFile: keyFile() };
    const { authenticateBackup } = await import('../../src/backup/authenticate.js');
    assert.equal((await authenticateBackup({ target, name: 'old' })).signed, true);
    const old = await verifyBackup({ target, name: 'old' });
    assert.deepEqual([old.ok, old.authenticated, old.encrypted], [true, true, false]);
    const out = join(fresh('restore'), 'x.img');
    assert.equal((await restoreBackup({ target, name: 'old', destination: out })).encrypted, false);
    assert.ok(readFileSync(out).equals(src.bytes));
    const fresh2 = await createBackup({ target, source: src.path, volume: 'v', name: 'new', chunkSize: CHUNK });
    assert.equal(fresh2.stats.newChunks, 2, 'the encrypted backup shares no chunk with the clear one');
    const clear = await createBackup({
      target: { ...target, encrypt: false },
      source: src.path,
      volume: 'v',
      name: 'clear',
      chunkSize: CHUNK,
    });
    assert.deepEqual([clear.format, clear.encryption, clear.stats.newChunks], ['latch-backup/v2', undefined, 0]);
    assert.ok(statSync(join(path, 'backups', 'clear.json')).size > 0);
  });
});

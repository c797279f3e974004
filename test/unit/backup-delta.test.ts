// Issue 37, item 2, without Ceph: the rbd diff format parsed as a stream (src/sys/rbd-diff.ts), each malformed
// stream refused, and a backup built from a diff over the previous backup (src/backup/delta.ts): untouched chunks
// carried over unread, a partly changed chunk laid over the previous backup's bytes, a volume that grew, and the
// result restoring byte for byte.
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { after, describe, it } from 'node:test';
import { missingChunk } from '../../src/backup/chunks.js';
import { createBackup } from '../../src/backup/create.js';
import { storeOf } from '../../src/backup/store.js';
import { diffChunkSource } from '../../src/backup/delta.js';
import { restoreBackup } from '../../src/backup/restore.js';
import { configuredBackend } from '../../src/backend/index.js';
import { hasSnapshots } from '../../src/backend/types.js';
import { parseConfig } from '../../src/config.js';
import { snapshotCreate } from '../../src/cli/snapshot/create.js';
import type { CommandIO } from '../../src/cli/io.js';
import { baseSnapshotName, refuseBaseName, unusedBases } from '../../src/node/backup.js';
import type { JobSpec, Ticket, VolumeDoc } from '../../src/ledger/types.js';
import { parseExportDiff, type DiffRecord } from '../../src/sys/rbd-diff.js';

const MiB = 1024 * 1024;
const CHUNK = 4 * MiB;
const scratch = mkdtempSync(join(tmpdir(), 'latch-backup-delta-'));
after(() => rmSync(scratch, { recursive: true, force: true }));

type Rec = { w: [number, Buffer] } | { z: [number, number] };

/** A diff in rbd's v1 format, as `rbd export-diff` writes it. */
function diffBytes(size: number, records: Rec[], options: { from?: string; to?: string; end?: boolean } = {}): Buffer {
  const parts: Buffer[] = [Buffer.from('rbd diff v1\n', 'latin1')];
  const name = (tag: string, text: string) => {
    const len = Buffer.alloc(4);
    len.writeUInt32LE(Buffer.byteLength(text));
    parts.push(Buffer.from(tag), len, Buffer.from(text));
  };
  const u64 = (n: number) => {
    const b = Buffer.alloc(8);
    b.writeBigUInt64LE(BigInt(n));
    return b;
  };
  if (options.from) name('f', options.from);
  name('t', options.to ?? 'snap');
  parts.push(Buffer.from('s'), u64(size));
  for (const r of records) {
    if ('w' in r) parts.push(Buffer.from('w'), u64(r.w[0]), u64(r.w[1].length), r.w[1]);
    else parts.push(Buffer.from('z'), u64(r.z[0]), u64(r.z[1]));
  }
  if (options.end !== false) parts.push(Buffer.from('e'));
  return Buffer.concat(parts);
}

/** A stream of `bytes` in pieces of 1000 bytes (records cross the pieces' edges). */
const streamOf = (bytes: Buffer) =>
  Readable.from(Array.from({ length: Math.ceil(bytes.length / 1000) }, (_, i) => bytes.subarray(i * 1000, i * 1000 + 1000)));

async function all(bytes: Buffer): Promise<{ size: number; from?: string; records: DiffRecord[] }> {
  const diff = await parseExportDiff(streamOf(bytes));
  const records: DiffRecord[] = [];
  for await (const r of diff.records) records.push(r);
  return { size: diff.sizeBytes, ...(diff.fromSnap !== undefined && { from: diff.fromSnap }), records };
}

describe('the rbd diff format', () => {
  it('parses the names, the size and the extents, data in pieces of at most 1 MiB', async () => {
    const data = randomBytes(2 * MiB + 5);
    const parsed = await all(diffBytes(8 * MiB, [{ w: [4096, data] }, { z: [3 * MiB, 4096] }], { from: 'a' }));
    assert.equal(parsed.size, 8 * MiB);
    assert.equal(parsed.from, 'a');
    const pieces = parsed.records.filter((r) => r.kind === 'data');
    assert.ok(pieces.every((p) => p.kind === 'data' && p.data.length <= MiB));
    assert.ok(Buffer.concat(pieces.map((p) => (p.kind === 'data' ? p.data : Buffer.alloc(0)))).equals(data));
    assert.deepEqual(parsed.records.at(-1), { kind: 'zero', offset: 3 * MiB, length: 4096 });
  });

  it('refuses what is not a well-formed diff', async () => {
    const ok = diffBytes(MiB, [{ w: [0, Buffer.alloc(10, 1)] }]);
    await assert.rejects(all(Buffer.concat([Buffer.from('rbd diff v2\n'), ok.subarray(12)])), /not an rbd diff of version 1/);
    await assert.rejects(all(Buffer.from('rbd diff v1\nw')), /ends inside an extent|no image size/);
    await assert.rejects(all(diffBytes(MiB, [{ w: [MiB - 5, Buffer.alloc(10)] }])), /past the image/);
    await assert.rejects(all(diffBytes(MiB, [{ w: [4096, Buffer.alloc(10)] }, { z: [0, 10] }])), /out of order/);
    await assert.rejects(all(diffBytes(MiB, [{ w: [0, Buffer.alloc(10)] }], { end: false })), /ends inside a record tag/);
    await assert.rejects(all(ok.subarray(0, ok.length - 4)), /ends inside the data/);
    await assert.rejects(all(Buffer.concat([ok.subarray(0, ok.length - 1), Buffer.from('x')])), /unknown type "x"/);
    const huge = Buffer.concat([Buffer.from('rbd diff v1\nt'), Buffer.from([0xff, 0xff, 0xff, 0x7f])]);
    await assert.rejects(all(huge), /names a snapshot of \d+ bytes/);
    const big = diffBytes(MiB, [], { to: 'x' });
    big.writeBigUInt64LE(2n ** 60n, big.indexOf('s', 12) + 1);
    await assert.rejects(all(big), /out of range/);
  });
});

// Plain, and encrypted: an encrypted backup carries the previous one's keyed chunk IDs over and reads its partly
// changed chunks back through the key.
for (const encrypted of [false, true])
  describe(`a backup from a diff over the previous backup${encrypted ? ', encrypted' : ''}`, () => {
    const path = join(scratch, encrypted ? 'target-encrypted' : 'target');
    mkdirSync(path);
    let keyFile: string | undefined;
    if (encrypted) {
      keyFile = join(scratch, 'backup.key');
      writeFileSync(keyFile, `${randomBytes(48).toString('base64')}\n`, { mode: 0o600 });
    }
    const target = { type: 'dir' as const, path, ...(keyFile !== undefined && { keyFile }) };

    async function fromDiff(name: string, size: number, records: Rec[], parentName?: string) {
      const diff = await parseExportDiff(streamOf(diffBytes(size, records)));
      const { readCheckedManifest } = await import('../../src/backup/manifest.js');
      const parent = parentName === undefined ? undefined : await readCheckedManifest(target, parentName);
      let finished = false;
      const source = diffChunkSource({
        target,
        sizeBytes: diff.sizeBytes,
        chunkSize: CHUNK,
        records: diff.records,
        parent: parent?.manifest,
        parentCodec: parent?.codec,
        finish: async () => {
          finished = true;
        },
        cancel: () => undefined,
      });
      const manifest = await createBackup({ target, source, volume: 'vol', name });
      assert.ok(finished, 'the source was finished before the manifest was published');
      return { manifest, bytesRead: source.bytesRead() };
    }

    async function restored(name: string): Promise<Buffer> {
      const file = join(scratch, `${encrypted ? 'encrypted-' : ''}${name}.img`);
      await restoreBackup({ target, name, destination: file, overwriteFile: true });
      return readFileSync(file);
    }

    it('carries untouched chunks over, lays a partial change over the previous bytes, and follows a volume that grew', async () => {
      const image = Buffer.alloc(24 * MiB);
      const a = randomBytes(6 * MiB);
      a.copy(image, 2 * MiB);
      const b = randomBytes(MiB);
      b.copy(image, 17 * MiB);
      const first = await fromDiff('d1', 24 * MiB, [{ w: [2 * MiB, a] }, { w: [17 * MiB, b] }]);
      assert.equal(first.bytesRead, 7 * MiB, 'only the extents the diff gave');
      assert.equal(first.manifest.format, encrypted ? 'latch-backup/v3' : 'latch-backup/v2');
      assert.equal(first.manifest.stats.dataChunks, 3);
      assert.ok((await restored('d1')).equals(image));

      // 4 KiB changes inside chunk 1, chunk 4 is discarded, and the volume grows by 6 MiB with data at its end.
      const change = randomBytes(4096);
      change.copy(image, 5 * MiB);
      const grown = Buffer.concat([image, Buffer.alloc(6 * MiB)]);
      grown.fill(0, 16 * MiB, 20 * MiB);
      const tail = randomBytes(MiB);
      tail.copy(grown, 29 * MiB);
      const second = await fromDiff('d2', 30 * MiB, [{ w: [5 * MiB, change] }, { z: [16 * MiB, 4 * MiB] }, { w: [29 * MiB, tail] }], 'd1');
      assert.equal(second.bytesRead, 4096 + MiB);
      assert.equal(second.manifest.parent, 'd1');
      assert.equal(second.manifest.chunks[0], first.manifest.chunks[0], 'chunk 0 carried over');
      assert.notEqual(second.manifest.chunks[1], first.manifest.chunks[1], 'chunk 1 changed');
      assert.equal(second.manifest.chunks[4], null, 'the discarded chunk is a hole');
      assert.equal(second.manifest.stats.newChunks, 2, 'chunk 1 and the new tail: nothing else is stored');
      assert.ok((await restored('d2')).equals(grown), 'the incremental backup restores the whole volume');
    });

    it('fails, and publishes nothing, on a diff out of step with the image', async () => {
      const { manifestExists } = await import('../../src/backup/manifest.js');
      // The engine asks for each position once; a diff whose size is smaller than a record is refused by the parser.
      await assert.rejects(fromDiff('bad', 4 * MiB, [{ w: [3 * MiB, randomBytes(2 * MiB)] }]), /past the image/);
      assert.equal(await manifestExists(target, 'bad'), false);
    });
  });

describe('the configured rbd backend', () => {
  it('reports snapshot diffs through its lazy wrapper, so that backups of rbd volumes are incremental', () => {
    const raw = {
      nodeName: 'n',
      stateDir: '/tmp/x',
      poolDir: '/tmp/y',
      logFile: '/tmp/z.log',
      backend: { type: 'rbd', client: 'rbd-fuse' },
    };
    const backend = configuredBackend(parseConfig(raw, 'test'));
    assert.ok(hasSnapshots(backend) && typeof backend.snapshotDiff === 'function');
  });
});

describe('the base snapshots of incremental backups', () => {
  it('are named after their backup (a hash when too long), and a person cannot take such a name', async () => {
    assert.equal(baseSnapshotName('db-1'), 'latch-base-db-1');
    const long = baseSnapshotName('x'.repeat(200));
    assert.match(long, /^latch-base-[0-9a-f]{40}$/);
    assert.throws(() => refuseBaseName('latch-base-db-1'), /kept for the bases of incremental backups/);
    refuseBaseName('latch-basement');
    const io = { out: () => undefined, env: {}, context: () => assert.fail('no context is needed to refuse') } as unknown as CommandIO;
    await assert.rejects(snapshotCreate({ volume: 'db', name: 'latch-base-db-1', output: 'table' }, io), /kept for the bases/);
  });

  it("a shared volume's unused bases are those no backup ticket names (hashed names too); a person's snapshots are not bases", () => {
    const long = 'y'.repeat(200);
    const ticket = (job: JobSpec) => ({ job }) as unknown as Ticket;
    const doc = {
      spec: {
        tickets: {
          a: ticket({ kind: 'backup', backup: 'running' }),
          b: ticket({ kind: 'backup', backup: long }),
          c: ticket({ kind: 'snapshot', snapshot: 'latch-base-left' }),
        },
      },
    } as unknown as VolumeDoc;
    const snapshots = ['s1', 'latch-basement', 'latch-base-running', baseSnapshotName(long), 'latch-base-left'];
    assert.deepEqual(unusedBases(snapshots, doc), ['latch-base-left'], 'only the base no backup ticket names');
    assert.deepEqual(unusedBases(snapshots, undefined), ['latch-base-running', baseSnapshotName(long), 'latch-base-left']);
  });
});

describe('the look-up of the chunks a backup builds on', () => {
  /** A directory target holding `count` chunks, and its store, counting the listings and look-ups made of it. */
  async function countedTarget(name: string, count: number, othersPerListing = 0) {
    const path = join(scratch, name);
    const target = { type: 'dir' as const, path };
    const ids = Array.from({ length: count }, (_, i) => createHash('sha256').update(`${name} ${i}`).digest('hex'));
    for (const id of ids) {
      mkdirSync(join(path, 'chunks', id.slice(0, 2)), { recursive: true });
      writeFileSync(join(path, 'chunks', id.slice(0, 2), id), 'x');
    }
    const store = await storeOf(target);
    const exists = store.exists.bind(store);
    const list = store.list.bind(store);
    const seen = { lookUps: 0, listings: 0, inFlight: 0, most: 0 };
    const counted = async <T>(work: () => Promise<T>): Promise<T> => {
      seen.most = Math.max(seen.most, ++seen.inFlight);
      await new Promise((r) => setTimeout(r, 1));
      try {
        return await work();
      } finally {
        seen.inFlight--;
      }
    };
    store.exists = (key: string) => {
      seen.lookUps++;
      return counted(() => exists(key));
    };
    // `othersPerListing`: as if other volumes' chunks filled the target, each listing naming that many more.
    store.list = (prefix: string) => {
      seen.listings++;
      assert.match(prefix, /^chunks\/[0-9a-f]{2}\/$/, 'one shard at a time');
      return counted(async () => [
        ...(await list(prefix)),
        ...Array.from({ length: othersPerListing }, (_, i) => ({ key: `${prefix}other-${i}` })),
      ]);
    };
    const remove = (id: string) => rmSync(join(path, 'chunks', id.slice(0, 2), id));
    const restore = (id: string) => writeFileSync(join(path, 'chunks', id.slice(0, 2), id), 'x');
    return { target, ids, seen, remove, restore };
  }

  it('finds the one chunk the target lacks among many, a few requests at a time, and none when all are there', async () => {
    const { target, ids, seen, remove } = await countedTarget('lookup', 200);
    assert.equal(await missingChunk(target, [...ids, ...ids]), undefined);
    assert.ok(
      seen.lookUps + seen.listings <= 200,
      `${seen.lookUps} look-ups and ${seen.listings} listings for 200 chunks, repeats included`,
    );
    assert.ok(seen.most > 1 && seen.most <= 16, `${seen.most} requests in flight`);
    const gone = ids[150] as string;
    remove(gone);
    assert.equal(await missingChunk(target, ids), gone);
    assert.equal(await missingChunk(target, []), undefined);
  });

  it('lists the shards of a target of its own instead of looking each chunk up, and still finds the one missing', async () => {
    const { target, ids, seen, remove, restore } = await countedTarget('listing', 1024);
    const perShard = new Map<string, number>();
    for (const id of ids) perShard.set(id.slice(0, 2), (perShard.get(id.slice(0, 2)) ?? 0) + 1);
    assert.equal(await missingChunk(target, ids), undefined);
    // A listing of up to 1,000 is one request: a shard with two IDs or more is listed, a lone ID looked up.
    const counts = [...perShard.values()];
    assert.equal(seen.listings, counts.filter((n) => n > 1).length, 'each shard of two IDs or more listed once');
    assert.equal(seen.lookUps, counts.filter((n) => n === 1).length, 'lone IDs looked up');
    assert.ok(seen.listings + seen.lookUps <= 256);
    for (const gone of [ids[0] as string, ids[1023] as string]) {
      remove(gone);
      assert.equal(await missingChunk(target, ids), gone);
      restore(gone);
    }
  });

  it('in a target full of other chunks, looks up the IDs of a shard where that takes fewer requests than its listing', async () => {
    // Every listing names 3,000 more: 4 pages per shard, so shards with 4 IDs or fewer are looked up.
    const { target, ids, seen, remove, restore } = await countedTarget('crowded', 1024, 3000);
    const perShard = new Map<string, number>();
    for (const id of ids) perShard.set(id.slice(0, 2), (perShard.get(id.slice(0, 2)) ?? 0) + 1);
    const few = [...perShard.values()].filter((n) => n <= 4);
    assert.ok(few.length > 0, 'some shards hold 4 IDs or fewer');
    assert.equal(await missingChunk(target, ids), undefined);
    assert.equal(seen.listings, [...perShard.values()].filter((n) => n > 4).length, 'the other shards are listed');
    assert.equal(
      seen.lookUps,
      few.reduce((a, b) => a + b, 0),
      'the IDs of the few looked up',
    );
    const lone = ids.find((id) => (perShard.get(id.slice(0, 2)) ?? 0) <= 4) as string;
    remove(lone);
    assert.equal(await missingChunk(target, ids), lone);
    restore(lone);
  });
});

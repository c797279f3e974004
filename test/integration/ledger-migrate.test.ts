// latch ledger migrate: file -> etcd -> file gives identical documents; repeating is a no-op; a destination document
// that differs is refused unless --overwrite; a dry run writes nothing; the CLI reports in a table or JSON.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { migrateLedger, type MigrationReport } from '../../src/ledger/migrate.js';
import { addTicket, markAttached, markAttaching, newVolume } from '../../src/ledger/arbitrate.js';
import { Ledger } from '../../src/ledger/ledger.js';
import { EtcdStore } from '../../src/store/etcd.js';
import { FileStore } from '../../src/store/file.js';
import type { Store } from '../../src/store/types.js';
import { EtcdCluster, etcdSkipReason } from '../etcd/etcd.js';
import { defined } from '../fixtures/defined.js';

const REPO = resolve(__dirname, '../..');
const skip = etcdSkipReason();
let etcd: EtcdCluster;
let work: string;
let n = 0;
const opened: Store[] = [];

function etcdStore(prefix = `/migrate-${process.pid}-${++n}/`): EtcdStore {
  const s = new EtcdStore({ endpoints: etcd.endpoints, prefix, timeoutMs: 3000 });
  opened.push(s);
  return s;
}

function fileStore(): FileStore {
  return new FileStore(join(work, `state-${++n}`));
}

/** A ledger with a few volumes in different states, and PV aliases. */
async function populate(store: Store): Promise<void> {
  const ledger = new Ledger(store, () => '2024-01-02T03:04:05.000Z');
  const now = ledger.now();
  for (const [i, name] of ['data-a', 'data-b', 'pvc-0c1d'].entries()) {
    await ledger.update(name, () => newVolume(name, (i + 1) << 20, 'ext4', now));
    for (const node of ['node-1', 'node-2'].slice(0, i + 1)) {
      await ledger.update(name, (d) =>
        addTicket(
          defined(d),
          {
            id: `workload-${name}-${node}`,
            type: 'workload',
            nodeID: node,
            parameters: { readOnly: false },
            requestedBy: { pvName: `pv-${name}` },
          },
          now,
        ),
      );
    }
    if (i === 1) {
      await ledger.update(name, (d) => markAttaching(defined(d), 'node-1', now) ?? d);
      await ledger.update(name, (d) => markAttached(defined(d), 'node-1', '/dev/loop7', now) ?? d);
    }
    await ledger.linkPv(`pv-${name}`, name);
  }
}

async function dump(store: Store): Promise<Record<string, unknown>> {
  const out: Record<string, unknown> = {};
  for (const kind of ['volumes', 'pvs']) {
    for (const name of await store.list(kind)) out[`${kind}/${name}`] = (await store.get(`${kind}/${name}`))!.value;
  }
  return out;
}

function counts(r: MigrationReport) {
  const { copied, overwritten, skipped, refused } = r.counts;
  return { copied, overwritten, skipped, refused };
}

describe('latch ledger migrate', { skip }, () => {
  before(async () => {
    work = mkdtempSync(join(tmpdir(), 'latch-migrate-'));
    etcd = await EtcdCluster.start({ size: 1 });
  });
  after(async () => {
    for (const s of opened) await s.close();
    await etcd?.stop();
    if (work) rmSync(work, { recursive: true, force: true });
  });

  it('round trip file -> etcd -> file gives identical documents, and repeating changes nothing', async () => {
    const source = fileStore();
    await populate(source);
    const original = await dump(source);
    assert.equal(Object.keys(original).length, 6);

    const remote = etcdStore();
    const first = await migrateLedger(source, remote);
    assert.deepEqual(counts(first), { copied: 6, overwritten: 0, skipped: 0, refused: 0 });
    assert.deepEqual(await dump(remote), original);
    const again = await migrateLedger(source, remote);
    assert.deepEqual(counts(again), { copied: 0, overwritten: 0, skipped: 6, refused: 0 });

    const back = fileStore();
    const returned = await migrateLedger(remote, back);
    assert.deepEqual(counts(returned), { copied: 6, overwritten: 0, skipped: 0, refused: 0 });
    const final = await dump(back);
    assert.deepEqual(final, original);
    // Byte for byte, key order included.
    for (const key of Object.keys(original)) assert.equal(JSON.stringify(final[key]), JSON.stringify(original[key]), key);
    // And the ledger reads the migrated documents as it read the originals.
    assert.deepEqual(await new Ledger(back).list(), await new Ledger(source).list());
    assert.equal(await new Ledger(back).volumeOfPv('pv-data-b'), 'data-b');
  });

  it('refuses to replace a destination document that differs, unless --overwrite; a dry run writes nothing', async () => {
    const source = fileStore();
    await populate(source);
    const remote = etcdStore();
    await migrateLedger(source, remote);
    // The destination moves on (a driver already runs on etcd): its document is now different.
    const ledger = new Ledger(remote);
    const newer = await ledger.update('data-a', (d) => ({ ...defined(d), spec: { ...defined(d).spec, sizeBytes: 99 << 20 } }));
    await remote.put('volumes/only-in-etcd', (await remote.get('volumes/data-a'))!.value, 0);

    const refused = await migrateLedger(source, remote);
    assert.deepEqual(counts(refused), { copied: 0, overwritten: 0, skipped: 5, refused: 1 });
    assert.equal(refused.entries.find((e) => e.action === 'refused')?.key, 'volumes/data-a');
    assert.match(defined(refused.entries.find((e) => e.action === 'refused')?.detail), /different content.*--overwrite/);
    assert.deepEqual(refused.onlyInDestination, ['volumes/only-in-etcd']);
    assert.deepEqual(await ledger.get('data-a'), newer);

    const dry = await migrateLedger(source, remote, { overwrite: true, dryRun: true });
    assert.deepEqual(counts(dry), { copied: 0, overwritten: 1, skipped: 5, refused: 0 });
    assert.deepEqual(await ledger.get('data-a'), newer);

    const forced = await migrateLedger(source, remote, { overwrite: true });
    assert.deepEqual(counts(forced), { copied: 0, overwritten: 1, skipped: 5, refused: 0 });
    assert.deepEqual((await remote.get('volumes/data-a'))!.value, (await source.get('volumes/data-a'))!.value);
    // The source is never touched, and extra destination keys stay.
    assert.ok(await remote.get('volumes/only-in-etcd'));
  });

  describe('the command', () => {
    function latch(args: string[], config: object) {
      const configPath = join(work, `config-${++n}.json`);
      writeFileSync(configPath, JSON.stringify(config));
      const r = spawnSync(process.execPath, ['--import', 'tsx', join(REPO, 'src/bin.ts'), ...args], {
        cwd: REPO,
        encoding: 'utf8',
        env: { ...process.env, LATCH_CONFIG: configPath },
        timeout: 60_000,
      });
      return { code: r.status, stdout: r.stdout, stderr: r.stderr };
    }

    it('takes the file store from the config and etcd from flags, reports JSON, exits 1 when it refused', async () => {
      const stateDir = join(work, `state-${++n}`);
      await populate(new FileStore(stateDir));
      const prefix = `/cli-${process.pid}/`;
      const flags = ['--etcd-endpoints', etcd.endpoints.join(','), '--etcd-prefix', prefix, '-o', 'json'];
      const first = latch(['ledger', 'migrate', '--from', 'file', '--to', 'etcd', ...flags], { stateDir });
      assert.equal(first.code, 0, first.stderr);
      const report = JSON.parse(first.stdout) as MigrationReport;
      assert.deepEqual(counts(report), { copied: 6, overwritten: 0, skipped: 0, refused: 0 });
      assert.match(report.from, new RegExp(`file store ${stateDir}`));
      assert.match(report.to, new RegExp(`prefix ${prefix}`));

      await etcdStore(prefix).put('pvs/pv-data-a', { volume: 'elsewhere' }, (await etcdStore(prefix).get('pvs/pv-data-a'))!.revision);
      const second = latch(['ledger', 'migrate', '--from', 'file', '--to', 'etcd', ...flags.slice(0, 4)], { stateDir });
      assert.equal(second.code, 1);
      assert.match(second.stdout, /pvs\/pv-data-a\s+refused/);
      assert.match(second.stdout, /copied 0, overwritten 0, skipped 5 \(identical\), refused 1/);
    });

    it('takes etcd from the config when it is the etcd store, and migrates back to a file store', async () => {
      const prefix = `/cli-back-${process.pid}/`;
      const source = fileStore();
      await populate(source);
      await migrateLedger(source, etcdStore(prefix));
      const stateDir = join(work, `state-${++n}`);
      const r = latch(['ledger', 'migrate', '--from', 'etcd', '--to', 'file'], {
        stateDir,
        store: { type: 'etcd', endpoints: etcd.endpoints, prefix },
      });
      assert.equal(r.code, 0, r.stderr);
      assert.match(r.stdout, /copied 6, overwritten 0, skipped 0 \(identical\), refused 0/);
      assert.deepEqual(await dump(new FileStore(stateDir)), await dump(source));
    });

    it('says what is missing', () => {
      const noEndpoints = latch(['ledger', 'migrate', '--from', 'file', '--to', 'etcd'], { stateDir: join(work, 'none') });
      assert.equal(noEndpoints.code, 1);
      assert.match(noEndpoints.stderr, /no etcd endpoints: the configuration .* uses the file store; give --etcd-endpoints/);
      const same = latch(['ledger', 'migrate', '--from', 'file', '--to', 'file'], {});
      assert.equal(same.code, 1);
      assert.match(same.stderr, /--from and --to must differ/);
      const bad = latch(['ledger', 'migrate', '--from', 'disk', '--to', 'etcd'], {});
      assert.match(bad.stderr, /--from must be "file" or "etcd"/);
    });
  });
});

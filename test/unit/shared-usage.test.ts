// The quota and use gauges of shared volumes (src/agent/shared-usage.ts, LatchMetrics.setSharedVolumeUsage) with a
// fake reader in place of `ceph fs subvolume info`: only the shared volumes this node holds are read, one read each;
// a volume whose figures cannot be read has none that round and is counted and logged; once the cluster does not
// answer in time the rest of the round is skipped; a volume no longer held loses its series.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { LatchMetrics } from '../../src/agent/metrics.js';
import { heldSharedVolumes, readSharedUsage, type SharedUsage, type UsageReader } from '../../src/agent/shared-usage.js';
import { newVolume } from '../../src/ledger/arbitrate.js';
import type { NodePhase, VolumeDoc } from '../../src/ledger/types.js';
import { CommandError } from '../../src/sys/run.js';

const NOW = '2026-01-01T00:00:00.000Z';
const GiB = 1024 ** 3;

/** A volume held by `holders` (node -> phase); shared unless said otherwise. */
function volume(name: string, holders: Record<string, NodePhase>, shared = true): VolumeDoc {
  const doc = newVolume(name, GiB, 'ext4', NOW);
  if (shared) doc.spec.shared = true;
  for (const [node, phase] of Object.entries(holders)) doc.status.nodes[node] = { phase, readOnly: false, since: NOW };
  return doc;
}

/** The value of one sample in the text format, by its exact series. */
function sample(text: string, series: string): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.slice(series.length + 1));
}

/** ceph killed at its deadline, or ceph giving up on the monitors after --connect-timeout (exit 1, "timed out"). */
function timedOut(how: 'deadline' | 'connect'): CommandError {
  return new CommandError(how === 'deadline' ? 'ceph timed out after 20000 ms' : 'ceph exited with 1: timed out', {
    command: 'ceph',
    args: ['fs', 'subvolume', 'info'],
    exitCode: how === 'deadline' ? undefined : 1,
    signal: how === 'deadline' ? 'SIGTERM' : undefined,
    stderrTail: how === 'deadline' ? '' : 'timed out',
    timedOut: how === 'deadline',
    durationMs: how === 'deadline' ? 20000 : 10000,
  });
}

/** A reader over `figures` that records what it was asked; a volume missing from `figures` has no subvolume. */
function fakeReader(figures: Record<string, SharedUsage | Error>): { read: UsageReader; asked: string[] } {
  const asked: string[] = [];
  const read: UsageReader = async (volume) => {
    asked.push(volume);
    await Promise.resolve();
    const found = figures[volume];
    if (found instanceof Error) throw found;
    return found;
  };
  return { read, asked };
}

describe('shared volume quota and use', () => {
  it("the shared volumes this node holds, in any phase; not block volumes, not the other nodes' ones", () => {
    const docs = [
      volume('s-attached', { 'node-a': 'attached', 'node-b': 'attached' }),
      volume('s-granted', { 'node-a': 'granted' }),
      volume('s-detaching', { 'node-a': 'detaching' }),
      volume('s-elsewhere', { 'node-b': 'attached' }),
      volume('s-nobody', {}),
      volume('block', { 'node-a': 'attached' }, false),
    ];
    assert.deepEqual(heldSharedVolumes(docs, 'node-a'), ['s-attached', 's-detaching', 's-granted']);
    assert.deepEqual(heldSharedVolumes(docs, 'node-b'), ['s-attached', 's-elsewhere']);
    assert.deepEqual(heldSharedVolumes(docs, 'node-c'), []);
  });

  it('one read per held volume; an unreadable or missing one has no figures, and is counted and logged', async () => {
    const { read, asked } = fakeReader({
      good: { usedBytes: 300, quotaBytes: 1000 },
      unlimited: { usedBytes: 5, quotaBytes: undefined },
      broken: new Error('Error EACCES: access denied'),
    });
    const logged: Record<string, unknown>[] = [];
    const round = await readSharedUsage(['broken', 'good', 'gone', 'unlimited'], read, (e) => logged.push(e));
    assert.deepEqual([...asked].sort(), ['broken', 'gone', 'good', 'unlimited'], 'each volume read once');
    assert.deepEqual(Object.fromEntries(round.figures), {
      good: { usedBytes: 300, quotaBytes: 1000 },
      unlimited: { usedBytes: 5, quotaBytes: undefined },
    });
    assert.equal(round.failed, 2);
    assert.deepEqual(logged.map((e) => e.volume).sort(), ['broken', 'gone'], 'each failure logged with its volume');
    assert.match(String(logged.find((e) => e.volume === 'broken')?.error), /quota and use not read: Error EACCES: access denied/);
    assert.match(String(logged.find((e) => e.volume === 'gone')?.error), /no subvolume/);

    const m = await LatchMetrics.create();
    m.setSharedVolumeUsage(round);
    const text = await m.text();
    assert.equal(sample(text, 'latch_shared_volume_quota_bytes{volume="good"}'), 1000);
    assert.equal(sample(text, 'latch_shared_volume_used_bytes{volume="good"}'), 300);
    assert.equal(sample(text, 'latch_shared_volume_used_bytes{volume="unlimited"}'), 5);
    assert.equal(sample(text, 'latch_shared_volume_quota_bytes{volume="unlimited"}'), undefined, 'no quota, no quota series');
    assert.equal(sample(text, 'latch_shared_volume_used_bytes{volume="broken"}'), undefined);
    assert.equal(sample(text, 'latch_shared_volume_quota_bytes{volume="gone"}'), undefined);
    assert.equal(sample(text, 'latch_shared_volume_info_failures_total'), 2);
  });

  it('once the cluster does not answer in time, the volumes not started yet are skipped for the round', async () => {
    const volumes = Array.from({ length: 12 }, (_, i) => `v${String(i).padStart(2, '0')}`);
    for (const how of ['deadline', 'connect'] as const) {
      const { read, asked } = fakeReader({
        ...Object.fromEntries(volumes.map((v) => [v, { usedBytes: 1, quotaBytes: 2 }])),
        v00: timedOut(how),
      });
      const logged: Record<string, unknown>[] = [];
      const round = await readSharedUsage(volumes, read, (e) => logged.push(e));
      // v00 times out; the reads already started with it (a few at a time) finish, nothing more starts.
      assert.ok(asked.length < volumes.length, `${how}: ${asked.length} of ${volumes.length} read`);
      assert.ok(asked.length <= 4, `${how}: at most 4 reads at a time: ${asked.join(' ')}`);
      assert.equal(round.figures.size, asked.length - 1);
      assert.equal(round.failed, volumes.length - round.figures.size, 'every volume without figures is counted');
      assert.ok(
        logged.some((e) => /not read this round: the cluster did not answer in time/.test(String(e.error))),
        JSON.stringify(logged),
      );
    }
    // An ordinary failure does not stop the round.
    const other = fakeReader({ ...Object.fromEntries(volumes.map((v) => [v, { usedBytes: 1, quotaBytes: 2 }])), v00: new Error('EPERM') });
    const all = await readSharedUsage(volumes, other.read, () => undefined);
    assert.equal(other.asked.length, volumes.length);
    assert.equal(all.figures.size, volumes.length - 1);
  });

  it('a volume no longer held, or unreadable this round, loses its series; the failures add up', async () => {
    const m = await LatchMetrics.create();
    const held = (docs: VolumeDoc[]) => heldSharedVolumes(docs, 'node-a');
    const { read } = fakeReader({ a: { usedBytes: 10, quotaBytes: 100 }, b: { usedBytes: 20, quotaBytes: 200 } });
    m.setSharedVolumeUsage(
      await readSharedUsage(held([volume('a', { 'node-a': 'attached' }), volume('b', { 'node-a': 'attached' })]), read, () => undefined),
    );
    let text = await m.text();
    assert.equal(sample(text, 'latch_shared_volume_used_bytes{volume="a"}'), 10);
    assert.equal(sample(text, 'latch_shared_volume_quota_bytes{volume="b"}'), 200);
    assert.equal(sample(text, 'latch_shared_volume_info_failures_total'), 0);

    // b is released by node-a (another node holds it now); a's read fails this round.
    const next = fakeReader({ a: new Error('mgr busy'), b: { usedBytes: 20, quotaBytes: 200 } });
    m.setSharedVolumeUsage(
      await readSharedUsage(
        held([volume('a', { 'node-a': 'attached' }), volume('b', { 'node-b': 'attached' })]),
        next.read,
        () => undefined,
      ),
    );
    assert.deepEqual(next.asked, ['a'], 'a volume this node does not hold is not read');
    text = await m.text();
    for (const series of ['used', 'quota']) {
      assert.equal(sample(text, `latch_shared_volume_${series}_bytes{volume="a"}`), undefined, `no stale ${series} of a`);
      assert.equal(sample(text, `latch_shared_volume_${series}_bytes{volume="b"}`), undefined, `no ${series} of b once released`);
    }
    assert.equal(sample(text, 'latch_shared_volume_info_failures_total'), 1);

    // a readable again: its series is back.
    m.setSharedVolumeUsage(await readSharedUsage(['a'], fakeReader({ a: { usedBytes: 11, quotaBytes: 100 } }).read, () => undefined));
    text = await m.text();
    assert.equal(sample(text, 'latch_shared_volume_used_bytes{volume="a"}'), 11);
    assert.equal(sample(text, 'latch_shared_volume_info_failures_total'), 1);
  });
});

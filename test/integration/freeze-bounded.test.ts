// Bounded freezes on a real loop-mounted ext4 (root): a freeze whose work outlasts the bound is thawed at the bound
// (a writer blocked by it goes on then, not when the work ends) and says so; a snapshot of a mounted volume on a pool
// that cannot reflink is never taken under freeze; a freeze a killed agent left (its marker and a frozen filesystem)
// is thawed by the agent's start-up; doctor reports it.
import assert from 'node:assert/strict';
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { after, before, describe, it } from 'node:test';
import { agentStartup } from '../../src/agent/startup.js';
import { checkFreezes } from '../../src/doctor/freezes.js';
import type { Finding } from '../../src/doctor/findings.js';
import { parseConfig, type Config } from '../../src/config.js';
import { createContext } from '../../src/context.js';
import { freezeMarkerDir, snapshotVolume } from '../../src/node/snapshot.js';
import { withFrozenFilesystem } from '../../src/sys/freeze.js';
import { MemoryStore } from '../fixtures/memory-store.js';
import { trackChild } from '../fixtures/tracked-children.js';

const MiB = 1024 * 1024;
const notRoot = process.getuid?.() !== 0 ? 'needs root: loop devices, mkfs.ext4, mount and fsfreeze' : false;

/** Runs `sh -c script` and resolves with the milliseconds it took to exit (a write to a frozen filesystem waits). */
function timedWriter(script: string): Promise<number> {
  const started = Date.now();
  const child = spawn('sh', ['-c', script], { stdio: 'ignore' });
  trackChild(child);
  return new Promise((resolve, reject) => {
    child.once('error', reject);
    child.once('exit', (code) => (code === 0 ? resolve(Date.now() - started) : reject(new Error(`writer exited with ${code}`))));
  });
}

/** A write to the filesystem at `dir` finishes within `ms` (it would wait forever on a frozen one). */
async function writable(dir: string, ms = 5000): Promise<boolean> {
  const write = timedWriter(`echo ok > ${dir}/probe-${Date.now()}`).then(() => true);
  return Promise.race([write, sleep(ms).then(() => false)]);
}

describe('bounded freezes', { skip: notRoot }, () => {
  let root = '';
  let mnt = '';
  let config: Config;
  const mounts: string[] = [];

  before(() => {
    root = mkdtempSync('/tmp/latch-freeze-');
    const image = join(root, 'fs.img');
    writeFileSync(image, '');
    execFileSync('truncate', ['-s', String(64 * MiB), image]);
    execFileSync('mkfs.ext4', ['-q', '-F', image]);
    mnt = join(root, 'mnt');
    mkdirSync(mnt);
    execFileSync('mount', ['-o', 'loop', image, mnt]);
    mounts.push(mnt);
    const raw = { nodeName: 'node-a', poolDir: join(root, 'pool'), stateDir: join(root, 'state'), logFile: join(root, 'latch.log') };
    config = parseConfig(raw, 'test');
  });
  after(() => {
    for (const dir of mounts.reverse()) {
      spawnSync('fsfreeze', ['--unfreeze', dir]);
      if (spawnSync('umount', [dir]).status !== 0) spawnSync('umount', ['-l', dir]);
    }
    if (root) rmSync(root, { recursive: true, force: true });
  });

  it('a freeze whose copy outlasts the bound is thawed at the bound: a blocked writer goes on then; the outcome says so', async (t) => {
    const markerDir = freezeMarkerDir(config);
    let writerMs: Promise<number> | undefined;
    let markersDuring: string[] = [];
    const started = Date.now();
    const outcome = await withFrozenFilesystem(mnt, { boundMs: 1000, markerDir }, async () => {
      markersDuring = readdirSync(markerDir);
      // Frozen now: this write waits until the thaw.
      writerMs = timedWriter(`echo during > ${mnt}/during`);
      await sleep(4000); // the "copy": four times the bound
      return 'copied';
    });
    const total = Date.now() - started;
    const waited = await (writerMs as Promise<number>);
    t.diagnostic(`bound 1000 ms, copy 4000 ms: the blocked writer waited ${waited} ms, the whole freeze-and-copy took ${total} ms`);
    assert.equal(outcome.value, 'copied');
    assert.equal(outcome.frozen, false);
    assert.match(outcome.frozen ? '' : outcome.why, /the copy took longer than the 1 s a freeze may last \(freezeSeconds\)/);
    assert.ok(total >= 4000, 'the work ran to its end');
    assert.ok(waited >= 300, `the writer was held by the freeze (${waited} ms)`);
    assert.ok(waited < 2500, `the writer waited ${waited} ms: the freeze was not held past its 1 s bound`);
    assert.equal(markersDuring.length, 1, 'the freeze was recorded while it was held');
    assert.deepEqual(readdirSync(markerDir), [], 'and its marker removed after the thaw');
    assert.ok(await writable(mnt));
  });

  it('a freeze whose copy ends within the bound is frozen throughout and thawed at once', async () => {
    const outcome = await withFrozenFilesystem(mnt, { boundMs: 2000, markerDir: freezeMarkerDir(config) }, async () => 'quick');
    assert.deepEqual(outcome, { value: 'quick', frozen: true });
    assert.ok(await writable(mnt));
  });

  it('a freeze that lands after its deadline is thawed, and the work runs unfrozen, saying so', async () => {
    // An fsfreeze that takes longer than the bound and survives its SIGTERM: it freezes only after the deadline.
    const bin = join(root, 'slow-bin');
    mkdirSync(bin, { recursive: true });
    const real = execFileSync('sh', ['-c', 'command -v fsfreeze'], {
      encoding: 'utf8',
      env: { PATH: '/usr/sbin:/sbin:/usr/bin:/bin' },
    }).trim();
    writeFileSync(join(bin, 'fsfreeze'), `#!/bin/sh\ntrap '' TERM\nif [ "$1" = --freeze ]; then sleep 1.5; fi\nexec ${real} "$@"\n`, {
      mode: 0o755,
    });
    const path = process.env.PATH;
    process.env.PATH = `${bin}:${path ?? ''}`;
    let outcome;
    let frozenDuringWork: boolean | undefined;
    try {
      outcome = await withFrozenFilesystem(mnt, { boundMs: 1000, markerDir: freezeMarkerDir(config) }, async () => {
        frozenDuringWork = !(await writable(mnt, 1000));
        return 'done';
      });
    } finally {
      process.env.PATH = path;
    }
    assert.equal(outcome.value, 'done');
    assert.equal(outcome.frozen, false);
    assert.match(outcome.frozen ? '' : outcome.why, /the freeze did not take within 1 s \(freezeSeconds\)/);
    assert.equal(frozenDuringWork, false, 'the late freeze was thawed before the work ran');
    assert.ok(await writable(mnt));
    assert.deepEqual(readdirSync(freezeMarkerDir(config)), [], 'its marker is gone');
  });

  it('a snapshot of a mounted volume on a pool that cannot reflink (ext4) is not taken under freeze, and says so', async () => {
    const store = new MemoryStore();
    const raw = { nodeName: 'node-a', poolDir: join(mnt, 'pool'), stateDir: join(root, 'state-snap'), logFile: join(root, 'snap.log') };
    const cfg = parseConfig(raw, 'test');
    const ctx = createContext(cfg, { store });
    await ctx.ledger.createVolume('vol', { sizeBytes: 16 * MiB, fsType: 'ext4' });
    await ctx.backend.create('vol', 16 * MiB);
    const device = await ctx.backend.attach('vol');
    const volMnt = join(root, 'vol-mnt');
    try {
      execFileSync('mkfs.ext4', ['-q', device]);
      mkdirSync(volMnt);
      execFileSync('mount', [device, volMnt]);
      mounts.push(volMnt);
      await ctx.ledger.update(
        'vol',
        (doc) =>
          doc && {
            ...doc,
            status: {
              ...doc.status,
              state: 'attached',
              currentNodes: ['node-a'],
              nodes: { 'node-a': { phase: 'attached', readOnly: false, since: new Date().toISOString(), device } },
            },
          },
      );
      const taken = await snapshotVolume(ctx, 'vol', 's1');
      assert.equal(taken.info.sharing, 'copy');
      assert.equal(taken.consistency, 'crash-consistent');
      assert.match(taken.note ?? '', /not frozen: .* cannot reflink, and a whole-image copy is never made under freeze/);
      assert.equal(existsSync(freezeMarkerDir(cfg)), false, 'no freeze was ever taken (none recorded)');
    } finally {
      if (mounts.includes(volMnt)) {
        execFileSync('umount', [volMnt]);
        mounts.splice(mounts.indexOf(volMnt), 1);
      }
      await ctx.backend.release('vol');
    }
  });

  it("a freeze a killed agent left is reported by doctor and thawed by the agent's start-up", async () => {
    const markerDir = freezeMarkerDir(config);
    mkdirSync(markerDir, { recursive: true, mode: 0o700 });
    // What a process SIGKILLed while it held a freeze leaves: the filesystem frozen and its marker, naming a dead pid.
    const deadPid = spawnSync('true').pid;
    execFileSync('fsfreeze', ['--freeze', mnt]);
    writeFileSync(
      join(markerDir, 'left.json'),
      JSON.stringify({ mountPoint: mnt, pid: deadPid, since: new Date().toISOString(), boundMs: 5000 }),
      { mode: 0o600 },
    );
    // And a freeze a live process holds right now, within its bound: neither reported nor thawed.
    writeFileSync(
      join(markerDir, 'live.json'),
      JSON.stringify({ mountPoint: join(root, 'elsewhere'), pid: process.pid, since: new Date().toISOString(), boundMs: 5000 }),
      { mode: 0o600 },
    );
    assert.equal(await writable(mnt, 500), false, 'the filesystem is frozen');

    const findings: Finding[] = [];
    assert.equal(await checkFreezes(config, (f) => findings.push(f)), 1);
    assert.equal(findings[0]?.severity, 'error');
    assert.match(
      findings[0]?.message ?? '',
      new RegExp(`latch left the filesystem at ${mnt} frozen .*process ${deadPid} that froze it is gone`),
    );
    assert.equal(findings[0]?.fix, `fsfreeze --unfreeze ${mnt}`);

    const logged: Record<string, unknown>[] = [];
    await agentStartup(config, (entry) => logged.push(entry));
    assert.ok(await writable(mnt), 'thawed: writes go through again');
    assert.deepEqual(readdirSync(markerDir), ['live.json'], "the leftover's marker is gone; the live one stays");
    assert.deepEqual(
      logged.map((e) => [e.freeze, e.thawed]),
      [[mnt, true]],
    );
    const after: Finding[] = [];
    assert.equal(await checkFreezes(config, (f) => after.push(f)), 0);
    rmSync(join(markerDir, 'live.json'));
  });
});

// Recurring jobs through the built bin/latch: croner embedded in the bundle as a string, and the agent as a process
// (root): a recurring snapshot job and a recurring backup job of a fixed slot (Jan 1 00:00 UTC: the latest slot is
// the same all year, so the test does not depend on the minute it runs in), done by the job runner on a real loop
// device, then retention. The rules on fake nodes are in test/unit/recurring.test.ts.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import type { LoopBackend } from '../../src/backend/loop.js';
import { slotStamp } from '../../src/jobs/recurring.js';
import { parseConfig, type RecurringJobConfig } from '../../src/config.js';
import { createContext } from '../../src/context.js';

const work = mkdtempSync(join(tmpdir(), 'latch-recurring-'));
after(() => rmSync(work, { recursive: true, force: true }));

const hourly: RecurringJobConfig = { name: 'hourly', task: 'snapshot', cron: '0 * * * *', volumes: ['pvc-*'], retain: 2 };

describe('the cron library in the bundle', () => {
  const skip = !existsSync('bin/latch') ? 'needs bin/latch: npm run build' : false;
  it('is embedded as a string, evaluated only when the agent imports it (driver calls never pay for it)', { skip }, () => {
    const bundle = readFileSync('bin/latch', 'utf8');
    const end = bundle.search(/\{\s*filename:\s*"croner"\s*\}/);
    const start = bundle.lastIndexOf('runInThisContext(', end);
    assert.ok(start > 0 && end > start, 'croner is wrapped in a runInThisContext of its source string');
    const uses = [...bundle.matchAll(/CronIterator/g)].map((m) => m.index);
    assert.ok(uses.length > 0 && uses.every((i) => i > start && i < end), 'all of croner is inside that string');
  });
});

describe('recurring jobs through `latch agent --once` (root, bin/latch)', () => {
  const skip =
    process.getuid?.() !== 0 ? 'needs root and loop devices' : !existsSync('bin/latch') ? 'needs bin/latch: npm run build' : false;

  it(
    'refuses to start on a bad cron expression, which driver calls never parse',
    { skip: !existsSync('bin/latch') && 'needs bin/latch' },
    () => {
      const dir = mkdtempSync(join(work, 'bad-'));
      const configFile = join(dir, 'config.json');
      const bad = { ...hourly, cron: '61 * * * *' };
      writeFileSync(
        configFile,
        JSON.stringify({ poolDir: join(dir, 'pool'), stateDir: join(dir, 'state'), logFile: join(dir, 'l.log'), recurringJobs: [bad] }),
      );
      const run = (...args: string[]) =>
        spawnSync(process.execPath, ['bin/latch', ...args], { env: { ...process.env, LATCH_CONFIG: configFile }, encoding: 'utf8' });
      const agentRun = run('agent', '--once');
      assert.equal(agentRun.status, 1);
      assert.match(
        agentRun.stderr,
        /^latch: invalid configuration in .*: field "recurringJobs\.0\.cron": "61 \* \* \* \*" is not a cron expression/,
      );
      const init = run('init');
      assert.equal(init.status, 0, init.stdout);
      assert.equal((JSON.parse(init.stdout) as { status: string }).status, 'Success');
    },
  );

  it('snapshots and backs up the selected volume once, then keeps the newest retain of the job’s own', { skip }, async () => {
    const dir = mkdtempSync(join(work, 'agent-'));
    const target = join(dir, 'backups');
    mkdirSync(target);
    const configFile = join(dir, 'config.json');
    const raw = {
      nodeName: 'node-a',
      poolDir: join(dir, 'pool'),
      stateDir: join(dir, 'state'),
      logFile: join(dir, 'latch.log'),
      backupTarget: { type: 'dir', path: target },
      agent: { listen: '127.0.0.1:0', intervalSeconds: 1 },
      recurringJobs: [
        { name: 'yearly', task: 'snapshot', cron: '0 0 1 1 *', volumes: ['vol-*'], retain: 2 },
        { name: 'yearly-b', task: 'backup', cron: '0 0 1 1 *', volumes: ['vol-1'], retain: 1 },
      ],
    };
    writeFileSync(configFile, JSON.stringify(raw));
    const latch = (...args: string[]) => {
      const r = spawnSync(process.execPath, ['bin/latch', ...args], {
        env: { ...process.env, LATCH_CONFIG: configFile },
        encoding: 'utf8',
        timeout: 120_000,
      });
      assert.equal(r.status, 0, `latch ${args.join(' ')}: ${r.stdout}${r.stderr}`);
      return r.stdout;
    };
    const stamp = slotStamp(new Date(Date.UTC(new Date().getUTCFullYear(), 0, 1)));
    const year = Number(stamp.slice(0, 4));
    try {
      latch('volume', 'create', 'vol-1', '--size', '64Mi');
      latch('volume', 'create', 'other', '--size', '64Mi');
      // Earlier years' snapshots of the job, and names retention must leave alone.
      const kept = ['yearly-x-20200101-0000', 'manual'];
      // (Straight from the backend: `latch snapshot create` of an idle volume would wait for an agent.)
      const backend = createContext(parseConfig(raw, configFile)).backend as LoopBackend;
      for (const name of [`yearly-${year - 2}0101-0000`, `yearly-${year - 1}0101-0000`, ...kept])
        await backend.createSnapshot('vol-1', name);

      // One round asks for the slot's two tickets; the runner's pass does one job of a volume at a time, so the
      // snapshot first, the backup in the next round, which also applies the snapshot job's retention.
      latch('agent', '--once');
      const snapshots = () =>
        (JSON.parse(latch('snapshot', 'list', 'vol-1', '-o', 'json')) as { name: string }[]).map((s) => s.name).sort();
      assert.ok(snapshots().includes(`yearly-${stamp}`), snapshots().join(' '));
      latch('agent', '--once');
      const backups = () =>
        (JSON.parse(latch('backup', 'list', '-o', 'json')) as { name: string; volume: string }[]).map((b) => `${b.name} ${b.volume}`);
      assert.deepEqual(backups(), [`yearly-b-${stamp}-vol-1 vol-1`]);
      assert.deepEqual(JSON.parse(latch('snapshot', 'list', 'other', '-o', 'json')), [], 'not selected');
      assert.deepEqual(snapshots(), [`yearly-${year - 1}0101-0000`, `yearly-${stamp}`, ...kept].sort());
      const log = readFileSync(join(dir, 'latch.log'), 'utf8');
      assert.equal((log.match(/"recurring":"yearly","slot":"[0-9-]+","ticket"/g) ?? []).length, 1, 'the snapshot slot was asked for once');
      assert.equal((log.match(/"recurring":"yearly-b","slot":"[0-9-]+","ticket"/g) ?? []).length, 1, 'the backup slot was asked for once');
      assert.doesNotMatch(log, /"agent":"recurring-jobs"[^\n]*"error"/);

      latch('agent', '--once'); // nothing more: the slot is done
      assert.equal(snapshots().length, 4);
      assert.equal(backups().length, 1);
      const ledger = JSON.parse(latch('volume', 'inspect', 'vol-1', '-o', 'json')) as {
        spec: { tickets: object };
        status: { jobs?: { status: { state: string } }[] };
      };
      assert.deepEqual(ledger.spec.tickets, {});
      assert.deepEqual(
        ledger.status.jobs?.map((j) => j.status.state),
        ['succeeded', 'succeeded'],
      );
    } finally {
      // Whatever a failed run left: the volumes' loop devices (only those over this test's images), then the volumes.
      for (const volume of ['vol-1', 'other']) {
        const image = join(dir, 'pool', `${volume}.img`);
        const found = spawnSync('losetup', ['-j', image, '-O', 'NAME', '-n'], { encoding: 'utf8' }).stdout;
        for (const device of found.split('\n').filter((d) => d.startsWith('/dev/loop'))) spawnSync('losetup', ['-d', device]);
        spawnSync(process.execPath, ['bin/latch', 'volume', 'delete', volume], { env: { ...process.env, LATCH_CONFIG: configFile } });
      }
    }
  });
});

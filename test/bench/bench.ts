// npm run bench: what a driver call costs, as ratios to baselines measured in the same run (the machine is shared
// and noisy, so absolute times mean little). Candidates run interleaved, after warm-up, with several repetitions;
// every call's reply is checked, since a call that fails is not a fast call.
//
//   npm run bench                     every section
//   npm run bench -- --only io,rbd    some sections (calls, ledger, lifecycle, concurrent, execa, io, rbd, backup, backup-rbd, backup-s3, cephfs); the results file
//                                     keeps the other sections' figures from their last run, and the docs those
//                                     they show from a later run (figures.ts)
import { spawn, spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, tmpdir, totalmem } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { addTicket, newVolume } from '../../src/ledger/arbitrate.js';
import { ticketId } from '../../src/ledger/ids.js';
import { EtcdStore } from '../../src/store/etcd.js';
import { FileStore } from '../../src/store/file.js';
import type { Store } from '../../src/store/types.js';
import { nativeHelper, useNativeHelper } from '../../src/sys/native.js';
import { reloadPageCache } from '../../src/sys/page-cache.js';
import { run } from '../../src/sys/run.js';
import { EtcdCluster, etcdSkipReason } from '../etcd/etcd.js';
import { NATIVE_HELPER } from '../fixtures/native-helper.js';
import { printFigures, SECTIONS, writeReports, type Figure, type Results, type Section } from './figures.js';
import { backupThroughput } from './backup.js';
import { rbdBackupBench } from './backup-rbd.js';
import { s3BackupBench } from './backup-s3.js';
import { sharedIo } from './cephfs.js';
import { cachedBytes, cleanUp, evict, loopIo, rbdIo, syncFile } from './io.js';

const ROOT = join(__dirname, '..', '..');
const NODE = process.execPath;
const REPS = Number(process.env.BENCH_REPS ?? 15);
/**
 * The repetitions of single calls (the per-call costs, the ledger's scaling): the differences they must tell apart are
 * a few percent of a 30 ms process, which this machine's noise hides in 15 (ratios moved by 0.05-0.1 between runs);
 * single calls are cheap enough to run more.
 */
const CALL_REPS = Number(process.env.BENCH_CALL_REPS ?? 3 * REPS);
const WARMUP = 3;
const isRoot = process.getuid?.() === 0;
const TIME = existsSync('/usr/bin/time') ? '/usr/bin/time' : undefined;

/** The unit of /proc's CPU times (USER_HZ), read once: getconf is a child whose CPU would count too. */
const CLOCK_TICKS = Number(spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).stdout?.trim()) || 100;

interface Sample {
  ms: number;
  /** CPU (user + system) of the command and its children, from /proc/self/stat, in 10 ms ticks. */
  cpuMs: number;
  rssKiB?: number;
}
interface Stats {
  median: number;
  min: number;
  max: number;
  /** The mean CPU: /proc counts in ticks of 10 ms, so a median of single calls would only say 0, 10 or 20. */
  cpuMeanMs: number;
  rssKiB?: number;
}
const results: Record<string, unknown> = { machine: machine(), reps: REPS, callReps: CALL_REPS };
const figures: Figure[] = [];

function stats(samples: Sample[]): Stats {
  const ms = samples.map((s) => s.ms).sort((a, b) => a - b);
  const rss = samples
    .map((s) => s.rssKiB)
    .filter((r): r is number => r !== undefined)
    .sort((a, b) => a - b);
  const [median, min, max] = [ms[Math.floor(ms.length / 2)], ms[0], ms.at(-1)];
  if (median === undefined || min === undefined || max === undefined) throw new Error('no samples to summarize');
  return {
    median,
    min,
    max,
    cpuMeanMs: samples.reduce((sum, s) => sum + s.cpuMs, 0) / samples.length,
    ...(rss.length > 0 && { rssKiB: rss[Math.floor(rss.length / 2)] }),
  };
}

/** Runs one command, timing it; with /usr/bin/time also its peak RSS. Throws if `check` rejects its output. */
function runOnce(argv: string[], env: NodeJS.ProcessEnv, check?: (stdout: string, code: number) => boolean): Sample {
  const [file, ...args] = TIME ? [TIME, '-f', '%M', ...argv] : argv;
  if (file === undefined) throw new Error('runOnce: no command');
  const cpuBefore = childrenCpuSeconds();
  const started = process.hrtime.bigint();
  const r = spawnSync(file, args, { env, encoding: 'utf8' });
  const ms = Number(process.hrtime.bigint() - started) / 1e6;
  const cpuMs = (childrenCpuSeconds() - cpuBefore) * 1000;
  const stderrLines = r.stderr.trim().split('\n');
  const rssKiB = TIME ? Number(stderrLines[stderrLines.length - 1]) : undefined;
  if (check && !check(r.stdout, r.status ?? -1)) {
    throw new Error(`benchmark call failed: ${argv.slice(1).join(' ').slice(0, 120)} -> ${r.stdout} ${r.stderr}`);
  }
  return { ms, cpuMs, ...(rssKiB !== undefined && !Number.isNaN(rssKiB) && { rssKiB }) };
}

/**
 * The largest RssAnon seen in /proc/PID/status while `argv` runs, over 5 runs: the memory a call has of its own. Peak
 * RSS (from wait4) also counts the executable's page cache as mapped, which is shared by every process running it.
 */
function peakAnonymousKiB(argv: string[], env: NodeJS.ProcessEnv): number {
  let peak = 0;
  for (let round = 0; round < 5; round++) {
    const [file, ...args] = argv;
    if (file === undefined) throw new Error('peakAnonymousKiB: no command');
    const child = spawn(file, args, { env, stdio: 'ignore' });
    // Read as fast as the loop goes until the process is a zombie (its memory is gone) or reaped.
    for (;;) {
      let status: string;
      try {
        status = readFileSync(`/proc/${child.pid}/status`, 'utf8');
      } catch {
        break;
      }
      if (/^State:\s+Z/m.test(status)) break;
      const anon = /^RssAnon:\s+(\d+) kB/m.exec(status);
      if (anon?.[1]) peak = Math.max(peak, Number(anon[1]));
    }
  }
  return peak;
}

/**
 * Measures several candidates interleaved: rep 1 of each, rep 2 of each, ... so drift hits all alike; each rep in a
 * new random order, so that no candidate always runs after the same one (seen: one executable 0.04-0.06 apart in
 * two positions of a fixed order, against `node -e 0` in the same runs).
 */
function measure(candidates: Record<string, () => Sample>, reps = REPS): Record<string, Stats> {
  const samples: Record<string, Sample[]> = {};
  for (const name of Object.keys(candidates)) samples[name] = [];
  for (let i = 0; i < WARMUP + reps; i++) {
    for (const [name, fn] of shuffled(Object.entries(candidates))) {
      const s = fn();
      if (i >= WARMUP) samples[name]!.push(s);
    }
  }
  return Object.fromEntries(Object.entries(samples).map(([n, s]) => [n, stats(s)]));
}

/** `items` in a random order (sorted by random keys). */
function shuffled<T>(items: readonly T[]): T[] {
  return items
    .map((item) => ({ item, key: Math.random() }))
    .sort((a, b) => a.key - b.key)
    .map(({ item }) => item);
}

function table(title: string, rows: string[][]): void {
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
  console.log(`\n${title}`);
  for (const r of rows) console.log(`  ${r.map((c, i) => c.padEnd(widths[i] ?? 0)).join('  ')}`);
}

const fmt = (n: number) => n.toFixed(1);
const ok = (stdout: string, code: number) => {
  try {
    const reply = JSON.parse(stdout) as { status?: string };
    return code === 0 && reply.status === 'Success';
  } catch {
    return false;
  }
};

/**
 * The environment every measured command runs with: ours, without what makes Node itself start slower and kubelet
 * would not pass. NODE_EXTRA_CA_CERTS (set on this machine to the system bundle) makes every Node process parse
 * ~150 certificates before it runs anything: measured 60 ms of CPU on top of a 30 ms `node -e 0`, which would hide
 * latch's own start-up cost in every ratio. NODE_OPTIONS would change what the baseline runs.
 */
function callEnv(): NodeJS.ProcessEnv {
  const env = { ...process.env };
  delete env.NODE_EXTRA_CA_CERTS;
  delete env.NODE_OPTIONS;
  return env;
}

function workDir(store?: Record<string, unknown>): { dir: string; env: NodeJS.ProcessEnv } {
  const dir = mkdtempSync(join(tmpdir(), 'latch-bench-'));
  const config = {
    nodeName: 'node-a',
    stateDir: join(dir, 'state'),
    poolDir: join(dir, 'pool'),
    logFile: join(dir, 'latch.log'),
    defaultSize: '64Mi',
    ...(store && { store }),
  };
  writeFileSync(join(dir, 'config.json'), JSON.stringify(config));
  return { dir, env: { ...callEnv(), LATCH_CONFIG: join(dir, 'config.json') } };
}

const optionsFor = (pv: string) =>
  JSON.stringify({ 'kubernetes.io/fsType': '', 'kubernetes.io/pvOrVolumeName': pv, 'kubernetes.io/readwrite': 'rw' });

const LATCH_BIN = join(ROOT, 'bin/latch');

function drivers(): Record<string, string[]> {
  const found: Record<string, string[]> = { 'bin/latch': [LATCH_BIN] };
  if (existsSync(join(ROOT, 'bin/latch-sea'))) found['bin/latch-sea'] = [join(ROOT, 'bin/latch-sea')];
  return found;
}

/**
 * A copy of the single executable whose page cache is dropped, so that its calls fault it in by the kernel's
 * read-around, in 4 KiB pieces, and keep it so: what a node has after memory pressure evicted the driver since
 * `latch install` last reloaded it (src/sys/page-cache.ts). bin/latch-sea itself is measured as install leaves it.
 */
function evictedCopy(dir: string): string[] | undefined {
  const sea = drivers()['bin/latch-sea']?.[0];
  if (sea === undefined) return undefined;
  const copy = join(dir, 'latch-sea-evicted');
  copyFileSync(sea, copy);
  evict(copy);
  return [copy];
}

const EVICTED_ISATTACHED = 'bin/latch-sea isattached, its page cache evicted (faulted back in 4 KiB pieces)';
const EVICTED_LIFECYCLE = 'bin/latch-sea pod lifecycle, its page cache evicted';

function controlPlaneCalls(): void {
  const { dir, env } = workDir();
  try {
    const json = optionsFor('pv-bench');
    const candidates: Record<string, () => Sample> = { 'node -e 0': () => runOnce([NODE, '-e', '0'], env) };
    for (const [name, cmd] of Object.entries(drivers())) {
      runOnce([...cmd, 'attach', json, 'node-a'], env, ok);
      candidates[`${name} init`] = () => runOnce([...cmd, 'init'], env, ok);
      candidates[`${name} getvolumename`] = () => runOnce([...cmd, 'getvolumename', json], env, ok);
      candidates[`${name} isattached`] = () => runOnce([...cmd, 'isattached', json, 'node-a'], env, ok);
      candidates[`${name} attach (attached)`] = () => runOnce([...cmd, 'attach', json, 'node-a'], env, ok);
    }
    const evicted = evictedCopy(dir);
    if (evicted) candidates[EVICTED_ISATTACHED] = () => runOnce([...evicted, 'isattached', json, 'node-a'], env, ok);
    const s = measure(candidates, CALL_REPS);
    const base = s['node -e 0']!.median;
    const cpuBase = s['node -e 0']!.cpuMeanMs;
    results.controlPlane = s;
    for (const [n, v] of Object.entries(s)) {
      if (n === 'node -e 0') continue;
      const ratio = v.median / base;
      const cpuRatio = v.cpuMeanMs / cpuBase;
      const evictedRow = n === EVICTED_ISATTACHED;
      figures.push({
        section: 'calls',
        what: `${n} / node -e 0`,
        // The CPU ratio is robust to the machine's other load, which wall times on a shared machine are not.
        value: `${ratio.toFixed(2)} (CPU ${cpuRatio.toFixed(2)})`,
        target: evictedRow ? '' : '<= 1.10',
        ...(!evictedRow && { pass: ratio <= 1.1 }),
      });
      if (v.rssKiB !== undefined && n.endsWith(' init')) {
        const rss = v.rssKiB / 1024;
        figures.push({
          section: 'calls',
          what: `${n.replace(/ init$/, '')} peak RSS`,
          value: `${fmt(rss)} MiB`,
          target: '<= 60 MiB',
          pass: rss <= 60,
        });
        const driver = drivers()[n.replace(/ init$/, '')];
        if (driver) {
          const anon = (cmd: string[]) => `${fmt(peakAnonymousKiB(cmd, env) / 1024)} MiB`;
          figures.push({
            section: 'calls',
            what: `${n.replace(/ init$/, '')} isattached: peak anonymous memory (RssAnon, sampled; what RSS counts beyond the executable's shared page cache)`,
            value: `${anon([...driver, 'isattached', json, 'node-a'])} (node -e 0: ${anon([NODE, '-e', '0'])})`,
            target: '',
          });
        }
      }
    }
    table('Per-call wall time, CPU and peak RSS (wall medians, CPU means; ratios to bare `node -e 0`; target <= 1.10, RSS <= 60 MiB)', [
      ['call', 'median ms', 'min', 'max', 'ratio', 'CPU ms', 'CPU ratio', 'peak RSS MiB'],
      ...Object.entries(s).map(([n, v]) => [
        n,
        fmt(v.median),
        fmt(v.min),
        fmt(v.max),
        (v.median / base).toFixed(2),
        fmt(v.cpuMeanMs),
        (v.cpuMeanMs / cpuBase).toFixed(2),
        v.rssKiB ? fmt(v.rssKiB / 1024) : 'n/a',
      ]),
    ]);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** The driver a production node runs: the single executable when it was built, else the bundle. */
function productionDriver(): string {
  const sea = join(ROOT, 'bin/latch-sea');
  return existsSync(sea) ? sea : LATCH_BIN;
}

/** Writes `count` volumes, each with a granted-looking workload ticket, in parallel batches. */
async function fillLedger(store: Store, count: number): Promise<void> {
  const now = new Date().toISOString();
  const BATCH = 64;
  for (let first = 0; first < count; first += BATCH) {
    await Promise.all(
      Array.from({ length: Math.min(BATCH, count - first) }, async (_, j) => {
        const name = `vol-${first + j}`;
        const id = ticketId('workload', name, 'latch/loop', 'node-a');
        const doc = addTicket(
          newVolume(name, 64 << 20, 'ext4', now),
          { id, type: 'workload', nodeID: 'node-a', parameters: { readOnly: false }, requestedBy: { pvName: name } },
          now,
        );
        await store.put(`volumes/${name}`, doc, 0);
      }),
    );
  }
}

/**
 * `isattached` and `attach` of one volume with 10 and with 10,000 volumes in the ledger, on the file store and, when
 * etcd is installed, on an etcd store (a one-member cluster started for the section, as the tests do).
 */
async function ledgerScaling(): Promise<void> {
  const driver = productionDriver();
  const rows: string[][] = [['store', 'call', '10 volumes ms', '10,000 volumes ms', 'ratio (target <= 1.10)']];
  const out: Record<string, unknown> = { driver: driver.slice(ROOT.length + 1) };
  const kinds: ('file' | 'etcd')[] = ['file'];
  const skip = etcdSkipReason();
  let cluster: EtcdCluster | undefined;
  if (skip) {
    console.log(`\nledger: no etcd run (${skip})`);
    figures.push({ section: 'ledger', what: 'etcd store', value: `skipped: ${skip}`, target: '' });
  } else {
    cluster = await EtcdCluster.start({ size: 1 });
    kinds.push('etcd');
  }
  const setups: { dir: string; env: NodeJS.ProcessEnv; count: number; kind: 'file' | 'etcd' }[] = [];
  try {
    for (const kind of kinds) {
      for (const count of [10, 10_000]) {
        const prefix = `/latch-bench/${count}-${process.pid}/`;
        const etcd = kind === 'etcd' && cluster ? { type: 'etcd', endpoints: cluster.endpoints, prefix } : undefined;
        const { dir, env } = workDir(etcd);
        const store =
          etcd && cluster ? new EtcdStore({ endpoints: cluster.endpoints, prefix, timeoutMs: 10_000 }) : new FileStore(join(dir, 'state'));
        const started = performance.now();
        await fillLedger(store, count);
        await store.close();
        console.log(`ledger: ${count} volumes in the ${kind} store written in ${((performance.now() - started) / 1000).toFixed(1)} s`);
        setups.push({ dir, env, count, kind });
      }
    }
    const json = optionsFor('vol-7');
    const candidates: Record<string, () => Sample> = {};
    for (const { env, count, kind } of setups) {
      candidates[`${kind} isattached@${count}`] = () => runOnce([driver, 'isattached', json, 'node-a'], env, ok);
      candidates[`${kind} attach@${count}`] = () => runOnce([driver, 'attach', json, 'node-a'], env, ok);
    }
    const s = measure(candidates, CALL_REPS);
    out.stats = s;
    for (const kind of kinds) {
      for (const call of ['isattached', 'attach']) {
        const small = s[`${kind} ${call}@10`]!.median;
        const large = s[`${kind} ${call}@10000`]!.median;
        const ratio = large / small;
        rows.push([kind, call, fmt(small), fmt(large), ratio.toFixed(2)]);
        figures.push({
          section: 'ledger',
          what: `${kind} store: ${call} at 10,000 volumes / at 10`,
          value: ratio.toFixed(2),
          target: '<= 1.10',
          pass: ratio <= 1.1,
        });
      }
    }
    results.ledgerScaling = out;
    table(`Ledger size: the same call (${out.driver as string}) with 10 and with 10,000 volumes`, rows);
  } finally {
    for (const { dir } of setups) rmSync(dir, { recursive: true, force: true });
    await cluster?.stop();
  }
}

/**
 * The raw tools a pod lifecycle needs at the least: the invocations latch makes (the loop device with direct I/O on
 * 512-byte sectors, `umount -d` freeing it), without latch.
 */
function rawFloor(dir: string, i: number): Sample {
  const image = join(dir, `raw-${i}.img`);
  const mnt = join(dir, `raw-${i}`);
  mkdirSync(mnt, { recursive: true });
  const cpuBefore = childrenCpuSeconds();
  const started = process.hrtime.bigint();
  const sh = (cmd: string, ...args: string[]) => {
    const r = spawnSync(cmd, args, { encoding: 'utf8', env: callEnv() });
    if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')}: ${r.stderr}`);
    return r.stdout.trim();
  };
  sh('truncate', '-s', '64M', image);
  const dev = sh('losetup', '--find', '--show', '--direct-io=on', '--sector-size', '512', image);
  sh('mkfs.ext4', '-F', '-q', '-E', 'lazy_itable_init=1,lazy_journal_init=1', dev);
  sh('mount', '-t', 'ext4', dev, mnt);
  sh('umount', '--detach-loop', mnt);
  const ms = Number(process.hrtime.bigint() - started) / 1e6;
  const cpuMs = (childrenCpuSeconds() - cpuBefore) * 1000;
  rmSync(image);
  return { ms, cpuMs };
}

function lifecycle(cmd: string[], env: NodeJS.ProcessEnv, dir: string, pv: string): Sample {
  const json = optionsFor(pv);
  const global = join(dir, 'mounts', pv);
  mkdirSync(global, { recursive: true });
  const cpuBefore = childrenCpuSeconds();
  const started = process.hrtime.bigint();
  runOnce([...cmd, 'attach', json, 'node-a'], env, ok);
  const [file, ...args] = cmd;
  if (file === undefined) throw new Error('lifecycle: no command');
  const wait = spawnSync(file, [...args, 'waitforattach', '', json], { env, encoding: 'utf8' });
  const device = (JSON.parse(wait.stdout) as { device?: string }).device;
  if (!device) throw new Error(`waitforattach failed: ${wait.stdout}`);
  runOnce([...cmd, 'mountdevice', global, device, json], env, ok);
  runOnce([...cmd, 'unmountdevice', global], env, ok);
  runOnce([...cmd, 'detach', pv, 'node-a'], env, ok);
  return { ms: Number(process.hrtime.bigint() - started) / 1e6, cpuMs: (childrenCpuSeconds() - cpuBefore) * 1000 };
}

function podLifecycle(): void {
  const { dir, env } = workDir();
  try {
    let n = 0;
    const candidates: Record<string, () => Sample> = {
      'node -e 0': () => runOnce([NODE, '-e', '0'], env),
      'raw tools floor': () => rawFloor(dir, n++),
    };
    for (const [name, cmd] of Object.entries(drivers())) {
      candidates[`${name} lifecycle`] = () => lifecycle(cmd, env, dir, `pv-life-${n++}`);
    }
    const evicted = evictedCopy(dir);
    if (evicted) candidates[EVICTED_LIFECYCLE] = () => lifecycle(evicted, env, dir, `pv-life-${n++}`);
    const s = measure(candidates);
    const node = s['node -e 0']!.median;
    const floor = s['raw tools floor']!.median;
    const overhead: Record<string, number> = {};
    const nodeCpu = s['node -e 0']!.cpuMeanMs;
    const floorCpu = s['raw tools floor']!.cpuMeanMs;
    const rows = Object.entries(s).map(([k, v]) => [k, fmt(v.median), fmt(v.min), fmt(v.max), fmt(v.cpuMeanMs), '', '']);
    // Each driver against the target; the evicted copy, when there is one, beside them without it.
    const measured: [name: string, what: string, stats: Stats | undefined, target: boolean][] = [
      ...Object.keys(drivers()).map((name): [string, string, Stats | undefined, boolean] => [
        name,
        `${name} pod lifecycle`,
        s[`${name} lifecycle`],
        true,
      ]),
      ['bin/latch-sea, evicted', EVICTED_LIFECYCLE, s[EVICTED_LIFECYCLE], false],
    ];
    for (const [name, what, stats, target] of measured) {
      if (stats === undefined) continue;
      const starts = (stats.median - floor) / node;
      const cpuStarts = (stats.cpuMeanMs - floorCpu) / nodeCpu;
      overhead[name] = starts;
      figures.push({
        section: 'lifecycle',
        what: `${what}: node starts over the raw tools floor`,
        // The same count in CPU time, which the machine's other load does not move.
        value:
          `${starts.toFixed(1)} (${fmt(stats.median)} ms, floor ${fmt(floor)} ms; ` +
          `CPU: ${cpuStarts.toFixed(1)}, ${fmt(stats.cpuMeanMs)} ms, floor ${fmt(floorCpu)} ms)`,
        target: target ? '<= 5' : '',
        ...(target && { pass: starts <= 5 }),
      });
      rows.push([
        `${name}: (lifecycle - floor) / node`,
        '',
        '',
        '',
        `${cpuStarts.toFixed(2)} by CPU`,
        starts.toFixed(2),
        (stats.median / (floor + 5 * node)).toFixed(2),
      ]);
    }
    results.podLifecycle = { ...s, overheadInNodeStarts: overhead };
    table('Pod lifecycle (attach, waitforattach, mountdevice, unmountdevice, detach) on a fresh 64 MiB volume', [
      ['what', 'median ms', 'min', 'max', 'CPU ms (mean)', 'node starts over floor (target <= 5)', 'vs floor + 5 node starts'],
      ...rows,
    ]);
  } finally {
    cleanUp(dir);
  }
}

/** CPU seconds (user + system) used so far by this process's waited-for children, from /proc/self/stat. */
function childrenCpuSeconds(): number {
  const stat = readFileSync('/proc/self/stat', 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // After "pid (comm) ": state is field 3, so cutime (16) and cstime (17) are at indexes 13 and 14 here.
  const ticks = Number(fields[13]) + Number(fields[14]);
  return ticks / CLOCK_TICKS;
}

/**
 * How the concurrency section starts its calls: as kubelet does, which runs a driver with Go's os/exec (a `vfork`-like
 * clone that costs the caller well under a millisecond), by latch's own run() through the native helper where the
 * build has one. A fork from this process (node:child_process) costs it about 10 ms of CPU a call: 7% of the machine
 * while 64 lifecycles run, taken from the calls the bound counts. Without the helper, run()'s node:child_process.
 */
function callStarter(driver: string): {
  call: (args: string[], env: NodeJS.ProcessEnv) => Promise<{ stdout: string; code: number }>;
  how: string;
} {
  if (existsSync(NATIVE_HELPER)) useNativeHelper(NATIVE_HELPER);
  return {
    how: nativeHelper() ? 'vfork (the native helper)' : 'node:child_process',
    call: async (args, env) => {
      const { stdout, exitCode } = await run(driver, args, { env, okExitCodes: [1] });
      return { stdout, code: exitCode };
    },
  };
}

/**
 * One pod lifecycle (attach, waitforattach, mountdevice, unmountdevice, detach) through `call`, on volume `pv`: its
 * wall milliseconds, or undefined when a step failed (the failing call and its reply then go to `failed`).
 */
function lifecycleThrough(
  call: ReturnType<typeof callStarter>['call'],
  dir: string,
  env: NodeJS.ProcessEnv,
  failed: string[],
): (pv: string, callEnv?: NodeJS.ProcessEnv) => Promise<number | undefined> {
  return async (pv, callEnv = env) => {
    const json = optionsFor(pv);
    const global = join(dir, 'mounts', pv);
    mkdirSync(global, { recursive: true });
    const started = process.hrtime.bigint();
    const step = async (args: string[]): Promise<string | undefined> => {
      const { stdout, code } = await call(args, callEnv);
      if (ok(stdout, code)) return stdout;
      failed.push(`${pv} ${args[0]}: exit ${code}, ${stdout.trim() || '(no reply)'}`);
      return undefined;
    };
    try {
      if ((await step(['attach', json, 'node-a'])) === undefined) return undefined;
      const waited = await step(['waitforattach', '', json]);
      const device = waited === undefined ? undefined : (JSON.parse(waited) as { device?: string }).device;
      if (!device) return undefined;
      if ((await step(['mountdevice', global, device, json])) === undefined) return undefined;
      if ((await step(['unmountdevice', global])) === undefined) return undefined;
      if ((await step(['detach', pv, 'node-a'])) === undefined) return undefined;
      return Number(process.hrtime.bigint() - started) / 1e6;
    } catch (err) {
      failed.push(`${pv}: ${err instanceof Error ? err.message : String(err)}`);
      return undefined;
    }
  };
}

/**
 * `count` pod lifecycles on `count` volumes at once, against the machine's bound: the CPU one lifecycle costs (its
 * node starts, latch's work and the tools, measured on sequential lifecycles in the same run) divided into the
 * cores. A rate well below the bound means something serializes the lifecycles rather than the CPU limiting them.
 */
async function concurrentLifecycles(count: number): Promise<void> {
  const driver = productionDriver();
  const { dir, env } = workDir();
  const { call, how: spawnedBy } = callStarter(driver);
  // The same calls without turns (src/native/turns.c), for comparison: all of them running at once.
  const envWithoutTurns = { ...env, LATCH_TURNS: '0' };
  // Each failed lifecycle's failing call and its reply (or exit code), kept in the results file: a failure under
  // load is rare, and without its reply there is nothing to go on.
  const failed: string[] = [];
  const one = lifecycleThrough(call, dir, env, failed);
  try {
    // The CPU of one lifecycle alone, from sequential ones.
    const SEQUENTIAL = 8;
    const cpuBefore = childrenCpuSeconds();
    for (let i = 0; i < SEQUENTIAL; i++) lifecycle([driver], env, dir, `pv-cpu-${i}`);
    const cpuPerLifecycle = (childrenCpuSeconds() - cpuBefore) / SEQUENTIAL;
    const cores = cpus().length;
    // And with every core busy: one stream of lifecycles per core, side by side. This is what the bound divides into
    // the cores, since it is what the machine allows: its cores run a process slower while the others are busy
    // (`node -e 0`, 64 one after another against two streams of 32 at once: 1.15-1.20 times the CPU on the
    // machine of 2026-11-26), which a CPU-only loop does not show (1.00) and the CPU alone does not count.
    const BUSY_ROUNDS = 4;
    const cpuBeforeBusy = childrenCpuSeconds();
    await Promise.all(
      Array.from({ length: cores }, async (_, core) => {
        for (let round = 0; round < BUSY_ROUNDS; round++) {
          if ((await one(`pv-busy-${core}-${round}`)) === undefined)
            throw new Error(`a lifecycle with every core busy failed: ${failed.join('; ')}`);
        }
      }),
    );
    const cpuPerLifecycleBusy = (childrenCpuSeconds() - cpuBeforeBusy) / (cores * BUSY_ROUNDS);
    const boundAlone = cores / cpuPerLifecycle;
    const bound = cores / cpuPerLifecycleBusy;

    /** `count` lifecycles at once: wall seconds, the CPU they used, the bench's own, and each one's time. */
    const allAtOnce = async (name: string, callEnv: NodeJS.ProcessEnv) => {
      const started = process.hrtime.bigint();
      const cpuAtStart = childrenCpuSeconds();
      const harnessAtStart = process.cpuUsage();
      const times = await Promise.all(Array.from({ length: count }, (_, i) => one(`pv-${name}-${i}`, callEnv)));
      const wall = Number(process.hrtime.bigint() - started) / 1e3 / 1e6;
      const harnessUsage = process.cpuUsage(harnessAtStart);
      return {
        wall,
        cpu: childrenCpuSeconds() - cpuAtStart,
        harnessCpu: (harnessUsage.user + harnessUsage.system) / 1e6,
        done: times.filter((t): t is number => t !== undefined).sort((a, b) => a - b),
      };
    };
    const loadAtStart = loadavg()[0] ?? 0;
    const { wall, cpu: concurrentCpu, harnessCpu, done } = await allAtOnce('conc', env);
    // The share of the machine the lifecycles actually got: near 1 with nothing else running and nothing
    // serializing them; on a shared machine the other load takes its part.
    const utilization = concurrentCpu / (wall * cores);
    const failures = count - done.length;
    const rate = done.length / wall;
    const withoutTurns = await allAtOnce('noturn', envWithoutTurns);
    const rateWithoutTurns = withoutTurns.done.length / withoutTurns.wall;
    const pct = (p: number) => done[Math.min(done.length - 1, Math.floor(done.length * p))] ?? NaN;
    results.concurrent = {
      count,
      driver: driver.slice(ROOT.length + 1),
      wallSeconds: wall,
      throughputPerSecond: rate,
      cpuSecondsPerLifecycle: cpuPerLifecycle,
      cpuSecondsPerLifecycleEveryCoreBusy: cpuPerLifecycleBusy,
      cores,
      machineBoundPerSecond: bound,
      boundFromLifecyclesAlonePerSecond: boundAlone,
      cpuSecondsPerLifecycleConcurrent: concurrentCpu / count,
      cpuShareUsed: utilization,
      withoutTurns: {
        throughputPerSecond: rateWithoutTurns,
        cpuSecondsPerLifecycle: withoutTurns.cpu / count,
        cpuShareUsed: withoutTurns.cpu / (withoutTurns.wall * cores),
        failures: count - withoutTurns.done.length,
      },
      callsStartedBy: spawnedBy,
      harnessCpuShare: harnessCpu / (wall * cores),
      loadAverageAtStart: loadAtStart,
      p50: pct(0.5),
      p99: pct(0.99),
      failures,
      failed,
    };
    figures.push({
      section: 'concurrent',
      what: `${count} concurrent pod lifecycles: failures`,
      value: failures === 0 ? '0' : `${failures} (first: ${failed[0] ?? 'no reply recorded'})`,
      target: '0',
      pass: failures === 0,
    });
    figures.push({
      section: 'concurrent',
      what: `${count} concurrent pod lifecycles: rate / machine bound (${cores} cores / ${(cpuPerLifecycleBusy * 1000).toFixed(0)} ms CPU per lifecycle with every core busy)`,
      value:
        `${(rate / bound).toFixed(2)} (${rate.toFixed(2)} vs ${bound.toFixed(2)} lifecycles/s; used ${(utilization * 100).toFixed(0)}% of the CPU, ` +
        `load ${loadAtStart.toFixed(1)}; against the CPU of a lifecycle alone, ${(cpuPerLifecycle * 1000).toFixed(0)} ms: ${(rate / boundAlone).toFixed(2)})`,
      target: '>= 0.80',
      pass: rate / bound >= 0.8,
    });
    figures.push({
      section: 'concurrent',
      what: `${count} concurrent pod lifecycles without turns (LATCH_TURNS=0: all ${count} at once): rate / machine bound`,
      value:
        `${(rateWithoutTurns / bound).toFixed(2)} (${rateWithoutTurns.toFixed(2)} lifecycles/s, ` +
        `${((withoutTurns.cpu / count) * 1000).toFixed(0)} ms CPU each; ${count - withoutTurns.done.length} failed)`,
      target: '',
    });
    table(`${count} concurrent pod lifecycles on ${count} volumes (target: 0 failures, rate >= 0.80 of the machine bound)`, [
      [
        'wall s',
        'lifecycles/s',
        'CPU ms / lifecycle (alone, every core busy, among all)',
        'CPU share used',
        'bound /s',
        'rate / bound',
        'p50 ms',
        'p99 ms',
        'failures',
      ],
      [
        wall.toFixed(1),
        rate.toFixed(2),
        `${(cpuPerLifecycle * 1000).toFixed(0)}, ${(cpuPerLifecycleBusy * 1000).toFixed(0)}, ${((concurrentCpu / count) * 1000).toFixed(0)}`,
        `${(utilization * 100).toFixed(0)}% (load ${loadAtStart.toFixed(1)} at the start; the bench's own ${((harnessCpu / (wall * cores)) * 100).toFixed(0)}%)`,
        bound.toFixed(2),
        (rate / bound).toFixed(2),
        fmt(pct(0.5)),
        fmt(pct(0.99)),
        String(failures),
      ],
    ]);
  } finally {
    cleanUp(dir);
  }
}

const EXECA_SEA = join(ROOT, 'bin/latch-sea-execa');

/**
 * execa against today's runner (docs/performance.md, "execa"). The design named execa for running tools; run() starts
 * children itself (node:child_process, then the native helper's vfork) because execa cost a call 10-25 ms of CPU.
 * Measured again here with execa given its best case, in three ways, each as ratios taken in one run:
 * - per child, in this process, with execa loaded already: only its per-child work, as if it were evaluated in a
 *   startup snapshot (the build has none: a call would also pay for evaluating it, below);
 * - per pod lifecycle, bin/latch-sea against bin/latch-sea-execa (build.mjs --spawn-module test/bench/execa-spawn.ts),
 *   whose code cache holds execa's compiled code as it holds latch's; execa is evaluated at a call's first child;
 * - the rate of 64 lifecycles at once, each executable twice, alternating.
 */
async function execaAgainstRunner(count: number): Promise<void> {
  const sea = join(ROOT, 'bin/latch-sea');
  if (!existsSync(sea) || !existsSync(NATIVE_HELPER))
    throw new Error('the execa section compares against bin/latch-sea: npm run build:sea');
  const built = spawnSync(NODE, ['build.mjs', '--sea', '--spawn-module', 'test/bench/execa-spawn.ts', '--out', EXECA_SEA], {
    cwd: ROOT,
    encoding: 'utf8',
  });
  if (built.status !== 0) throw new Error(`cannot build ${EXECA_SEA}: ${built.stderr}`);
  await asInstalled(EXECA_SEA);

  // Per child, in this process: today's spawn (through the helper, as a driver call) and execa's, both warm.
  if (existsSync(NATIVE_HELPER)) useNativeHelper(NATIVE_HELPER);
  const { spawnCollecting: today } = await import('../../src/sys/run/spawn.js');
  const { spawnCollecting: withExeca, loadExeca } = await import('./execa-spawn.js');
  await loadExeca();
  const tool = '/usr/bin/true';
  const spawnOptions = { input: undefined, stdinFd: undefined, env: { ...callEnv(), LC_ALL: 'C' } };
  const CHILDREN = 200;
  const perChild = async (start: typeof today): Promise<{ ms: number; cpuMs: number }> => {
    const cpu = process.cpuUsage();
    const children = childrenCpuSeconds();
    const started = process.hrtime.bigint();
    for (let i = 0; i < CHILDREN; i++) {
      const { exitCode } = await start(tool, [], spawnOptions).done;
      if (exitCode !== 0) throw new Error(`${tool} exited ${exitCode}`);
    }
    const own = process.cpuUsage(cpu);
    return {
      ms: Number(process.hrtime.bigint() - started) / 1e6 / CHILDREN,
      cpuMs: ((own.user + own.system) / 1e3 + (childrenCpuSeconds() - children) * 1000) / CHILDREN,
    };
  };
  // The helper's children are reaped on SIGCHLD, whose listener does not keep a process alive (run()'s deadline does).
  const keepAlive = setInterval(() => undefined, 1000);
  await perChild(today);
  await perChild(withExeca);
  const childRounds: Record<'today' | 'execa', { ms: number; cpuMs: number }[]> = { today: [], execa: [] };
  for (let round = 0; round < 5; round++) {
    childRounds.today.push(await perChild(today));
    childRounds.execa.push(await perChild(withExeca));
  }
  clearInterval(keepAlive);
  const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? NaN;
  const child = {
    today: { ms: median(childRounds.today.map((r) => r.ms)), cpuMs: median(childRounds.today.map((r) => r.cpuMs)) },
    execa: { ms: median(childRounds.execa.map((r) => r.ms)), cpuMs: median(childRounds.execa.map((r) => r.cpuMs)) },
  };

  const { dir, env } = workDir();
  try {
    // Per pod lifecycle, interleaved.
    let n = 0;
    const life = measure({
      today: () => lifecycle([sea], env, dir, `pv-exl-${n++}`),
      execa: () => lifecycle([EXECA_SEA], env, dir, `pv-exl-${n++}`),
    });
    // 64 at once, each executable twice, alternating.
    const failed: string[] = [];
    const rates: Record<'today' | 'execa', { rate: number; cpuMs: number }[]> = { today: [], execa: [] };
    for (let round = 0; round < 2; round++) {
      for (const [name, driver] of [
        ['today', sea],
        ['execa', EXECA_SEA],
      ] as const) {
        const { call } = callStarter(driver);
        const one = lifecycleThrough(call, dir, env, failed);
        const cpuAtStart = childrenCpuSeconds();
        const started = process.hrtime.bigint();
        const times = await Promise.all(Array.from({ length: count }, (_, i) => one(`pv-ex${name}-${round}-${i}`)));
        const wall = Number(process.hrtime.bigint() - started) / 1e9;
        if (times.some((t) => t === undefined)) throw new Error(`${name}: a lifecycle failed: ${failed.join('; ')}`);
        rates[name].push({ rate: count / wall, cpuMs: ((childrenCpuSeconds() - cpuAtStart) * 1000) / count });
      }
    }
    const rate = (name: 'today' | 'execa') => rates[name].reduce((sum, r) => sum + r.rate, 0) / rates[name].length;
    const rateCpu = (name: 'today' | 'execa') => rates[name].reduce((sum, r) => sum + r.cpuMs, 0) / rates[name].length;
    const pct = (execa: number, today: number) => `${(((execa - today) / today) * 100).toFixed(1)}%`;
    results.execa = { child, childRounds, lifecycle: life, rates, children: CHILDREN };
    figures.push(
      {
        section: 'execa',
        what: `per child (${tool}, in-process, execa loaded already): execa / today's runner (vfork through the native helper)`,
        value:
          `${(child.execa.cpuMs / child.today.cpuMs).toFixed(2)} by CPU (${fmt(child.execa.cpuMs)} vs ${fmt(child.today.cpuMs)} ms), ` +
          `${(child.execa.ms / child.today.ms).toFixed(2)} by wall (${fmt(child.execa.ms)} vs ${fmt(child.today.ms)} ms)`,
        target: '',
      },
      {
        section: 'execa',
        what: 'pod lifecycle, bin/latch-sea-execa against bin/latch-sea',
        value:
          `CPU ${pct(life.execa!.cpuMeanMs, life.today!.cpuMeanMs)} (${fmt(life.execa!.cpuMeanMs)} vs ${fmt(life.today!.cpuMeanMs)} ms), ` +
          `wall ${pct(life.execa!.median, life.today!.median)} (${fmt(life.execa!.median)} vs ${fmt(life.today!.median)} ms)`,
        target: '<= 5% to bring execa back',
        pass: life.execa!.cpuMeanMs <= life.today!.cpuMeanMs * 1.05 && life.execa!.median <= life.today!.median * 1.05,
      },
      {
        section: 'execa',
        what: `${count} lifecycles at once, bin/latch-sea-execa against bin/latch-sea (2 rounds each, alternating)`,
        value:
          `rate ${pct(rate('execa'), rate('today'))} (${rate('execa').toFixed(2)} vs ${rate('today').toFixed(2)} lifecycles/s), ` +
          `CPU per lifecycle ${pct(rateCpu('execa'), rateCpu('today'))} (${rateCpu('execa').toFixed(0)} vs ${rateCpu('today').toFixed(0)} ms)`,
        target: '>= -5% to bring execa back',
        pass: rate('execa') >= rate('today') * 0.95,
      },
    );
    table("execa against today's runner", [
      ['what', 'today', 'execa', 'execa / today'],
      ['per child CPU ms', fmt(child.today.cpuMs), fmt(child.execa.cpuMs), (child.execa.cpuMs / child.today.cpuMs).toFixed(2)],
      ['per child wall ms', fmt(child.today.ms), fmt(child.execa.ms), (child.execa.ms / child.today.ms).toFixed(2)],
      [
        'lifecycle CPU ms',
        fmt(life.today!.cpuMeanMs),
        fmt(life.execa!.cpuMeanMs),
        (life.execa!.cpuMeanMs / life.today!.cpuMeanMs).toFixed(3),
      ],
      ['lifecycle wall ms', fmt(life.today!.median), fmt(life.execa!.median), (life.execa!.median / life.today!.median).toFixed(3)],
      [`${count} at once, lifecycles/s`, rate('today').toFixed(2), rate('execa').toFixed(2), (rate('execa') / rate('today')).toFixed(3)],
      [
        `${count} at once, CPU ms each`,
        rateCpu('today').toFixed(0),
        rateCpu('execa').toFixed(0),
        (rateCpu('execa') / rateCpu('today')).toFixed(3),
      ],
    ]);
  } finally {
    cleanUp(dir);
  }
}

function machine(): Record<string, string> {
  const tool = (cmd: string, ...args: string[]) => spawnSync(cmd, args, { encoding: 'utf8' }).stdout?.trim() ?? '';
  return {
    node: process.version,
    cpu: cpus()[0]?.model.trim() ?? 'unknown',
    cores: tool('nproc'),
    memory: `${Math.round(totalmem() / 1024 ** 3)} GiB`,
    kernel: tool('uname', '-r'),
    os: /^PRETTY_NAME="?([^"\n]*)/m.exec(existsSync('/etc/os-release') ? readFileSync('/etc/os-release', 'utf8') : '')?.[1] ?? '',
    load: loadavg()
      .map((l) => l.toFixed(1))
      .join(' '),
    poolFs: tool('findmnt', '-n', '-o', 'FSTYPE,SOURCE', '-T', tmpdir()).replace(/\s+/, ' on '),
    date: new Date().toISOString(),
  };
}

function chosenSections(): Set<Section> {
  const { values } = parseArgs({ options: { only: { type: 'string' } } });
  if (values.only === undefined) return new Set(SECTIONS);
  const wanted = values.only.split(',').map((s) => s.trim());
  const unknown = wanted.filter((s) => !(SECTIONS as readonly string[]).includes(s));
  if (unknown.length > 0) throw new Error(`--only: unknown section ${unknown.join(', ')} (sections: ${SECTIONS.join(', ')})`);
  return new Set(wanted as Section[]);
}

/** Writes the results file, keeping from an earlier run the sections this one did not measure. */
function saveResults(ran: Set<Section>): string {
  const outDir = join(ROOT, 'test/bench/results');
  const file = join(outDir, 'latest.json');
  mkdirSync(outDir, { recursive: true });
  let previous: Partial<Results> = {};
  try {
    previous = JSON.parse(readFileSync(file, 'utf8')) as Results;
  } catch {
    // no earlier run
  }
  const now = new Date().toISOString();
  const measuredAt: Record<string, string> = {};
  for (const s of SECTIONS) {
    const at = ran.has(s) ? now : previous.measuredAt?.[s];
    if (at) measuredAt[s] = at;
  }
  const merged = {
    ...previous,
    ...results,
    measuredAt,
    figures: SECTIONS.flatMap((s) => (ran.has(s) ? figures : (previous.figures ?? [])).filter((f) => f.section === s)),
  };
  writeFileSync(file, `${JSON.stringify(merged, null, 2)}\n`);
  return file;
}

/**
 * Leaves the single executable in the page cache as `latch install` leaves an installed driver (src/sys/page-cache.ts),
 * whatever the build's writes or earlier runs left: the figures are of the driver as a node holds it after install
 * and after each reboot (the DaemonSet's pod installs again on every start).
 */
async function asInstalled(file: string): Promise<void> {
  // The build has just written it, and dirty pages cannot be dropped (install's copy is fsynced before its reload).
  syncFile(file);
  const reload = await reloadPageCache([file]);
  if (!reload.reloaded) throw new Error(`cannot reload the page cache of ${file}: ${reload.reason}`);
  console.log(`Reloaded the page cache of ${file} as latch install does (resident now: ${cachedBytes(file)} bytes).`);
}

async function main(): Promise<void> {
  const only = chosenSections();
  if (!existsSync(join(ROOT, 'bin/latch'))) throw new Error('bin/latch is missing: run npm run build first');
  const sea = join(ROOT, 'bin/latch-sea');
  if (existsSync(sea)) await asInstalled(sea);
  console.log(
    `latch benchmark: ${REPS} repetitions (single calls: ${CALL_REPS}) after ${WARMUP} warm-up, interleaved; ${JSON.stringify(results.machine)}`,
  );
  if (!TIME) console.log('(no /usr/bin/time: peak RSS is not measured; apt-get install time)');
  if (only.has('calls')) controlPlaneCalls();
  if (only.has('ledger')) await ledgerScaling();
  for (const section of ['lifecycle', 'concurrent', 'execa'] as const) {
    if (!only.has(section)) continue;
    if (!isRoot) {
      console.log(`\nSkipping ${section}: it needs root and loop devices.`);
      figures.push({ section, what: section, value: 'skipped: needs root', target: '' });
    } else if (section === 'lifecycle') podLifecycle();
    else if (section === 'concurrent') await concurrentLifecycles(Number(process.env.BENCH_CONCURRENT ?? 64));
    else await execaAgainstRunner(Number(process.env.BENCH_CONCURRENT ?? 64));
  }
  for (const [section, run] of [
    ['io', async () => loopIo()],
    ['rbd', rbdIo],
    ['backup', backupThroughput],
    ['backup-rbd', rbdBackupBench],
    ['backup-s3', s3BackupBench],
    ['cephfs', sharedIo],
  ] as const) {
    if (!only.has(section)) continue;
    const started = performance.now();
    try {
      const { figures: found, details } = await run();
      figures.push(...found);
      results[section] = { ...details, sectionSeconds: Math.round((performance.now() - started) / 1000) };
    } catch (err) {
      // A section that breaks (a cluster that does not come up, say) is a failed figure, not a lost run.
      console.error(err);
      const message = (err instanceof Error ? err.message : String(err)).split('\n')[0] ?? '';
      figures.push({ section, what: `the ${section} section`, value: `error: ${message.slice(0, 160)}`, target: 'runs', pass: false });
      process.exitCode = 1;
    }
    console.log(`(${section}: ${Math.round((performance.now() - started) / 1000)} s)`);
  }
  printFigures(figures);
  const file = saveResults(only);
  console.log(`\nWrote ${file}`);
  const reports = writeReports(file, ROOT);
  console.log(`Regenerated the figures in ${reports.join(' and ')}`);
}

main().catch((err: unknown) => {
  console.error(err);
  process.exitCode = 1;
});

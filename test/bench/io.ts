// The data plane: fio on a mounted latch volume against the same job on what the volume stands on, in one run.
//
// - loop: a volume attached and mounted through bin/latch (attach, waitforattach, mountdevice) against a file in the
//   pool directory itself (the same filesystem and disk as the volume's image). The loop device runs as the backend
//   sets it up; the same jobs also run with its direct I/O switched the other way (`losetup --direct-io=on|off` on
//   the live device), and the page cache that a volume's reads take is measured both ways (fincore on the image).
// - rbd: the same through the rbd backend on a one-host Ceph cluster (test/ceph/cluster.ts), against `rbd bench` (the
//   engine's own client) on another image of the cluster; and attach-to-mounted time next to a loop volume. With the
//   kernel client where the kernel has the rbd module, else with rbd-fuse + loop.
//
// Every fio job runs a few seconds, and the candidates alternate (disk, volume, disk, volume, ...) so that the
// machine's drift hits them alike; each figure is the ratio of medians.
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { defined } from '../fixtures/defined.js';
import type { Figure } from './figures.js';

const ROOT = join(__dirname, '..', '..');
const LATCH = join(ROOT, 'bin/latch');
const SECONDS = Number(process.env.BENCH_FIO_SECONDS ?? 2);
const ROUNDS = Number(process.env.BENCH_FIO_ROUNDS ?? 5);
const FILE_MIB = 256;
const TARGET = 0.9;
const MiB = 1024 * 1024;

interface Job {
  name: string;
  /** What the figure is counted in. */
  unit: 'IOPS' | 'MiB/s' | 'writes/s';
  fio: string[];
  /** The same pattern as `rbd bench` arguments (without --io-total), where it has one. */
  rbdBench?: string[];
  /** Bytes per I/O, to size rbd bench's --io-total. */
  ioBytes?: number;
}

// What databases do for the fsync case: 4 KiB written and fsync-ed, one at a time.
const JOBS: Job[] = [
  {
    name: '4k random read, QD16, O_DIRECT',
    unit: 'IOPS',
    fio: ['--rw=randread', '--bs=4k', '--iodepth=16', '--direct=1', '--ioengine=libaio'],
    ioBytes: 4096,
    rbdBench: ['--io-type', 'read', '--io-size', '4K', '--io-pattern', 'rand', '--io-threads', '16'],
  },
  {
    name: '4k random write, QD16, O_DIRECT',
    unit: 'IOPS',
    fio: ['--rw=randwrite', '--bs=4k', '--iodepth=16', '--direct=1', '--ioengine=libaio'],
    ioBytes: 4096,
    rbdBench: ['--io-type', 'write', '--io-size', '4K', '--io-pattern', 'rand', '--io-threads', '16'],
  },
  {
    name: '1M sequential read, QD16, O_DIRECT',
    unit: 'MiB/s',
    fio: ['--rw=read', '--bs=1M', '--iodepth=16', '--direct=1', '--ioengine=libaio'],
    ioBytes: MiB,
    rbdBench: ['--io-type', 'read', '--io-size', '1M', '--io-pattern', 'seq', '--io-threads', '16'],
  },
  {
    name: '1M sequential write, QD16, O_DIRECT',
    unit: 'MiB/s',
    fio: ['--rw=write', '--bs=1M', '--iodepth=16', '--direct=1', '--ioengine=libaio'],
    ioBytes: MiB,
    rbdBench: ['--io-type', 'write', '--io-size', '1M', '--io-pattern', 'seq', '--io-threads', '16'],
  },
  {
    name: '4k write + fsync each',
    unit: 'writes/s',
    fio: ['--rw=write', '--bs=4k', '--iodepth=1', '--fsync=1', '--ioengine=psync'],
  },
];

// ---------------------------------------------------------------------------------------------------------------
// Tools.

function sh(cmd: string, args: string[], timeoutMs = 120_000): string {
  const r = spawnSync(cmd, args, { encoding: 'utf8', timeout: timeoutMs });
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')}: ${r.error?.message ?? ''} ${r.stderr}`);
  return r.stdout;
}

function median(xs: number[]): number {
  const sorted = [...xs].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? (sorted[mid] ?? NaN) : ((sorted[mid - 1] ?? NaN) + (sorted[mid] ?? NaN)) / 2;
}
const fmt = (n: number) => (n >= 10_000 ? `${(n / 1000).toFixed(1)}k` : n >= 100 ? n.toFixed(0) : n.toFixed(1));

/** Runs one fio job on `file` and returns its rate in the job's unit. */
function fio(file: string, job: Job, seconds = SECONDS): number {
  const args = ['--name=bench', `--filename=${file}`, `--size=${FILE_MIB}M`, '--output-format=json', ...job.fio];
  const out = JSON.parse(sh('fio', [...args, '--time_based', `--runtime=${seconds}`], (seconds + 60) * 1000)) as {
    jobs: { error: number; read: { iops: number; bw_bytes: number }; write: { iops: number; bw_bytes: number } }[];
  };
  const j = out.jobs[0];
  if (!j || j.error !== 0) throw new Error(`fio ${job.name} on ${file} failed: ${JSON.stringify(j?.error)}`);
  return job.unit === 'MiB/s' ? (j.read.bw_bytes + j.write.bw_bytes) / MiB : j.read.iops + j.write.iops;
}

/** Writes the test file in full, so reads read data and writes overwrite allocated blocks on every candidate. */
function layOut(file: string): void {
  sh('fio', [
    '--name=layout',
    `--filename=${file}`,
    `--size=${FILE_MIB}M`,
    '--rw=write',
    '--bs=1M',
    '--direct=1',
    '--iodepth=16',
    '--ioengine=libaio',
  ]);
}

/** Bytes of `file` in the page cache (fincore, util-linux). */
export function cachedBytes(file: string): number {
  return Number(sh('fincore', ['--bytes', '--noheadings', '--output', 'RES', file]).trim());
}

/** Writes back `file`'s dirty pages: only clean ones can be dropped from the page cache. */
export function syncFile(file: string): void {
  sh('sync', [file]);
}

/**
 * Drops `file`'s pages from the page cache (POSIX_FADV_DONTNEED over the whole file), but those a process maps. Dirty
 * pages cannot be dropped, so they are written back first.
 */
export function evict(file: string): void {
  syncFile(file);
  sh('dd', [`if=${file}`, 'iflag=nocache', 'count=0', 'status=none']);
}

/** Microseconds some task waited for a CPU (or for I/O) since boot: /proc/pressure (PSI), or NaN without it. */
function stallMicros(resource: 'cpu' | 'io'): number {
  try {
    return Number(/^some .*total=([0-9]+)$/m.exec(readFileSync(`/proc/pressure/${resource}`, 'utf8'))?.[1] ?? NaN);
  } catch {
    return NaN;
  }
}

/** The share of a stretch of time in which some task waited for `resource`: how busy the shared machine was. */
function pressureSince(resource: 'cpu' | 'io', startMicros: number, startedMs: number): number {
  return (stallMicros(resource) - startMicros) / 1000 / (performance.now() - startedMs);
}

/**
 * Whether this kernel's loop driver can issue a direct-I/O request from the submitter's context (IOCB_NOWAIT, Linux
 * 6.19's "loop: try to handle loop aio command via NOWAIT IO first", whose lo_submit_rw_aio() is in the symbol
 * table), or hands every request to its kernel worker thread first. undefined when the symbols cannot be read.
 */
function loopSubmitsInline(): boolean | undefined {
  try {
    const symbols = readFileSync('/proc/kallsyms', 'utf8');
    if (!/ lo_rw_aio/.test(symbols)) return undefined; // no loop symbols visible (a module not loaded, kptr rules)
    return / lo_submit_rw_aio/.test(symbols);
  } catch {
    return undefined;
  }
}

function loopDio(device: string): boolean {
  return readFileSync(`/sys/block/${device.slice('/dev/'.length)}/loop/dio`, 'utf8').trim() === '1';
}

function setLoopDio(device: string, on: boolean): void {
  sh('losetup', [`--direct-io=${on ? 'on' : 'off'}`, device]);
  if (loopDio(device) !== on) throw new Error(`${device}: the kernel kept direct I/O ${on ? 'off' : 'on'}`);
}

// ---------------------------------------------------------------------------------------------------------------
// The driver, as kubelet runs it.

interface Reply {
  status: string;
  device?: string;
  message?: string;
}

function driver(config: string, ...args: string[]): Reply {
  const r = spawnSync(LATCH, args, { env: { ...process.env, LATCH_CONFIG: config }, encoding: 'utf8', timeout: 180_000 });
  let reply: Reply;
  try {
    reply = JSON.parse(r.stdout) as Reply;
  } catch {
    throw new Error(`latch ${args[0]}: no JSON reply: ${r.stdout} ${r.stderr}`);
  }
  if (reply.status !== 'Success') throw new Error(`latch ${args[0]}: ${r.stdout}`);
  return reply;
}

const optionsFor = (pv: string, size: string) =>
  JSON.stringify({ 'kubernetes.io/fsType': '', 'kubernetes.io/pvOrVolumeName': pv, 'kubernetes.io/readwrite': 'rw', size });

interface Mounted {
  device: string;
  mountPoint: string;
  /** waitforattach + mountdevice, in ms. */
  toMountedMs: number;
  unmount(): void;
}

/** attach, waitforattach, mountdevice through bin/latch; unmount() runs unmountdevice and detach. */
function mountVolume(config: string, nodeName: string, pv: string, mountPoint: string, size = '1Gi'): Mounted {
  const json = optionsFor(pv, size);
  mkdirSync(mountPoint, { recursive: true });
  driver(config, 'attach', json, nodeName);
  const started = performance.now();
  const { device } = driver(config, 'waitforattach', '', json);
  if (!device) throw new Error(`waitforattach of ${pv} gave no device`);
  driver(config, 'mountdevice', mountPoint, device, json);
  const toMountedMs = performance.now() - started;
  return {
    device,
    mountPoint,
    toMountedMs,
    unmount: () => {
      driver(config, 'unmountdevice', mountPoint);
      driver(config, 'detach', pv, nodeName);
    },
  };
}

function writeConfig(dir: string, backend?: Record<string, string>): string {
  const config = {
    nodeName: 'node-a',
    // One node: the rbd backend on its own file store is safe only so (docs/operations.md, "Configurations latch refuses").
    singleNode: 'node-a',
    stateDir: join(dir, 'state'),
    poolDir: join(dir, 'pool'),
    logFile: join(dir, 'latch.log'),
    commandTimeout: 120,
    ...(backend && { backend }),
  };
  const path = join(dir, backend ? `config-${backend.type}.json` : 'config.json');
  writeFileSync(path, JSON.stringify(config));
  return path;
}

/** Unmounts and detaches whatever a failed run left under `dir`, then removes it. */
export function cleanUp(dir: string): void {
  spawnSync('sh', ['-c', `grep -F ' ${dir}/' /proc/self/mountinfo | cut -d' ' -f5 | sort -r | xargs -r -n1 umount`]);
  spawnSync('sh', ['-c', `losetup -l -n -O NAME,BACK-FILE | grep -F '${dir}/' | cut -d' ' -f1 | xargs -r -n1 losetup -d`]);
  rmSync(dir, { recursive: true, force: true });
}

export interface SectionResult {
  figures: Figure[];
  details: Record<string, unknown>;
}

const ratioFigure = (section: string, what: string, vol: number, base: number, unit: string, target: boolean): Figure => ({
  section,
  what,
  value: `${(vol / base).toFixed(2)} (${fmt(vol)} vs ${fmt(base)} ${unit})`,
  target: target ? `>= ${TARGET.toFixed(2)}` : '',
  ...(target && { pass: vol / base >= TARGET }),
});

// ---------------------------------------------------------------------------------------------------------------
// loop

export function ioSkipReason(): string | undefined {
  if (process.getuid?.() !== 0) return 'needs root (loop devices and mounts)';
  for (const tool of ['fio', 'fincore']) {
    if (spawnSync('sh', ['-c', `command -v ${tool}`]).status !== 0) return `${tool} is not installed (apt-get install -y fio util-linux)`;
  }
  return undefined;
}

export function loopIo(): SectionResult {
  const section = 'io';
  const skip = ioSkipReason();
  if (skip) return { figures: [{ section, what: 'volume I/O on the loop backend', value: `skipped: ${skip}`, target: '' }], details: {} };
  const dir = mkdtempSync(join(tmpdir(), 'latch-bench-io-'));
  const [cpuStall, ioStall, started] = [stallMicros('cpu'), stallMicros('io'), performance.now()];
  try {
    const config = writeConfig(dir);
    const vol = mountVolume(config, 'node-a', 'pv-io', join(dir, 'mounts', 'pv-io'));
    const image = join(dir, 'pool', 'pv-io.img');
    const latchDio = loopDio(vol.device);
    try {
      setLoopDio(vol.device, !latchDio); // a pool that cannot do direct I/O refuses the switch: no comparison then
      setLoopDio(vol.device, latchDio);
    } catch (err) {
      vol.unmount();
      throw new Error(`cannot switch direct I/O on ${vol.device} (over ${dir}): ${err instanceof Error ? err.message : String(err)}`);
    }
    const mode = (on: boolean) => `direct-io ${on ? 'on' : 'off'}`;
    const diskFile = join(dir, 'pool', 'disk-baseline.fio'); // beside the images: the same filesystem and disk
    const volFile = join(vol.mountPoint, 'bench.fio');
    const figures: Figure[] = [];
    const details: Record<string, unknown> = {
      loopDirectIo: latchDio,
      poolFs: sh('findmnt', ['-n', '-o', 'FSTYPE,SOURCE', '-T', dir]).trim(),
      seconds: SECONDS,
      rounds: ROUNDS,
    };
    try {
      layOut(diskFile);
      layOut(volFile);
      console.log(`\nVolume I/O, loop backend (${vol.device}, ${mode(latchDio)} as latch sets it up; ${ROUNDS} x ${SECONDS} s per job)`);
      const rows: string[][] = [['job', 'disk', `volume, ${mode(latchDio)}`, 'ratio', `volume, ${mode(!latchDio)}`, 'ratio']];
      for (const job of JOBS) {
        const disk: number[] = [];
        const same: number[] = [];
        const other: number[] = [];
        for (let i = 0; i < ROUNDS; i++) {
          disk.push(fio(diskFile, job));
          setLoopDio(vol.device, latchDio);
          same.push(fio(volFile, job));
          setLoopDio(vol.device, !latchDio);
          other.push(fio(volFile, job));
        }
        setLoopDio(vol.device, latchDio);
        const [d, s, o] = [median(disk), median(same), median(other)];
        details[job.name] = { unit: job.unit, disk, [mode(latchDio)]: same, [mode(!latchDio)]: other };
        rows.push([`${job.name} (${job.unit})`, fmt(d), fmt(s), (s / d).toFixed(2), fmt(o), (o / d).toFixed(2)]);
        figures.push(ratioFigure(section, `loop volume / disk: ${job.name}`, s, d, job.unit, true));
        figures.push(ratioFigure(section, `the same with ${mode(!latchDio)} (not what latch does)`, o, d, job.unit, false));
      }
      printRows(rows);
      figures.push(...loopFloor(dir, section, details));

      // Buffered reads of the volume (what most applications do): each mode reads the same file cold, and fincore
      // says how much of the image stays in the page cache besides the volume's own copy of the file.
      const cache: Record<string, { mibps: number; imageCachedMiB: number; fileCachedMiB: number; meminfoCachedDeltaMiB: number }> = {};
      const rows2: string[][] = [
        ['mode', 'cold buffered read MiB/s', 'image pages cached MiB', "volume's own file cache MiB", 'Cached delta MiB'],
      ];
      const bufferedRead: Job = {
        name: 'buffered read',
        unit: 'MiB/s',
        fio: ['--rw=read', '--bs=1M', '--direct=0', '--ioengine=psync', '--invalidate=1'],
      };
      for (const on of [latchDio, !latchDio]) {
        setLoopDio(vol.device, on);
        sh('sync', []);
        evict(image);
        const before = memCachedKiB();
        const started = performance.now();
        sh('fio', ['--name=read', `--filename=${volFile}`, `--size=${FILE_MIB}M`, ...bufferedRead.fio, '--output-format=json']);
        const mibps = FILE_MIB / ((performance.now() - started) / 1000);
        const result = {
          mibps,
          imageCachedMiB: cachedBytes(image) / MiB,
          fileCachedMiB: cachedBytes(volFile) / MiB,
          meminfoCachedDeltaMiB: (memCachedKiB() - before) / 1024,
        };
        cache[mode(on)] = result;
        rows2.push([mode(on), fmt(mibps), fmt(result.imageCachedMiB), fmt(result.fileCachedMiB), fmt(result.meminfoCachedDeltaMiB)]);
      }
      setLoopDio(vol.device, latchDio);
      printRows(rows2, `Page cache of a cold ${FILE_MIB} MiB buffered read of a file on the volume (incl. fio start-up)`);
      details.pageCache = cache;
      const [mine, theirs] = [defined(cache[mode(latchDio)]), defined(cache[mode(!latchDio)])];
      figures.push({
        section,
        what: `image pages cached after a ${FILE_MIB} MiB buffered read of the volume (${mode(latchDio)}, the second copy)`,
        value: `${fmt(mine.imageCachedMiB)} MiB (with ${mode(!latchDio)}: ${fmt(theirs.imageCachedMiB)} MiB)`,
        target: `<= ${FILE_MIB / 20} MiB`,
        pass: mine.imageCachedMiB <= FILE_MIB / 20,
      });
      figures.push(
        ratioFigure(section, `cold buffered read, ${mode(latchDio)} / ${mode(!latchDio)}`, mine.mibps, theirs.mibps, 'MiB/s', true),
      );
      // How much the machine's other work stood in the way: the loop path needs a CPU twice per request (the
      // submitter, then the loop worker), so a busy machine costs the volume more than the plain file.
      const [cpu, io] = [pressureSince('cpu', cpuStall, started), pressureSince('io', ioStall, started)];
      const inline = loopSubmitsInline();
      Object.assign(details, { cpuPressure: cpu, ioPressure: io, loopSubmitsInline: inline });
      figures.push({
        section,
        what: 'machine during the section: share of time a task waited for a CPU / for I/O (PSI some)',
        value: `${(cpu * 100).toFixed(0)}% / ${(io * 100).toFixed(0)}%; loop submits ${
          inline === undefined ? '(unknown)' : inline ? 'inline (IOCB_NOWAIT)' : 'through its worker thread only'
        }`,
        target: '',
      });
      return { figures, details };
    } finally {
      setLoopDio(vol.device, latchDio);
      vol.unmount();
    }
  } finally {
    cleanUp(dir);
  }
}

/**
 * The loop driver alone, as evidence of what no filesystem or mount option on the volume can win back: the jobs that
 * miss most, on a bare loop device (no filesystem) set up as latch sets a volume up (direct I/O, 512-byte sectors),
 * against its own image file, written in full and alternating as above.
 */
function loopFloor(dir: string, section: string, details: Record<string, unknown>): Figure[] {
  const image = join(dir, 'pool', 'floor.img');
  layOut(image);
  const device = sh('losetup', ['--find', '--show', '--direct-io=on', '--sector-size', '512', image]).trim();
  const figures: Figure[] = [];
  const floor: Record<string, unknown> = { directIo: loopDio(device) };
  try {
    const rows: string[][] = [['job', 'image file', 'bare loop device', 'ratio']];
    for (const job of JOBS.filter((j) => j.name.startsWith('4k'))) {
      const file: number[] = [];
      const bare: number[] = [];
      for (let i = 0; i < ROUNDS; i++) {
        file.push(fio(image, job));
        bare.push(fio(device, job));
      }
      const [f, b] = [median(file), median(bare)];
      floor[job.name] = { unit: job.unit, file, bare };
      rows.push([`${job.name} (${job.unit})`, fmt(f), fmt(b), (b / f).toFixed(2)]);
      figures.push(ratioFigure(section, `bare loop device / its image file (the loop driver alone): ${job.name}`, b, f, job.unit, false));
    }
    printRows(rows, `The loop driver alone: a bare loop device (${device}, no filesystem) against its image file`);
  } finally {
    sh('losetup', ['-d', device]);
  }
  details.loopDriverAlone = floor;
  return figures;
}

function memCachedKiB(): number {
  return Number(/^Cached:\s+([0-9]+) kB$/m.exec(readFileSync('/proc/meminfo', 'utf8'))?.[1] ?? NaN);
}

function printRows(rows: string[][], title?: string): void {
  if (title) console.log(`\n${title}`);
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
  for (const r of rows) console.log(`  ${r.map((c, i) => c.padEnd(widths[i] ?? 0)).join('  ')}`);
}

// ---------------------------------------------------------------------------------------------------------------
// rbd

const nodeClientOf = (device: string) =>
  device.startsWith('/dev/rbd')
    ? 'krbd'
    : device.startsWith('/dev/nbd')
      ? 'rbd-nbd'
      : device.startsWith('/dev/loop')
        ? 'rbd-fuse+loop'
        : device;

/** ops/sec of `rbd bench`'s last line ("elapsed: 3  ops: 8192  ops/sec: 2650.1  bytes/sec: 10 MiB/s"). */
function rbdBenchOps(stdout: string): number {
  const m = /ops\/sec:\s*([0-9.]+)/.exec(
    stdout
      .split('\n')
      .filter((l) => l.includes('elapsed:'))
      .at(-1) ?? '',
  );
  if (!m) throw new Error(`rbd bench printed no total: ${stdout.slice(-300)}`);
  return Number(m[1]);
}

export async function rbdIo(): Promise<SectionResult> {
  const section = 'rbd';
  const { cephSkipReason, startCephCluster } = await import('../ceph/cluster.js');
  const skip = cephSkipReason() ?? ioSkipReason() ?? (existsSync(LATCH) ? undefined : 'bin/latch is missing');
  if (skip) return { figures: [{ section, what: 'rbd volume I/O and attach', value: `skipped: ${skip}`, target: '' }], details: {} };
  const dir = mkdtempSync(join(tmpdir(), 'latch-bench-rbd-'));
  const started = performance.now();
  const ceph = await startCephCluster();
  const details: Record<string, unknown> = { clusterStartMs: Math.round(performance.now() - started) };
  const figures: Figure[] = [];
  try {
    const client = await ceph.createClient('latch-bench');
    const rbdConfig = writeConfig(dir, {
      type: 'rbd',
      pool: ceph.pool,
      cephConf: client.confPath,
      clientId: client.id,
      keyring: client.keyringPath,
      mountDir: join(ceph.dir, 'mnt', 'bench'), // under the cluster's dir: its teardown sweeps any leftovers
      // The kernel client where this kernel has it (a real node), else rbd-fuse + loop (this VM).
      client: existsSync('/sys/bus/rbd') ? 'krbd' : 'rbd-fuse',
    });
    const loopConfig = writeConfig(dir);

    // Attach to mounted (waitforattach + mountdevice), rbd next to loop: the first includes creating the image and
    // mkfs, the later ones find an existing filesystem (as after a pod moved).
    const times: Record<string, number[]> = { rbd: [], loop: [] };
    for (let i = 0; i < 4; i++) {
      for (const [name, config] of [
        ['rbd', rbdConfig],
        ['loop', loopConfig],
      ] as const) {
        const v = mountVolume(config, 'node-a', `pv-${name}-attach`, join(dir, 'mounts', `${name}-attach`), '1Gi');
        if (name === 'rbd') details.nodeClient = nodeClientOf(v.device);
        times[name]!.push(v.toMountedMs);
        v.unmount();
      }
    }
    details.attachToMountedMs = times;
    const again = (name: string) => median(times[name]!.slice(1));
    const first = (name: string) => defined(times[name]?.[0]);
    figures.push({
      section,
      what: `attach to mounted (waitforattach + mountdevice), rbd (${String(details.nodeClient)}) vs loop`,
      value: `${fmt(again('rbd'))} ms vs ${fmt(again('loop'))} ms; first (create + mkfs): ${fmt(first('rbd'))} vs ${fmt(first('loop'))} ms`,
      target: '',
    });

    // fio on a mounted rbd volume against rbd bench on another image of the same cluster.
    const vol = mountVolume(rbdConfig, 'node-a', 'pv-rbd-io', join(dir, 'mounts', 'rbd-io'), '1Gi');
    const volFile = join(vol.mountPoint, 'bench.fio');
    const image = `${ceph.pool}/bench-baseline`;
    try {
      let t = performance.now();
      layOut(volFile);
      details.layoutVolumeMs = Math.round(performance.now() - t);
      await ceph.rbd(['create', '--size', `${FILE_MIB}M`, image], { as: client }); // filled in full below
      t = performance.now();
      const fill = ['--io-type', 'write', '--io-size', '1M', '--io-pattern', 'seq', '--io-threads', '16', '--io-total', `${FILE_MIB}M`];
      await ceph.rbd(['bench', ...fill, image], { as: client, timeoutMs: 300_000 });
      details.layoutImageMs = Math.round(performance.now() - t);
      const rounds = ROUNDS;
      details.loopDirectIo = loopDio(vol.device);
      console.log(
        `\nVolume I/O, rbd backend (${String(details.nodeClient)}, ${vol.device}) vs rbd bench; ${rounds} x ${SECONDS} s per job`,
      );
      const rows: string[][] = [['job', 'rbd bench', 'latch volume', 'ratio']];
      for (const job of JOBS) {
        if (!job.rbdBench) continue;
        const engine: number[] = [];
        const volume: number[] = [];
        // rbd bench stops after --io-total, not after a time: a short warm-up run (not counted) gives the rate, and
        // each measured run is sized to last about as long as a fio job.
        const bench = async (bytes: number) => {
          const total = `${Math.min(1024, Math.max(4, Math.round(bytes / MiB)))}M`;
          const { stdout } = await ceph.rbd(['bench', ...defined(job.rbdBench), '--io-total', total, image], {
            as: client,
            timeoutMs: 300_000,
          });
          return rbdBenchOps(stdout); // with 1M I/Os, ops/sec is MiB/s
        };
        let rate = await bench(4 * MiB);
        for (let i = 0; i < rounds; i++) {
          rate = await bench(rate * defined(job.ioBytes) * SECONDS);
          engine.push(rate);
          volume.push(fio(volFile, job));
        }
        const [e, v] = [median(engine), median(volume)];
        details[job.name] = { unit: job.unit, rbdBench: engine, volume };
        rows.push([`${job.name} (${job.unit})`, fmt(e), fmt(v), (v / e).toFixed(2)]);
        figures.push(ratioFigure(section, `rbd volume (${String(details.nodeClient)}) / rbd bench: ${job.name}`, v, e, job.unit, true));
      }
      printRows(rows);
    } finally {
      vol.unmount();
    }
    return { figures, details };
  } finally {
    await ceph.stop();
    cleanUp(dir);
  }
}

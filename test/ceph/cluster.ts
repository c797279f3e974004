// A real one-host Ceph cluster for the tests: one monitor, one manager and one OSD (bluestore on a sparse file),
// built from nothing under a temp dir with Debian's ceph packages (no systemd, no cephadm), plus the node-side
// plumbing the tests need (cephx identities, rbd-fuse mounts, loop devices), all of which stop() removes.
//
//   const ceph = await startCephCluster();               // ~15 s: waits for HEALTH_OK and an rbd-ready pool
//   const node = await ceph.createClient('node-a');      // least-privilege node identity, its keyring and conf
//   await ceph.rbd(['create', '--size', '64M', `${ceph.pool}/img`]);
//   const fuse = await ceph.startRbdFuse(node, join(ceph.dir, 'mnt/a'), { image: 'img' });
//   const loop = await ceph.attachLoop(fuse, 'img');
//   ceph.pause('osd'); ...; ceph.resume('osd');
//   await ceph.stop();                                    // in after(): always, also after a failed start
//
// Network: the monitor's ports are written into the monmap, so they are fixed for the life of a cluster, but they
// need not be Ceph's defaults (3300/6789). Each cluster picks two free ports below the kernel's ephemeral range
// (so no outgoing connection can take them between restarts) and writes them into its conf files; the manager and
// the OSD bind whatever is free in 6800-7300 as usual. Several clusters can therefore run side by side in the
// host's network namespace, and every client (ceph, rbd, rbd-fuse, later the driver itself) needs nothing but a
// conf file: no `ip netns`/`nsenter` around each call, and no private mount table for FUSE clients.
//
// Teardown never trusts a FUSE mount. A fenced rbd-fuse answers no request, and a process waiting on one sits in
// D state where no signal reaches it (a deadline cannot reclaim it: only aborting the FUSE connection does). So
// the sweep reads the kernel's own tables (/proc/self/mountinfo, /proc/PID/cmdline, /sys/block/loopN/loop/
// backing_file), aborts the dir's FUSE connections through fusectl, kills its processes by PID, and only then
// unmounts and detaches. Everything this fixture starts names the cluster dir on its command line, which is how
// the sweep finds it, also for the leftovers of a test process that was SIGKILLed: the next startCephCluster()
// sweeps the dirs whose owner is gone.
import { spawn, type ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { closeSync, existsSync, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import { listLoopDevices } from '../../src/sys/loop.js';
import { readMountInfo, type MountInfo } from '../../src/sys/mounts.js';
import { run, type RunOptions, type RunResult } from '../../src/sys/run.js';
import { trackChild } from '../fixtures/tracked-children.js';
import { startCephFs } from './mds.js';

export type CephDaemon = 'mon' | 'mgr' | 'osd';

export interface CephClusterOptions {
  /** The rbd pool created for latch. Default "latch". */
  pool?: string;
  /** Size of the OSD's sparse bluestore file. Default 8 GiB. */
  osdSizeGiB?: number;
  /** How long start-up may take before it fails (and tears down what it made). Default 90 s. */
  startTimeoutMs?: number;
  /**
   * A network namespace (a name under /run/netns) to run the daemons and the admin's commands in, with `address` as
   * every daemon's address (the nemesis rig's storage namespace). The monitor then takes Ceph's default ports.
   */
  netns?: { name: string; address: string };
  /** A CephFS file system with one MDS (test/ceph/mds.ts), for shared volumes. */
  cephfs?: boolean;
}

// The caps of the two kinds of identity latch needs are the product's own (src/sys/rbd.ts); the tests use them as is.
import { fencerCaps, nodeCaps } from '../../src/sys/rbd.js';

export interface CephClient {
  /** The cephx id, e.g. "node-a". */
  id: string;
  /** The entity name, e.g. "client.node-a". */
  name: string;
  /** The identity's keyring (mode 0600): the key itself never leaves files. */
  keyringPath: string;
  /** A ceph.conf for this identity alone (what a node would have): mon_host, its keyring, a socket and log per process. */
  confPath: string;
}

export interface CreateClientOptions {
  /** "node" (default): nodeCaps, and a conf that never blocklists when breaking a lock; "fencer": fencerCaps. */
  role?: 'node' | 'fencer';
  /** cephx caps as [service, spec, service, spec, ...], instead of the role's. */
  caps?: string[];
  /** Extra settings for the client's section of its conf. */
  settings?: Record<string, string>;
}

export interface RbdFuseMount {
  pid: number;
  mountpoint: string;
  client: CephClient;
  /** The file that stands for `image` in this mount (never stat-ed by this process: a fenced mount hangs on stat). */
  imagePath(image: string): string;
  /** The process's resident and peak memory in KiB, from /proc/PID/status (undefined once it is gone). */
  memory(): { rssKiB: number; peakKiB: number } | undefined;
  /** Unmounts a healthy mount and waits for the process to exit. (A fenced one: leave it to the cluster's stop().) */
  stop(timeoutMs?: number): Promise<void>;
}

/** The leftovers of a cluster dir, as the kernel reports them. */
export interface Leftovers {
  processes: { pid: number; args: string }[];
  mounts: string[];
  loops: string[];
}

const DAEMON_IDS: Record<CephDaemon, string> = { mon: 'a', mgr: 'x', osd: '0' };
const CEPH_BINARIES = ['ceph-mon', 'ceph-mgr', 'ceph-osd', 'ceph', 'ceph-authtool', 'monmaptool', 'rbd', 'rados', 'rbd-fuse'];
const COMMAND_TIMEOUT_MS = 30_000;
const PROBE_TIMEOUT_MS = 10_000;
const DIR_PREFIX = 'latch-ceph-';
const FUSECTL = '/sys/fs/fuse/connections';

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

export function which(command: string): string | undefined {
  const dirs = [...(process.env.PATH ?? '').split(delimiter), '/usr/bin', '/usr/sbin', '/bin', '/sbin'];
  for (const dir of dirs) {
    if (dir && existsSync(join(dir, command))) return join(dir, command);
  }
  return undefined;
}

/** Why the Ceph tests cannot run here (a message for `skip`), or undefined when they can. */
export function cephSkipReason(): string | undefined {
  if (process.getuid?.() !== 0) return 'the Ceph tests need root (FUSE mounts and loop devices)';
  const missing = CEPH_BINARIES.filter((b) => !which(b));
  if (missing.length > 0) {
    return (
      `Ceph is not installed (missing ${missing.join(', ')}): run scripts/setup.sh, or ` +
      'apt-get install -y --no-install-recommends ceph-mon ceph-mgr ceph-osd ceph-common rbd-fuse'
    );
  }
  if (!existsSync('/dev/fuse')) return 'no /dev/fuse: rbd-fuse cannot run here';
  return undefined;
}

// ---------------------------------------------------------------------------------------------------------------
// Children of this process that must not outlive it.

/** `command args` as run in the network namespace `netns` (nsenter switches the network namespace only). */
function inNetns(netns: string | undefined, command: string, args: string[]): [string, string[]] {
  return netns === undefined ? [command, args] : ['nsenter', [`--net=/run/netns/${netns}`, '--', command, ...args]];
}

/**
 * Spawns a long-running child with its output in `logFile`, in the network namespace `netns` if given; the kernel
 * kills it if this process dies (setpriv; nsenter execs the command without forking, so that reaches it).
 */
export function spawnTracked(
  command: string,
  args: string[],
  logFile: string,
  netns?: string,
): { child: ChildProcess; exited: Promise<void> } {
  const found = which(command);
  if (!found) throw new Error(`${command} is not installed`);
  const [bin, binArgs] = inNetns(netns, found, args);
  const setpriv = which('setpriv');
  const [file, argv] = setpriv ? [setpriv, ['--pdeathsig', 'SIGKILL', '--', bin, ...binArgs]] : [bin, binArgs];
  const log = openSync(logFile, 'a', 0o600);
  const child = spawn(file, argv, { stdio: ['ignore', log, log] });
  closeSync(log);
  trackChild(child);
  const exited = new Promise<void>((resolve) => {
    const done = () => resolve();
    child.on('exit', done);
    child.on('error', done);
  });
  return { child, exited };
}

function isRunning(child: ChildProcess | undefined): boolean {
  return child !== undefined && child.exitCode === null && child.signalCode === null;
}

export function tail(file: string, lines = 25): string {
  try {
    return readFileSync(file, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
  } catch {
    return '(no log)';
  }
}

/** Polls `probe` until it returns a value that is not a string (a string says why not yet), or fails after `timeoutMs`. */
export async function until<T>(what: string, timeoutMs: number, probe: () => Promise<T | string>, intervalMs = 250): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last = 'not tried';
  for (;;) {
    try {
      const result = await probe();
      if (typeof result !== 'string') return result;
      last = result;
    } catch (err) {
      last = err instanceof Error ? err.message : String(err);
    }
    if (Date.now() >= deadline) throw new Error(`${what}: not done after ${timeoutMs} ms (${last})`);
    await sleep(intervalMs);
  }
}

/** A TCP port on 127.0.0.1 that is free now and outside the ephemeral range the kernel hands to outgoing sockets. */
export async function freeFixedPort(avoid: number[]): Promise<number> {
  let [low, high] = [32768, 60999];
  try {
    [low, high] = readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/).map(Number) as [number, number];
  } catch {
    // keep the kernel's default
  }
  const [from, to] = low > 20_000 ? [10_000, low] : [high + 1, 65_000];
  for (let attempt = 0; attempt < 100; attempt++) {
    const port = from + Math.floor(Math.random() * (to - from));
    if (avoid.includes(port) || (port >= 6800 && port <= 7300)) continue;
    const free = await new Promise<boolean>((resolve) => {
      const server = createServer();
      server.unref();
      server.once('error', () => resolve(false));
      server.listen(port, '127.0.0.1', () => server.close(() => resolve(true)));
    });
    if (free) return port;
  }
  throw new Error(`no free TCP port found in ${from}-${to} on 127.0.0.1`);
}

// ---------------------------------------------------------------------------------------------------------------
// What the kernel says is left of a cluster dir. Reads /proc and /sys only; never touches anything under the dir.

/** The fields of /proc/PID/stat after `pid (comm)`: [0] is the state, [19] the start time in clock ticks since boot. */
export function procStat(pid: number): string[] | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // pid (comm) state ppid ...; comm may contain spaces and parentheses, so split after the last ')'.
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  } catch {
    return undefined;
  }
}

function isAlive(pid: number): boolean {
  const state = procStat(pid)?.[0];
  return state !== undefined && state !== 'Z' && state !== 'X';
}

/** Processes (other than this one) whose command line mentions `dir`. */
function processesUnder(dir: string): { pid: number; args: string }[] {
  const found: { pid: number; args: string }[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^[0-9]+$/.test(entry) || Number(entry) === process.pid) continue;
    let args: string;
    try {
      args = readFileSync(`/proc/${entry}/cmdline`, 'utf8').split('\0').join(' ').trim();
    } catch {
      continue;
    }
    if (args.includes(`${dir}/`) && isAlive(Number(entry))) found.push({ pid: Number(entry), args });
  }
  return found;
}

function isUnder(path: string, dir: string): boolean {
  return path === dir || path.startsWith(`${dir}/`);
}

async function kernelStateOf(dir: string): Promise<Leftovers & { table: MountInfo[] }> {
  const loops = (await listLoopDevices()).filter((l) => isUnder(l.backingFile, dir)).map((l) => l.device);
  const table = await readMountInfo();
  const mounts = table.filter((m) => isUnder(m.mountPoint, dir) || loops.includes(m.source)).map((m) => m.mountPoint);
  return { processes: processesUnder(dir), mounts, loops, table };
}

let fusectlMountedHere = false;

/** Aborts the FUSE connection behind the mount at `mountpoint`: every request on it fails at once instead of hanging. */
async function abortFuseConnection(mountpoint: string): Promise<boolean> {
  const table = await readMountInfo();
  const mount = table.find((m) => m.mountPoint === mountpoint && m.fsType.startsWith('fuse'));
  if (!mount) return false;
  if (!table.some((m) => m.fsType === 'fusectl')) {
    await run('mount', ['-t', 'fusectl', 'fusectl', FUSECTL], { timeoutMs: 10_000 });
    fusectlMountedHere = true;
  }
  // The connection's directory is named after the mount's device number (always major 0 for FUSE), as mountinfo
  // gives it: no stat of the mountpoint, which would hang on a dead connection.
  const [major, minor] = mount.majorMinor.split(':').map(Number);
  if (major !== 0 || minor === undefined) return false;
  try {
    writeFileSync(`${FUSECTL}/${minor}/abort`, '1');
    return true;
  } catch {
    return false; // the connection went away by itself
  }
}

async function releaseFusectl(): Promise<void> {
  if (!fusectlMountedHere) return;
  fusectlMountedHere = false;
  await run('umount', [FUSECTL], { timeoutMs: 10_000 }).catch(() => undefined);
}

/** SIGKILLs `pids` (and SIGCONTs them, for stopped ones) and waits up to `timeoutMs` for them to be gone. */
async function killAndWait(pids: number[], timeoutMs: number): Promise<void> {
  for (const pid of pids) {
    for (const signal of ['SIGKILL', 'SIGCONT'] as const) {
      try {
        process.kill(pid, signal);
      } catch {
        // gone
      }
    }
  }
  const deadline = Date.now() + timeoutMs;
  while (pids.some(isAlive) && Date.now() < deadline) await sleep(50);
}

async function umountWithFallback(target: string): Promise<void> {
  try {
    await run('umount', [target], { timeoutMs: 10_000 });
  } catch {
    await run('umount', ['--lazy', target], { timeoutMs: 10_000 }).catch(() => undefined);
  }
}

/**
 * Removes everything that belongs to `dir`: aborts the FUSE connections mounted under it, kills its processes, unmounts
 * what is mounted from its loop devices, detaches those, unmounts the rest, and deletes the dir once nothing is
 * mounted in it. Returns what could not be removed (all empty when everything went).
 */
async function sweepDir(dir: string): Promise<Leftovers> {
  let state = await kernelStateOf(dir);
  for (const m of state.table) if (isUnder(m.mountPoint, dir) && m.fsType.startsWith('fuse')) await abortFuseConnection(m.mountPoint);
  await killAndWait(
    state.processes.map((p) => p.pid),
    10_000,
  );
  // Filesystems on the dir's loop devices first (deepest first), then the loops, then what is mounted under the dir.
  state = await kernelStateOf(dir);
  const onLoops = state.table.filter((m) => state.loops.includes(m.source)).map((m) => m.mountPoint);
  for (const target of onLoops.sort((a, b) => b.length - a.length)) await umountWithFallback(target);
  for (const device of state.loops) await run('losetup', ['-d', device], { timeoutMs: 10_000 }).catch(() => undefined);
  state = await kernelStateOf(dir);
  for (const target of [...state.mounts].sort((a, b) => b.length - a.length)) await umountWithFallback(target);
  // A detached loop device is freed once its last user is gone, a moment later.
  await until('loop devices to go', 5_000, async () => ((await kernelStateOf(dir)).loops.length === 0 ? true : 'still attached'), 50).catch(
    () => undefined,
  );
  const left = await kernelStateOf(dir);
  // Never delete through a mount: rm would walk into it (and hang on a dead FUSE mount).
  if (left.table.every((m) => !isUnder(m.mountPoint, dir))) rmSync(dir, { recursive: true, force: true });
  return { processes: left.processes, mounts: left.mounts, loops: left.loops };
}

/** Sweeps the cluster dirs of test processes that are gone (a test SIGKILLed mid-run leaves mounts and loops). */
async function sweepAbandonedDirs(): Promise<void> {
  let entries: string[];
  try {
    entries = readdirSync(tmpdir()).filter((e) => e.startsWith(DIR_PREFIX));
  } catch {
    return;
  }
  for (const entry of entries) {
    const dir = join(tmpdir(), entry);
    let owner: { pid: number; start: string } | undefined;
    try {
      owner = JSON.parse(readFileSync(join(dir, 'owner.json'), 'utf8')) as { pid: number; start: string };
    } catch {
      continue; // not one of ours, or its owner is writing it right now
    }
    if (procStat(owner.pid)?.[19] === owner.start) continue; // the owner is alive
    await sweepDir(dir);
  }
  await releaseFusectl();
}

// ---------------------------------------------------------------------------------------------------------------

class Daemon {
  child: ChildProcess | undefined;
  exited: Promise<void> = Promise.resolve();
  paused = false;

  constructor(
    private readonly cluster: CephCluster,
    readonly type: CephDaemon,
  ) {}

  get id(): string {
    return DAEMON_IDS[this.type];
  }
  get name(): string {
    return `${this.type}.${this.id}`;
  }
  get running(): boolean {
    return isRunning(this.child);
  }
  private get outFile(): string {
    return join(this.cluster.dir, 'log', `${this.name}.out`);
  }

  launch(): void {
    if (this.running) return;
    const { child, exited } = spawnTracked(
      `ceph-${this.type}`,
      ['-f', '--conf', this.cluster.confPath, '--id', this.id],
      this.outFile,
      this.cluster.options.netns?.name,
    );
    this.child = child;
    this.exited = exited;
    this.paused = false;
  }

  signal(signal: NodeJS.Signals): void {
    if (!this.running) throw new Error(`${this.name} is not running`);
    this.child!.kill(signal);
  }

  async kill(signal: NodeJS.Signals = 'SIGKILL', graceMs = 15_000): Promise<void> {
    if (this.running) {
      this.child!.kill(signal);
      if (this.paused) this.child!.kill('SIGCONT'); // a stopped process acts on SIGTERM only once it runs again
      const timer = setTimeout(() => this.child?.kill('SIGKILL'), graceMs);
      await this.exited;
      clearTimeout(timer);
    }
    this.paused = false;
  }

  describe(): string {
    const state = this.running ? `pid ${this.child!.pid}` : 'not running';
    return `${this.name} (${state}):\n${tail(join(this.cluster.dir, 'log', `${this.name}.log`))}\n${tail(this.outFile, 5)}`;
  }
}

interface CephStatus {
  health?: { status?: string; checks?: Record<string, { summary?: { message?: string } }> };
  osdmap?: { num_up_osds?: number; osdmap?: { num_up_osds?: number } };
  pgmap?: { num_pgs?: number; pgs_by_state?: { state_name: string; count: number }[] };
  mgrmap?: { available?: boolean };
}

export class CephCluster {
  readonly fsid = randomUUID();
  readonly confPath: string;
  readonly adminKeyring: string;
  readonly pool: string;
  /** The monitor's addresses, as in mon_host. */
  monHost = '';
  /** How long each step of start() took, in ms. */
  readonly startupSteps: { step: string; ms: number }[] = [];
  private readonly daemons: Record<CephDaemon, Daemon>;
  private stopped = false;

  private constructor(
    readonly dir: string,
    readonly options: CephClusterOptions,
  ) {
    this.confPath = join(dir, 'ceph.conf');
    this.adminKeyring = join(dir, 'client.admin.keyring');
    this.pool = options.pool ?? 'latch';
    this.daemons = { mon: new Daemon(this, 'mon'), mgr: new Daemon(this, 'mgr'), osd: new Daemon(this, 'osd') };
  }

  /** Builds and starts a cluster; on any failure tears down what it made and throws with the daemons' logs. */
  static async start(options: CephClusterOptions = {}): Promise<CephCluster> {
    const reason = cephSkipReason();
    if (reason) throw new Error(reason);
    await sweepAbandonedDirs();
    const dir = mkdtempSync(join(tmpdir(), DIR_PREFIX));
    writeFileSync(join(dir, 'owner.json'), JSON.stringify({ pid: process.pid, start: procStat(process.pid)?.[19] }));
    const cluster = new CephCluster(dir, options);
    try {
      await cluster.create();
      return cluster;
    } catch (err) {
      const logs = cluster.describe();
      await cluster.stop().catch(() => undefined);
      throw new Error(`${err instanceof Error ? err.message : String(err)}\n${logs}`, { cause: err });
    }
  }

  /** Each daemon's state and the tail of its log: what a failure message needs to be diagnosed afterwards. */
  describe(): string {
    return Object.values(this.daemons)
      .map((d) => d.describe())
      .join('\n---\n');
  }

  private path(...parts: string[]): string {
    return join(this.dir, ...parts);
  }

  private async step<T>(name: string, action: () => Promise<T>): Promise<T> {
    const started = performance.now();
    const result = await action();
    this.startupSteps.push({ step: name, ms: Math.round(performance.now() - started) });
    return result;
  }

  private async create(): Promise<void> {
    const deadline = Date.now() + (this.options.startTimeoutMs ?? 90_000);
    const left = () => Math.max(1_000, deadline - Date.now());
    for (const sub of ['log', 'run', 'crash', 'clients', 'mnt', 'mon/ceph-a', 'mgr/ceph-x', 'osd/ceph-0']) {
      mkdirSync(this.path(sub), { recursive: true, mode: 0o700 });
    }
    const netns = this.options.netns;
    const v2 = netns ? 3300 : await freeFixedPort([]);
    const v1 = netns ? 6789 : await freeFixedPort([v2]);
    this.monHost = `[v2:${this.address}:${v2},v1:${this.address}:${v1}]`;
    writeFileSync(this.confPath, this.clusterConf(), { mode: 0o600 });

    await this.step('monitor', async () => {
      // Keys are generated by ceph-authtool into files: none is ever on a command line.
      const monKeyring = this.path('mon.keyring');
      await this.tool('ceph-authtool', ['--create-keyring', monKeyring, '--gen-key', '-n', 'mon.', '--cap', 'mon', 'allow *']);
      // client.admin's caps as a real cluster's: every daemon's, the MDS's too (a test evicts a dead client's session).
      const admin = ['--gen-key', '-n', 'client.admin', ...['mon', 'osd', 'mgr', 'mds'].flatMap((d) => ['--cap', d, 'allow *'])];
      await this.tool('ceph-authtool', ['--create-keyring', this.adminKeyring, ...admin]);
      await this.tool('ceph-authtool', [monKeyring, '--import-keyring', this.adminKeyring]);
      const monmap = this.path('monmap');
      await this.tool('monmaptool', ['--create', '--fsid', this.fsid, '--addv', 'a', this.monHost, monmap]);
      await this.tool('ceph-mon', ['--conf', this.confPath, '--mkfs', '-i', 'a', '--monmap', monmap, '--keyring', monKeyring]);
      this.daemons.mon.launch();
      await this.waitFor('the monitor', left(), () => this.monAnswers());
    });
    await this.step('manager (started)', async () => {
      // Its keyring at the path its own conf section names: with only a global keyring the mgr cannot authenticate.
      await this.authToFile('mgr.x', ['mon', 'allow profile mgr', 'osd', 'allow *', 'mds', 'allow *'], this.path('mgr/ceph-x/keyring'));
      this.daemons.mgr.launch();
    });
    await this.step('OSD (mkfs, started)', async () => {
      const osdUuid = randomUUID();
      const { stdout } = await this.ceph(['osd', 'new', osdUuid]);
      if (stdout.trim() !== '0') throw new Error(`ceph osd new returned id ${JSON.stringify(stdout.trim())}, expected 0`);
      const caps = ['mon', 'allow profile osd', 'mgr', 'allow profile osd', 'osd', 'allow *'];
      await this.authToFile('osd.0', caps, this.path('osd/ceph-0/keyring'));
      await this.tool('ceph-osd', ['--conf', this.confPath, '--mkfs', '-i', '0', '--osd-uuid', osdUuid], 120_000);
      this.daemons.osd.launch();
    });
    await this.step(`pool ${this.pool} (rbd pool init)`, async () => {
      // Size 1 and 8 PGs come from the conf's pool defaults.
      await this.ceph(['osd', 'pool', 'create', this.pool]);
      await this.rbd(['pool', 'init', this.pool], { timeoutMs: left() }); // writes to the pool: needs an active PG
    });
    if (this.options.cephfs) {
      const tools = { spawn: (c: string, a: string[], log: string) => spawnTracked(c, a, log, netns?.name), until };
      await this.step('CephFS (MDS active)', () => startCephFs(this, tools, left()));
    }
    await this.step('HEALTH_OK', () => this.waitHealthy(left()));
  }

  private clusterConf(): string {
    const d = this.dir;
    return [
      '[global]',
      ...this.commonConf(),
      `run_dir = ${d}/run`,
      `crash_dir = ${d}/crash`,
      `log_file = ${d}/log/$name.log`,
      `mon_cluster_log_file = ${d}/log/cluster.log`,
      'osd_pool_default_size = 1',
      'osd_pool_default_min_size = 1',
      'osd_pool_default_pg_num = 8',
      'osd_pool_default_pgp_num = 8',
      'osd_pool_default_pg_autoscale_mode = off',
      'osd_crush_chooseleaf_type = 0',
      'mon_allow_pool_size_one = true',
      'mon_allow_pool_delete = true',
      'mon_warn_on_pool_no_redundancy = false',
      // The test disk may be fuller than a production monitor would like; that is not what the tests are about.
      'mon_data_avail_warn = 2',
      'mon_data_avail_crit = 1',
      // Speed: monitor updates committed and PG states reported within 0.1-1 s rather than 1-5 s (start-up ~11 s, not ~16 s).
      'osd_mon_report_interval = 1',
      'mgr_stats_period = 1',
      'mgr_tick_period = 1',
      'mon_mgr_digest_period = 1',
      'paxos_propose_interval = 0.1',
      'paxos_min_wait = 0.01',
      '',
      '[mon]',
      `mon_data = ${d}/mon/$cluster-$id`,
      `keyring = ${d}/mon/$cluster-$id/keyring`,
      '',
      '[mgr]',
      `mgr_data = ${d}/mgr/$cluster-$id`,
      `keyring = ${d}/mgr/$cluster-$id/keyring`,
      `public_addr = ${this.address}`,
      '',
      '[osd]',
      `osd_data = ${d}/osd/$cluster-$id`,
      `keyring = ${d}/osd/$cluster-$id/keyring`,
      'osd_objectstore = bluestore',
      'bluestore_block_create = true',
      `bluestore_block_size = ${(this.options.osdSizeGiB ?? 8) * 1024 ** 3}`,
      'osd_memory_target = 1073741824',
      `public_addr = ${this.address}`,
      `cluster_addr = ${this.address}`,
      '',
      '[client.admin]',
      `keyring = ${this.adminKeyring}`,
      '',
    ].join('\n');
  }

  private commonConf(): string[] {
    return [
      `fsid = ${this.fsid}`,
      `mon_host = ${this.monHost}`,
      'auth_cluster_required = cephx',
      'auth_service_required = cephx',
      'auth_client_required = cephx',
      'auth_allow_insecure_global_id_reclaim = false',
    ];
  }

  /** The daemons' address: 127.0.0.1, or the one given with the network namespace. */
  get address(): string {
    return this.options.netns?.address ?? '127.0.0.1';
  }

  /** Runs a command in the cluster's network namespace (the host's unless one was given), under a deadline. */
  private exec(command: string, args: string[], options: RunOptions): Promise<RunResult> {
    const [file, argv] = inNetns(this.options.netns?.name, command, args);
    return run(file, argv, options);
  }

  private async tool(command: string, args: string[], timeoutMs = COMMAND_TIMEOUT_MS): Promise<RunResult> {
    return this.exec(command, args, { timeoutMs });
  }

  /** Runs `ceph` as client.admin (or as `as`) on this cluster, under a deadline. */
  async ceph(args: string[], options: RunOptions & { as?: CephClient } = {}): Promise<RunResult> {
    const { as, ...runOptions } = options;
    const who = as ? ['--conf', as.confPath, '--id', as.id] : ['--conf', this.confPath, '--id', 'admin'];
    return this.exec('ceph', [...who, '--connect-timeout', '10', ...args], { timeoutMs: COMMAND_TIMEOUT_MS, ...runOptions });
  }

  /** Runs `rbd` as client.admin (or as `as`) on this cluster, under a deadline. */
  async rbd(args: string[], options: RunOptions & { as?: CephClient } = {}): Promise<RunResult> {
    const { as, ...runOptions } = options;
    const who = as ? ['--conf', as.confPath, '--id', as.id] : ['--conf', this.confPath, '--id', 'admin'];
    return this.exec('rbd', [...who, ...args], { timeoutMs: COMMAND_TIMEOUT_MS, ...runOptions });
  }

  /** `ceph auth get-or-create NAME caps... -o FILE`, into a file made 0600 before the key is written to it. */
  private async authToFile(entity: string, caps: string[], file: string): Promise<void> {
    writeFileSync(file, '', { mode: 0o600 });
    await this.ceph(['auth', 'get-or-create', entity, ...caps, '-o', file]);
  }

  private async waitFor(what: string, timeoutMs: number, probe: () => Promise<true | string>): Promise<void> {
    await until(what, timeoutMs, async () => {
      for (const d of Object.values(this.daemons)) {
        if (d.child && !d.running) throw new Error(`${d.name} exited (${d.child.exitCode ?? d.child.signalCode})`);
      }
      return probe();
    });
  }

  private async monAnswers(): Promise<true | string> {
    await this.ceph(['mon', 'stat'], { timeoutMs: PROBE_TIMEOUT_MS });
    return true;
  }

  private async status(): Promise<CephStatus> {
    const { stdout } = await this.ceph(['status', '--format', 'json'], { timeoutMs: PROBE_TIMEOUT_MS });
    return JSON.parse(stdout) as CephStatus;
  }

  /** true when a manager is available, the OSD is up, every PG is active+clean and health is HEALTH_OK. */
  private async healthy(): Promise<true | string> {
    const s = await this.status();
    if (!s.mgrmap?.available) return 'no manager available yet';
    const up = s.osdmap?.num_up_osds ?? s.osdmap?.osdmap?.num_up_osds;
    if (up !== 1) return `${up ?? 0} OSDs up`;
    const states = s.pgmap?.pgs_by_state ?? [];
    const clean = states.find((p) => p.state_name === 'active+clean')?.count ?? 0;
    if (!s.pgmap?.num_pgs || clean !== s.pgmap.num_pgs)
      return `PGs: ${states.map((p) => `${p.count} ${p.state_name}`).join(', ') || 'none'}`;
    if (s.health?.status !== 'HEALTH_OK') {
      const checks = Object.entries(s.health?.checks ?? {}).map(([k, v]) => `${k}: ${v.summary?.message ?? ''}`);
      return `${s.health?.status ?? 'no health'} ${checks.join('; ')}`;
    }
    return true;
  }

  /** Waits until the cluster is HEALTH_OK with every PG active+clean (after a restart, say). */
  async waitHealthy(timeoutMs = 60_000): Promise<void> {
    await this.waitFor('HEALTH_OK', timeoutMs, () => this.healthy());
  }

  // -------------------------------------------------------------------------------------------------------------
  // Identities and the node side.

  /**
   * A cephx identity `client.<id>` (node caps unless told otherwise), its keyring written by `ceph auth
   * get-or-create -o` into a 0600 file, and a conf of its own, as a node or the fencer would have.
   */
  async createClient(id: string, options: CreateClientOptions = {}): Promise<CephClient> {
    if (!/^[A-Za-z0-9][A-Za-z0-9_.-]*$/.test(id)) throw new Error(`bad client id ${JSON.stringify(id)}`);
    const role = options.role ?? 'node';
    const caps = options.caps ?? (role === 'node' ? nodeCaps(this.pool) : fencerCaps(this.pool));
    const keyringPath = this.path('clients', `client.${id}.keyring`);
    const confPath = this.path('clients', `client.${id}.conf`);
    await this.authToFile(`client.${id}`, caps, keyringPath);
    const settings = {
      // A node takes over a lock only from a holder the fencer has already blocklisted; without blocklist caps,
      // librbd's own blocklisting of the old holder would fail and with it the lock acquisition.
      ...(role === 'node' ? { rbd_blocklist_on_break_lock: 'false' } : {}),
      ...options.settings,
    };
    const conf = [
      '[global]',
      ...this.commonConf(),
      '',
      `[client.${id}]`,
      `keyring = ${keyringPath}`,
      // One admin socket and one log per process, so two processes of one identity never share them.
      `admin_socket = ${this.dir}/run/$name.$pid.asok`,
      `log_file = ${this.dir}/log/$name.$pid.log`,
      ...Object.entries(settings).map(([k, v]) => `${k} = ${v}`),
      '',
    ].join('\n');
    writeFileSync(confPath, conf, { mode: 0o600 });
    return { id, name: `client.${id}`, keyringPath, confPath };
  }

  /**
   * Runs `op` (a child process that touches the FUSE mount at `mountpoint`) and aborts the mount's FUSE connection
   * if it has not finished after `timeoutMs`: a child waiting on a dead connection is beyond any signal, and the
   * abort is what makes it return (with an error).
   */
  async guardFuse<T>(mountpoint: string, timeoutMs: number, op: () => Promise<T>): Promise<T> {
    let aborted = false;
    const timer = setTimeout(() => {
      aborted = true;
      void abortFuseConnection(mountpoint).catch(() => undefined);
    }, timeoutMs);
    try {
      return await op();
    } catch (err) {
      if (aborted) throw new Error(`the FUSE mount at ${mountpoint} did not answer within ${timeoutMs} ms and was aborted`, { cause: err });
      throw err;
    } finally {
      clearTimeout(timer);
    }
  }

  /**
   * Starts `rbd-fuse` as `client` on `mountpoint`, serving `image` only (`-r`) when given, else every image of the
   * pool, and waits until the mount is there (and, with `image`, until a stat of it answers, under guardFuse).
   */
  async startRbdFuse(client: CephClient, mountpoint: string, options: { image?: string; timeoutMs?: number } = {}): Promise<RbdFuseMount> {
    mkdirSync(mountpoint, { recursive: true, mode: 0o700 });
    const log = this.path('log', `rbd-fuse.${client.id}.${Date.now()}.out`);
    const image = options.image ? ['-r', options.image] : [];
    const { child, exited } = spawnTracked(
      'rbd-fuse',
      ['--conf', client.confPath, '--id', client.id, '-p', this.pool, ...image, mountpoint, '-f'],
      log,
    );
    const pid = child.pid;
    if (pid === undefined) throw new Error(`rbd-fuse could not be started:\n${tail(log)}`);
    const mount: RbdFuseMount = {
      pid,
      mountpoint,
      client,
      imagePath: (name) => join(mountpoint, name),
      memory: () => {
        try {
          const status = readFileSync(`/proc/${pid}/status`, 'utf8');
          const field = (name: string) => Number(new RegExp(`^${name}:\\s+(\\d+) kB`, 'm').exec(status)?.[1] ?? NaN);
          return { rssKiB: field('VmRSS'), peakKiB: field('VmHWM') };
        } catch {
          return undefined;
        }
      },
      stop: async (timeoutMs = 15_000) => {
        await this.guardFuse(mountpoint, timeoutMs, () => run('umount', [mountpoint], { timeoutMs: timeoutMs + 5_000 })).catch(
          () => undefined,
        );
        const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
        await exited;
        clearTimeout(timer);
        if ((await readMountInfo()).some((m) => m.mountPoint === mountpoint)) await umountWithFallback(mountpoint);
      },
    };
    const timeoutMs = options.timeoutMs ?? 30_000;
    try {
      await until('rbd-fuse to mount', timeoutMs, async () => {
        if (!isRunning(child)) throw new Error(`rbd-fuse exited (${child.exitCode ?? child.signalCode}):\n${tail(log)}`);
        const mounted = (await readMountInfo()).some((m) => m.mountPoint === mountpoint && m.fsType.startsWith('fuse'));
        return mounted ? true : 'not mounted yet';
      });
      if (options.image) {
        const file = join(mountpoint, options.image);
        await this.guardFuse(mountpoint, timeoutMs, () => run('stat', ['--format', '%s', file], { timeoutMs: timeoutMs + 5_000 }));
      }
    } catch (err) {
      await abortFuseConnection(mountpoint).catch(() => undefined);
      child.kill('SIGKILL');
      await exited;
      await umountWithFallback(mountpoint);
      throw err;
    }
    return mount;
  }

  /** `losetup --find --show --direct-io=on` over `image` of an rbd-fuse mount, under guardFuse; returns /dev/loopN. */
  async attachLoop(fuse: RbdFuseMount, image: string, timeoutMs = 30_000): Promise<string> {
    const { stdout } = await this.guardFuse(fuse.mountpoint, timeoutMs, () =>
      run('losetup', ['--find', '--show', '--direct-io=on', fuse.imagePath(image)], { timeoutMs: timeoutMs + 5_000 }),
    );
    const device = stdout.trim();
    if (!/^\/dev\/loop[0-9]+$/.test(device)) throw new Error(`losetup printed ${JSON.stringify(device)}`);
    return device;
  }

  async detachLoop(device: string, timeoutMs = 30_000): Promise<void> {
    await run('losetup', ['-d', device], { timeoutMs });
  }

  // -------------------------------------------------------------------------------------------------------------
  // Faults.

  /** The daemon's PID, or undefined when it is not running. */
  pid(daemon: CephDaemon): number | undefined {
    const d = this.daemons[daemon];
    return d.running ? d.child!.pid : undefined;
  }

  /** Kills a daemon (SIGKILL unless told otherwise) and waits until it is gone. Its data stays for start(). */
  async kill(daemon: CephDaemon, signal: NodeJS.Signals = 'SIGKILL'): Promise<void> {
    await this.daemons[daemon].kill(signal);
  }

  /** SIGSTOP: the daemon keeps its sockets open but answers nothing. */
  pause(daemon: CephDaemon): void {
    this.daemons[daemon].signal('SIGSTOP');
    this.daemons[daemon].paused = true;
  }

  resume(daemon: CephDaemon): void {
    this.daemons[daemon].signal('SIGCONT');
    this.daemons[daemon].paused = false;
  }

  /** Starts a daemon that was killed, and waits until it serves again. */
  async start(daemon: CephDaemon, timeoutMs = 60_000): Promise<void> {
    const before = daemon === 'mon' ? undefined : await (daemon === 'osd' ? this.osdUpFrom() : this.activeMgr()).catch(() => undefined);
    this.daemons[daemon].launch();
    if (daemon === 'mon') {
      await this.waitFor('the monitor', timeoutMs, () => this.monAnswers());
    } else if (daemon === 'mgr') {
      // The monitor still lists the old instance as active until the new one's first beacon replaces it.
      await this.waitFor('the manager', timeoutMs, async () => {
        const gid = await this.activeMgr();
        return gid !== undefined && gid !== before ? true : 'no new manager active yet';
      });
    } else {
      // A lone OSD that dies is never reported down (no peer notices), so wait for the new instance's boot.
      await this.waitFor('the OSD', timeoutMs, async () => {
        const upFrom = await this.osdUpFrom();
        if (upFrom === undefined || (before !== undefined && upFrom <= before)) return 'not booted yet';
        await this.exec('rados', ['--conf', this.confPath, '--id', 'admin', '-p', this.pool, 'ls'], { timeoutMs: 5_000 });
        return true;
      });
    }
  }

  /** Stops a daemon (SIGTERM, then SIGKILL) and starts it again. */
  async restart(daemon: CephDaemon, timeoutMs = 60_000): Promise<void> {
    await this.kill(daemon, 'SIGTERM');
    await this.start(daemon, timeoutMs);
  }

  private async activeMgr(): Promise<number | undefined> {
    const { stdout } = await this.ceph(['mgr', 'dump', '--format', 'json'], { timeoutMs: PROBE_TIMEOUT_MS });
    const map = JSON.parse(stdout) as { available?: boolean; active_gid?: number };
    return map.available ? map.active_gid : undefined;
  }

  private async osdUpFrom(): Promise<number | undefined> {
    const { stdout } = await this.ceph(['osd', 'dump', '--format', 'json'], { timeoutMs: PROBE_TIMEOUT_MS });
    const osd = (JSON.parse(stdout) as { osds?: { osd: number; up: number; up_from: number }[] }).osds?.find((o) => o.osd === 0);
    return osd && osd.up === 1 ? osd.up_from : undefined;
  }

  // -------------------------------------------------------------------------------------------------------------

  /** What the kernel says is left of this cluster (processes, mounts, loop devices), without touching any mount. */
  async leftovers(): Promise<Leftovers> {
    const { processes, mounts, loops } = await kernelStateOf(this.dir);
    return { processes, mounts, loops };
  }

  /**
   * Tears everything down, healthy or not: rbd-fuse mounts and loop devices under its dir (aborted first, so a
   * fenced one cannot hang the teardown), the daemons, the dir. Safe to call twice and after a failed start.
   * Throws if the kernel still shows anything of it.
   */
  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    try {
      const left = await sweepDir(this.dir);
      for (const d of Object.values(this.daemons)) await d.kill('SIGKILL');
      if (left.processes.length + left.mounts.length + left.loops.length > 0) {
        throw new Error(`the Ceph cluster in ${this.dir} left things behind: ${JSON.stringify(left)}`);
      }
    } finally {
      await releaseFusectl();
    }
  }
}

export function startCephCluster(options: CephClusterOptions = {}): Promise<CephCluster> {
  return CephCluster.start(options);
}

// latch doctor: checks this node the way someone debugging a pod stuck in ContainerCreating would, and says for
// every finding which command fixes it.
//
// Severities: "error" when something is broken now or the ledger and the kernel disagree (a call will fail, or a
// volume could be written from where the ledger does not know); "warning" when latch works but something needs
// attention (a tool only some volumes need, an overcommitted pool, another driver version installed, a volume
// detaching for longer than --stuck-after). Exit status: 1 with any error, 2 with warnings only, 0 when healthy.
import { InvalidArgumentError, type Command } from 'commander';
import { constants } from 'node:fs';
import { access, lstat, open, readdir, realpath, stat, statfs } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { loadConfig, type Config } from '../config.js';
import { FS_TYPES, type FsType } from '../filesystems.js';
import { errorMessage } from '../errors.js';
import { isInUse, nodeHoldsDevice, ticketsOfNode } from '../ledger/arbitrate.js';
import type { VolumeDoc } from '../ledger/types.js';
import { Ledger } from '../ledger/ledger.js';
import { openStore } from '../store/index.js';
import { listLoopDevices, type LoopDevice } from '../sys/loop.js';
import { readMountInfo, type MountInfo } from '../sys/mounts.js';
import { choosePluginDir, driverPath, fileDigest, installedState, runningExecutable } from './install.js';
import { parseFormat, printJson, printTable, type OutputFormat } from './output.js';

export type Severity = 'ok' | 'warning' | 'error';

export interface Finding {
  check: string;
  severity: Severity;
  message: string;
  /** The shell command that fixes it, ready to run (absent for ok findings and where only a person can decide). */
  fix?: string;
  /** What to know before running the fix, or what else would do. */
  note?: string;
}

export interface DoctorReport {
  node?: string;
  config?: string;
  healthy: boolean;
  errors: number;
  warnings: number;
  findings: Finding[];
}

export interface DoctorOptions {
  env?: NodeJS.ProcessEnv;
  /** --plugin-dir; otherwise $LATCH_VOLUME_PLUGIN_DIR or detection, as for install. */
  pluginDir?: string;
  /** A volume detaching from a node for longer than this is reported. */
  stuckAfterSeconds?: number;
  /** The executable the installed driver is compared with (default: the one running). */
  self?: string;
  now?: () => number;
}

// The same search path run() gives children: PATH plus the sbin directories. $LATCH_TOOL_PATH replaces it (tests).
const EXTRA_PATH = ['/usr/local/sbin', '/usr/sbin', '/sbin'];
const FALLBACK_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';
const IMAGE_SUFFIX = '.img';
const DEFAULT_STUCK_AFTER_SECONDS = 300;

interface ToolSpec {
  tool: string;
  /** Debian/Ubuntu package, RHEL/Fedora package. */
  deb: string;
  rpm: string;
  why: string;
  severity: Severity;
}

export async function runDoctor(options: DoctorOptions = {}): Promise<DoctorReport> {
  const env = options.env ?? process.env;
  const now = options.now ?? Date.now;
  const findings: Finding[] = [];
  const add = (f: Finding) => findings.push(f);

  // Configuration first: everything else depends on it.
  let config: Config | undefined;
  try {
    config = loadConfig(env);
    add({
      check: 'config',
      severity: 'ok',
      message:
        `configuration from ${config.source}: node ${config.nodeName}, driver ${config.driverName}, ` +
        `${config.attach ? 'attach' : 'non-attach'} mode, ${config.store.type} store`,
    });
  } catch (err) {
    const file = env.LATCH_CONFIG || '/etc/latch/config.json';
    add({
      check: 'config',
      severity: 'error',
      message: errorMessage(err),
      fix: `\${EDITOR:-vi} ${sh(file)}`,
      note: 'see the README, "Configuration"; then run latch doctor again',
    });
  }

  await checkTools(config, env, add);
  await checkLoopSupport(add);
  await checkPlugin(config, options, env, add);
  if (config) await checkLedgerAndKernel(config, options.stuckAfterSeconds ?? DEFAULT_STUCK_AFTER_SECONDS, now, add);
  else
    add({
      check: 'ledger',
      severity: 'warning',
      message: 'ledger and kernel not compared: the configuration did not load',
      note: 'fix the configuration first (see above)',
    });

  const errors = findings.filter((f) => f.severity === 'error').length;
  const warnings = findings.filter((f) => f.severity === 'warning').length;
  return {
    ...(config && { node: config.nodeName, config: config.source }),
    healthy: errors === 0 && warnings === 0,
    errors,
    warnings,
    findings,
  };
}

/** 0 healthy, 1 with any error, 2 with warnings only. */
export function doctorExitCode(report: DoctorReport): number {
  return report.errors > 0 ? 1 : report.warnings > 0 ? 2 : 0;
}

// ---- tools --------------------------------------------------------------------------------------------------

export function toolSearchPath(env: NodeJS.ProcessEnv = process.env): string[] {
  if (env.LATCH_TOOL_PATH !== undefined) return env.LATCH_TOOL_PATH.split(':').filter((p) => p.length > 0);
  const parts = (env.PATH || FALLBACK_PATH).split(':').filter((p) => p.length > 0);
  for (const dir of EXTRA_PATH) if (!parts.includes(dir)) parts.push(dir);
  return parts;
}

/** The full path of an executable found on the search path, or undefined. */
export async function findTool(tool: string, searchPath: string[]): Promise<string | undefined> {
  for (const dir of searchPath) {
    const candidate = join(dir, tool);
    try {
      if (!(await stat(candidate)).isFile()) continue;
      await access(candidate, constants.X_OK);
      return candidate;
    } catch {
      // not here
    }
  }
  return undefined;
}

function requiredTools(allowed: readonly FsType[], defaultFsType: FsType): ToolSpec[] {
  const tools: ToolSpec[] = [
    { tool: 'losetup', deb: 'mount', rpm: 'util-linux', why: 'sets up the loop devices', severity: 'error' },
    { tool: 'blkid', deb: 'util-linux', rpm: 'util-linux', why: 'finds existing filesystems (never format over one)', severity: 'error' },
    { tool: 'mount', deb: 'mount', rpm: 'util-linux', why: 'mounts volumes', severity: 'error' },
    { tool: 'umount', deb: 'mount', rpm: 'util-linux', why: 'unmounts volumes', severity: 'error' },
    { tool: 'findmnt', deb: 'util-linux', rpm: 'util-linux', why: 'verifies mounts', severity: 'error' },
    {
      tool: 'setpriv',
      deb: 'util-linux',
      rpm: 'util-linux',
      why: "makes every child die with a killed driver call (without it an orphaned losetup -d could hit another volume's device)",
      severity: 'warning',
    },
  ];
  const packages: Record<FsType, { deb: string; rpm: string; grow: string }> = {
    ext4: { deb: 'e2fsprogs', rpm: 'e2fsprogs', grow: 'resize2fs' },
    ext3: { deb: 'e2fsprogs', rpm: 'e2fsprogs', grow: 'resize2fs' },
    xfs: { deb: 'xfsprogs', rpm: 'xfsprogs', grow: 'xfs_growfs' },
    btrfs: { deb: 'btrfs-progs', rpm: 'btrfs-progs', grow: 'btrfs' },
  };
  const growers = new Set<string>();
  for (const fs of allowed) {
    const p = packages[fs];
    const isDefault = fs === defaultFsType;
    tools.push({
      tool: `mkfs.${fs}`,
      deb: p.deb,
      rpm: p.rpm,
      why: `formats new ${fs} volumes (${isDefault ? 'the defaultFsType' : 'in allowedFsTypes'})`,
      severity: isDefault ? 'error' : 'warning',
    });
    if (!growers.has(p.grow)) {
      growers.add(p.grow);
      tools.push({ tool: p.grow, deb: p.deb, rpm: p.rpm, why: `grows ${fs} filesystems (expandfs)`, severity: 'warning' });
    }
  }
  return tools;
}

async function checkTools(config: Config | undefined, env: NodeJS.ProcessEnv, add: (f: Finding) => void): Promise<void> {
  const searchPath = toolSearchPath(env);
  const allowed = config?.allowedFsTypes ?? [...FS_TYPES];
  const found: string[] = [];
  for (const spec of requiredTools(allowed, config?.defaultFsType ?? 'ext4')) {
    if (await findTool(spec.tool, searchPath)) {
      found.push(spec.tool);
      continue;
    }
    const fs = /^mkfs\.(.+)$/.exec(spec.tool)?.[1];
    add({
      check: 'tools',
      severity: spec.severity,
      message: `${spec.tool} not found in ${searchPath.join(':')}: it ${spec.why}`,
      fix: `apt-get install -y ${spec.deb}`,
      note:
        `RHEL, Fedora: dnf install -y ${spec.rpm}` +
        (fs && spec.severity === 'warning' ? `; or remove "${fs}" from allowedFsTypes in ${config?.source ?? 'the configuration'}` : ''),
    });
  }
  add({ check: 'tools', severity: 'ok', message: `found ${found.join(', ') || 'none of the tools'}` });
}

async function checkLoopSupport(add: (f: Finding) => void): Promise<void> {
  try {
    if ((await stat('/dev/loop-control')).isCharacterDevice()) {
      add({ check: 'loop', severity: 'ok', message: '/dev/loop-control is present: the kernel can set up loop devices' });
      return;
    }
  } catch {
    // reported below
  }
  add({
    check: 'loop',
    severity: 'error',
    message: '/dev/loop-control is missing: no loop devices can be set up',
    fix: 'modprobe loop && echo loop > /etc/modules-load.d/latch.conf',
    note: 'in a container: run it privileged',
  });
}

// ---- plugin dir and installed driver ----------------------------------------------------------------------------

async function checkPlugin(
  config: Config | undefined,
  options: DoctorOptions,
  env: NodeJS.ProcessEnv,
  add: (f: Finding) => void,
): Promise<void> {
  let choice;
  try {
    choice = await choosePluginDir(options.pluginDir, env);
  } catch (err) {
    add({
      check: 'plugin-dir',
      severity: 'error',
      message: errorMessage(err),
      note: "run latch doctor --plugin-dir with kubelet's --volume-plugin-dir",
    });
    return;
  }
  const dirOption = choice.source === 'option' || choice.source === 'env' ? ` --plugin-dir ${sh(choice.dir)}` : '';
  const driverName = config?.driverName ?? 'latch/loop';
  const installFix = `latch install${dirOption}${config && config.driverName !== 'latch/loop' ? ` --driver ${driverName}` : ''}`;
  let dirInfo;
  try {
    dirInfo = await stat(choice.dir);
  } catch {
    dirInfo = undefined;
  }
  if (!dirInfo?.isDirectory()) {
    add({
      check: 'plugin-dir',
      severity: 'error',
      message: `plugin dir ${choice.dir} (${choice.reason}) does not exist: kubelet finds no FlexVolume driver there`,
      fix: installFix,
    });
    return;
  }
  add({ check: 'plugin-dir', severity: 'ok', message: `plugin dir ${choice.dir} (${choice.reason})` });

  const { dir, file } = driverPath(choice.dir, driverName);
  const installed = await installedState(file);
  if (installed.state === 'missing') {
    add({
      check: 'driver',
      severity: 'error',
      message: `${file} is not installed: kubelet does not know the driver ${driverName}`,
      fix: installFix,
    });
  } else if (installed.state === 'not-a-file') {
    add({
      check: 'driver',
      severity: 'error',
      message: `${file} is ${installed.kind}: kubelet cannot run it`,
      fix: `rm -r ${sh(file)} && ${installFix}`,
    });
  } else {
    let self: { sha256: string; path: string } | undefined;
    try {
      const path = options.self ?? (await runningExecutable()).path;
      self = { path, sha256: (await fileDigest(path)).sha256 };
    } catch {
      self = undefined;
    }
    if ((installed.mode & 0o111) !== 0o111) {
      add({
        check: 'driver',
        severity: 'error',
        message: `${file} is not executable (mode ${installed.mode.toString(8)})`,
        fix: installFix,
      });
    } else if (self === undefined) {
      add({ check: 'driver', severity: 'ok', message: `${file} is installed (sha256 ${installed.sha256.slice(0, 12)})` });
    } else if (self.sha256 === installed.sha256) {
      add({
        check: 'driver',
        severity: 'ok',
        message: `${file} is installed and identical to ${self.path} (sha256 ${installed.sha256.slice(0, 12)})`,
      });
    } else {
      add({
        check: 'driver',
        severity: 'warning',
        message: `${file} (sha256 ${installed.sha256.slice(0, 12)}) differs from ${self.path} (sha256 ${self.sha256.slice(0, 12)}): kubelet runs another build than this one`,
        fix: installFix,
        note: 'with the build you want kubelet to run',
      });
    }
    await checkInterpreter(file, env, add);
  }

  let names: string[] = [];
  try {
    names = await readdir(dir);
  } catch {
    names = [];
  }
  for (const name of names.filter((n) => n !== basename(file))) {
    const leftover = name.startsWith('.');
    add({
      check: 'driver',
      severity: 'warning',
      message: leftover
        ? `${join(dir, name)} looks like the temporary file of an install that was interrupted`
        : `${join(dir, name)} is not the driver: every change to it makes kubelet re-probe the plugin`,
      fix: `rm ${sh(join(dir, name))}`,
    });
  }
}

/** The Node.js bundle needs `node` wherever kubelet runs it; the self-contained build needs nothing. */
async function checkInterpreter(file: string, env: NodeJS.ProcessEnv, add: (f: Finding) => void): Promise<void> {
  let head = '';
  try {
    const handle = await open(file, 'r');
    try {
      const buffer = Buffer.alloc(128);
      const { bytesRead } = await handle.read(buffer, 0, 128, 0);
      head = buffer.subarray(0, bytesRead).toString('latin1');
    } finally {
      await handle.close();
    }
  } catch {
    return;
  }
  if (!head.startsWith('#!')) return;
  const line = head.slice(2).split('\n')[0]!.trim();
  const words = line.split(/\s+/);
  const interpreter = words[0] && basename(words[0]) === 'env' ? words[1] : words[0];
  if (!interpreter) return;
  const found = interpreter.startsWith('/')
    ? await findTool(basename(interpreter), [dirname(interpreter)])
    : await findTool(interpreter, toolSearchPath(env));
  if (found) return;
  add({
    check: 'driver',
    severity: 'error',
    message: `${file} is the Node.js bundle (#!${line}) but ${interpreter} is not found: kubelet cannot run it`,
    fix: 'npm run build:sea && bin/latch-sea install',
    note: 'installs the self-contained build, which needs no Node.js; or install Node.js 20 on the host',
  });
}

// ---- pool, ledger and kernel --------------------------------------------------------------------------------

async function checkLedgerAndKernel(
  config: Config,
  stuckAfterSeconds: number,
  now: () => number,
  add: (f: Finding) => void,
): Promise<void> {
  const node = config.nodeName;
  let docs: VolumeDoc[];
  try {
    // A ledger of its own rather than the process-wide one: doctor may look at several configurations (tests).
    docs = await new Ledger(await openStore(config)).list();
  } catch (err) {
    add({
      check: 'ledger',
      severity: 'error',
      message: `the ledger cannot be read: ${errorMessage(err)}`,
      ...(config.store.type === 'file'
        ? { note: `the state directory must be readable by root (ls -la ${config.stateDir})` }
        : { note: `check that etcd at ${config.store.endpoints.join(', ')} is reachable` }),
    });
    return;
  }
  add({ check: 'ledger', severity: 'ok', message: `${docs.length} volume(s) in the ledger` });
  const byName = new Map(docs.map((d) => [d.name, d]));

  let pool: string | undefined;
  try {
    pool = await realpath(config.poolDir);
  } catch {
    pool = undefined;
  }
  await checkPool(config, pool, docs, add);

  // What the kernel has: loop devices over pool images (a deleted image included), and where they are mounted.
  const devices = pool === undefined ? [] : (await listLoopDevices()).filter((d) => dirname(d.backingFile) === pool);
  const volumeOf = (d: LoopDevice) => {
    const name = basename(d.backingFile);
    return name.endsWith(IMAGE_SUFFIX) ? name.slice(0, -IMAGE_SUFFIX.length) : name;
  };
  let mounts: MountInfo[] = [];
  try {
    mounts = await readMountInfo();
  } catch {
    mounts = [];
  }
  const mountsOf = (device: string) => mounts.filter((m) => m.source === device).map((m) => m.mountPoint);
  const holds = (volume: string) => {
    const doc = byName.get(volume);
    return doc !== undefined && nodeHoldsDevice(doc, node);
  };
  const liveDevice = (volume: string) => devices.find((d) => !d.deleted && volumeOf(d) === volume);

  let problems = 0;
  // Holds of this node whose device is gone.
  for (const doc of docs) {
    const entry = doc.status.nodes[node];
    if (!entry || !isInUse(entry.phase)) continue;
    if (liveDevice(doc.name)) continue;
    problems++;
    const tickets = ticketsOfNode(doc, node).map((t) => `${t.id.slice(0, t.id.indexOf('-') + 13)}...`);
    add({
      check: 'ledger',
      severity: entry.phase === 'attached' ? 'error' : 'warning',
      message:
        `stale ticket: volume ${doc.name} is ${entry.phase} on node ${node} in the ledger (${entry.device ? `device ${entry.device}, ` : ''}since ${entry.since}` +
        `${tickets.length > 0 ? `; ticket(s) ${tickets.join(', ')}` : ''}), but no loop device is set up over its image` +
        (entry.phase === 'attaching' ? ' (if a waitforattach is running right now, run latch doctor again)' : ''),
      fix: `latch volume release ${doc.name} --node ${node} --node-is-down`,
      note: `safe: without a device nothing on ${node} can write to it; a pod that still wants it gets it back through kubelet's next waitforattach`,
    });
  }

  // Mounts of pool devices the ledger does not know about.
  for (const d of devices) {
    const volume = volumeOf(d);
    if (holds(volume)) continue;
    for (const target of mountsOf(d.device)) {
      problems++;
      add({
        check: 'mounts',
        severity: 'error',
        message: `${d.device} (volume ${volume}) is mounted at ${target}, but the ledger does not know that node ${node} holds ${volume}`,
        fix: `umount ${sh(target)}`,
        note: `first make sure nothing uses it: findmnt -R ${sh(target)}`,
      });
    }
  }

  // Loop devices over pool images without a hold in the ledger.
  for (const d of devices) {
    const volume = volumeOf(d);
    if (holds(volume) && !d.deleted) continue;
    problems++;
    const doc = byName.get(volume);
    const mounted = mountsOf(d.device);
    const why = d.deleted
      ? `its image ${d.backingFile} was deleted`
      : doc
        ? `the ledger has no hold of node ${node} on volume ${volume}`
        : `volume ${volume} is not in the ledger`;
    add({
      check: 'devices',
      severity: 'error',
      message: `orphan loop device: ${d.device} is set up over ${d.backingFile}, but ${why}`,
      fix: `losetup -d ${d.device}`,
      ...(mounted.length > 0 && { note: `after unmounting ${mounted.join(', ')} (see the mounts finding)` }),
    });
  }

  // Volumes detaching for too long, from any node.
  for (const doc of docs) {
    for (const [holder, entry] of Object.entries(doc.status.nodes)) {
      if (entry.phase !== 'detaching') continue;
      const since = Date.parse(entry.since);
      const seconds = Number.isFinite(since) ? Math.floor((now() - since) / 1000) : Number.POSITIVE_INFINITY;
      if (seconds < stuckAfterSeconds) continue;
      problems++;
      let detail: string;
      let fix: string | undefined;
      let note: string;
      if (holder === node) {
        const device = liveDevice(doc.name);
        const mounted = device ? mountsOf(device.device) : [];
        if (!device) {
          detail = 'no device of it is set up here any more';
          fix = `latch volume release ${doc.name} --node ${node} --node-is-down`;
          note = `safe: no device of ${doc.name} is set up on ${node}`;
        } else {
          detail = `${device.device} is still set up${mounted.length > 0 ? ` and mounted at ${mounted.join(', ')}` : ''}: kubelet has not called unmountdevice`;
          fix = undefined;
          note = `find the pod still using it (kubelet calls unmountdevice once none does); by hand, once nothing uses it: ${mounted.length > 0 ? `umount ${mounted.join(' ')} && ` : ''}losetup -d ${device.device} && latch volume release ${doc.name} --node ${node} --node-is-down`;
        }
      } else {
        detail = `node ${holder} has not confirmed it released the device`;
        fix = undefined;
        note = `run latch doctor on ${holder}; if ${holder} is down for good: latch volume release ${doc.name} --node ${holder} --node-is-down`;
      }
      add({
        check: 'detaching',
        severity: 'warning',
        message: `volume ${doc.name} has been detaching from node ${holder} for ${formatSeconds(seconds)} (since ${entry.since}): ${detail}`,
        ...(fix !== undefined && { fix }),
        note,
      });
    }
  }

  if (problems === 0) {
    add({
      check: 'ledger',
      severity: 'ok',
      message: `ledger and kernel agree on node ${node}: ${devices.length} loop device(s) of the pool, each held in the ledger`,
    });
  }
}

async function checkPool(config: Config, pool: string | undefined, docs: VolumeDoc[], add: (f: Finding) => void): Promise<void> {
  if (pool === undefined) {
    add({ check: 'pool', severity: 'ok', message: `pool ${config.poolDir} does not exist yet; it is created with the first volume` });
    return;
  }
  const provisioned = docs.reduce((sum, d) => sum + d.spec.sizeBytes, 0);
  let allocated = 0;
  for (const doc of docs) {
    try {
      const info = await lstat(join(pool, `${doc.name}${IMAGE_SUFFIX}`));
      if (info.isFile()) allocated += Math.min(info.blocks * 512, doc.spec.sizeBytes);
    } catch {
      // no image on this node
    }
  }
  let available: number;
  try {
    const fs = await statfs(pool);
    available = Number(fs.bavail) * Number(fs.bsize);
  } catch (err) {
    add({
      check: 'pool',
      severity: 'error',
      message: `cannot read the free space of ${pool}: ${errorMessage(err)}`,
      note: `the pool must be a readable directory (ls -ld ${pool})`,
    });
    return;
  }
  const stillNeeded = Math.max(0, provisioned - allocated);
  const summary = `${approx(provisioned)} provisioned, ${approx(allocated)} of it allocated, ${approx(available)} free in ${pool}`;
  if (stillNeeded > available) {
    add({
      check: 'pool',
      severity: 'warning',
      message: `pool overcommitted: ${summary}; filling the volumes needs ${approx(stillNeeded)} more, and writes fail (ENOSPC) once the pool is full`,
      note: `free space on the filesystem of ${pool} (df -h ${pool}), grow it, or move poolDir to a larger one`,
    });
  } else {
    add({ check: 'pool', severity: 'ok', message: summary });
  }
}

/** A word as a POSIX shell reads it back: plain when safe, else single-quoted. */
export function sh(word: string): string {
  // '~' expands only at the start of a word, so latch~loop needs no quotes.
  return /^[\w@%+=:,./-][\w@%+=:,./~-]*$/.test(word) ? word : `'${word.replace(/'/g, `'\\''`)}'`;
}

/** Bytes for people, to three significant digits: 79.4Gi rather than 83253956Ki. */
function approx(bytes: number): string {
  const units = ['', 'Ki', 'Mi', 'Gi', 'Ti', 'Pi', 'Ei'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return unit === 0 ? `${bytes} bytes` : `${value >= 100 ? value.toFixed(0) : value.toFixed(1)}${units[unit]}`;
}

function formatSeconds(seconds: number): string {
  if (!Number.isFinite(seconds)) return 'an unknown time';
  if (seconds < 120) return `${seconds}s`;
  if (seconds < 7200) return `${Math.floor(seconds / 60)}m`;
  return `${Math.floor(seconds / 3600)}h`;
}

// ---- the command --------------------------------------------------------------------------------------------

export function printDoctorReport(report: DoctorReport): void {
  process.stdout.write(
    `latch doctor on node ${report.node ?? '(unknown: no valid configuration)'}${report.config ? ` (configuration: ${report.config})` : ''}\n\n`,
  );
  const rows: string[][] = [];
  for (const f of report.findings) {
    rows.push([f.severity, f.check, f.message]);
    if (f.fix) rows.push(['', '', `fix: ${f.fix}${f.note ? `   # ${f.note}` : ''}`]);
    else if (f.note) rows.push(['', '', `note: ${f.note}`]);
  }
  printTable(['status', 'check', 'finding'], rows);
  const verdict = report.healthy
    ? 'healthy'
    : `${report.errors} error(s), ${report.warnings} warning(s)${report.errors > 0 ? '' : ' (no errors)'}`;
  process.stdout.write(`\n${verdict}\n`);
}

export function registerDoctorCommands(program: Command): void {
  program
    .command('doctor')
    .description('check this node and say, for each finding, which command fixes it')
    .addHelpText(
      'after',
      [
        '',
        'Checks: the tools latch runs, loop device support, the configuration, the plugin dir and the installed',
        'driver, the pool space against the provisioned sizes, and the ledger against the kernel (holds without a',
        'device, loop devices and mounts the ledger does not know, volumes stuck detaching).',
        'Exit status: 0 healthy, 1 with errors (something is broken now), 2 with warnings only.',
      ].join('\n'),
    )
    .option('--plugin-dir <dir>', "kubelet's FlexVolume plugin directory (default: detected, as for install)")
    .option(
      '--stuck-after <seconds>',
      'report a volume detaching for longer than this',
      (v: string) => {
        const n = Number(v);
        if (!Number.isInteger(n) || n < 0) throw new InvalidArgumentError(`--stuck-after must be a whole number of seconds, not "${v}"`);
        return n;
      },
      DEFAULT_STUCK_AFTER_SECONDS,
    )
    .option('-o, --output <format>', 'table or json', parseFormat, 'table')
    .action(async (opts: { pluginDir?: string; stuckAfter: number; output: OutputFormat }) => {
      const report = await runDoctor({
        ...(opts.pluginDir !== undefined && { pluginDir: opts.pluginDir }),
        stuckAfterSeconds: opts.stuckAfter,
      });
      if (opts.output === 'json') printJson(report);
      else printDoctorReport(report);
      process.exitCode = doctorExitCode(report);
    });
}

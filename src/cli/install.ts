// latch install|uninstall: put the running executable where kubelet's FlexVolume prober finds it, and take it away.
//
// kubelet watches the plugin dir and re-creates a driver's plugin (re-running init) on any change of a name that
// does not start with '.', and unregisters it when the file disappears. So the driver is written under a dot-name in
// its own directory, fsynced, made executable and renamed over the old one: kubelet only ever sees a complete file,
// never a missing one, and nothing else is ever written below the plugin dir (PROTOCOL.md "Discovery and install").
import type { Command } from 'commander';
import { createHash, randomBytes } from 'node:crypto';
import { constants } from 'node:fs';
import { lstat, mkdir, open, readdir, readFile, readlink, realpath, rename, rmdir, stat, unlink } from 'node:fs/promises';
import { basename, dirname, isAbsolute, join, normalize, resolve } from 'node:path';
import { loadConfig, type Config } from '../config.js';
import { ConfigError, LatchError, errorMessage } from '../errors.js';
import { nodeHoldsDevice } from '../ledger/arbitrate.js';
import { Ledger } from '../ledger/ledger.js';
import { openStore } from '../store/index.js';
import { formatSize } from '../size.js';
import { listLoopDevices } from '../sys/loop.js';
import { parseFormat, printJson, type OutputFormat } from './output.js';
import { syncDir } from '../sys/files.js';

export const DEFAULT_PLUGIN_DIR = '/usr/libexec/kubernetes/kubelet-plugins/volume/exec';
export const OPENSHIFT_PLUGIN_DIR = '/etc/kubernetes/kubelet-plugins/volume/exec';
export const DEFAULT_DRIVER = 'latch/loop';
const DRIVER_NAME = /^[a-z0-9][a-z0-9.-]*\/[a-z0-9][a-z0-9.-]*$/;
const CHUNK = 1024 * 1024;
/** A temp file of ours this old was left by an install that was killed; the next install removes it. */
const STALE_TEMP_MS = 10 * 60 * 1000;

// ---- where kubelet looks ------------------------------------------------------------------------------------

/** Where detection looks; each can be redirected for tests (and for unusual hosts). */
export interface DetectionPaths {
  /** $LATCH_PROC_ROOT, default /proc: where kubelet's command line is read from. */
  procRoot: string;
  /** $LATCH_OPENSHIFT_PLUGIN_DIR, default /etc/kubernetes/kubelet-plugins/volume/exec. */
  openshiftDir: string;
  /** $LATCH_DEFAULT_PLUGIN_DIR, default /usr/libexec/kubernetes/kubelet-plugins/volume/exec. */
  defaultDir: string;
}

export type PluginDirSource = 'option' | 'env' | 'kubelet-flag' | 'kubelet-config' | 'openshift' | 'default';

export interface PluginDirChoice {
  dir: string;
  source: PluginDirSource;
  /** Why this directory, in words. */
  reason: string;
}

export function detectionPaths(env: NodeJS.ProcessEnv = process.env): DetectionPaths {
  const pick = (value: string | undefined, fallback: string) => (value && value.length > 0 ? value : fallback);
  return {
    procRoot: pick(env.LATCH_PROC_ROOT, '/proc'),
    openshiftDir: pick(env.LATCH_OPENSHIFT_PLUGIN_DIR, OPENSHIFT_PLUGIN_DIR),
    defaultDir: pick(env.LATCH_DEFAULT_PLUGIN_DIR, DEFAULT_PLUGIN_DIR),
  };
}

/** --plugin-dir, else $LATCH_VOLUME_PLUGIN_DIR (set in the DaemonSet), else what kubelet on this host uses. */
export async function choosePluginDir(explicit: string | undefined, env: NodeJS.ProcessEnv = process.env): Promise<PluginDirChoice> {
  if (explicit !== undefined) return { dir: checkDir(explicit, '--plugin-dir'), source: 'option', reason: 'given with --plugin-dir' };
  if (env.LATCH_VOLUME_PLUGIN_DIR) {
    return {
      dir: checkDir(env.LATCH_VOLUME_PLUGIN_DIR, 'LATCH_VOLUME_PLUGIN_DIR'),
      source: 'env',
      reason: 'given in $LATCH_VOLUME_PLUGIN_DIR',
    };
  }
  return detectPluginDir(detectionPaths(env));
}

/**
 * kubelet's plugin dir, in kubelet's own order of precedence: its --volume-plugin-dir flag, then volumePluginDir in
 * its --config file, then (no kubelet setting) the OpenShift 4 directory if it exists, else kubelet's default.
 */
export async function detectPluginDir(paths: DetectionPaths): Promise<PluginDirChoice> {
  const kubelets = await findKubelets(paths.procRoot);
  let why: string;
  const kubelet = kubelets[0];
  if (!kubelet) {
    why = `no kubelet process found in ${paths.procRoot}`;
  } else {
    const who = `kubelet (pid ${kubelet.pid}${kubelets.length > 1 ? `, the first of ${kubelets.length}` : ''})`;
    const flag = flagValue(kubelet.argv, 'volume-plugin-dir');
    if (flag) {
      return {
        dir: checkDir(flag, 'kubelet --volume-plugin-dir'),
        source: 'kubelet-flag',
        reason: `${who} runs with --volume-plugin-dir=${flag}`,
      };
    }
    const configFlag = flagValue(kubelet.argv, 'config');
    if (!configFlag) {
      why = `${who} has neither --volume-plugin-dir nor --config`;
    } else {
      const found = await readKubeletConfig(paths.procRoot, kubelet.pid, configFlag);
      if (found.error) {
        why = `${who} has no --volume-plugin-dir and its config file ${found.path} cannot be read (${found.error})`;
      } else {
        const fromConfig = kubeletConfigPluginDir(found.text ?? '');
        if (fromConfig) {
          return {
            dir: checkDir(fromConfig, `volumePluginDir in ${found.path}`),
            source: 'kubelet-config',
            reason: `volumePluginDir in ${found.path}, the config file of ${who}`,
          };
        }
        why = `${who} has no --volume-plugin-dir and its config file ${found.path} sets no volumePluginDir`;
      }
    }
  }
  if (await isDirectory(paths.openshiftDir)) {
    return { dir: normalize(paths.openshiftDir), source: 'openshift', reason: `${why}; ${paths.openshiftDir} exists (OpenShift 4)` };
  }
  return { dir: normalize(paths.defaultDir), source: 'default', reason: `${why}; using kubelet's default` };
}

interface KubeletProcess {
  pid: number;
  argv: string[];
}

/** Processes named kubelet (by comm or argv[0]), lowest pid first. */
async function findKubelets(procRoot: string): Promise<KubeletProcess[]> {
  let entries: string[];
  try {
    entries = await readdir(procRoot);
  } catch {
    return [];
  }
  const pids = entries
    .filter((e) => /^[0-9]+$/.test(e))
    .map(Number)
    .sort((a, b) => a - b);
  const found: KubeletProcess[] = [];
  for (const pid of pids) {
    let argv: string[];
    try {
      argv = (await readFile(join(procRoot, String(pid), 'cmdline'), 'utf8')).split('\0');
    } catch {
      continue; // gone meanwhile, or a kernel thread we may not read
    }
    if (argv[argv.length - 1] === '') argv.pop();
    let comm = '';
    try {
      comm = (await readFile(join(procRoot, String(pid), 'comm'), 'utf8')).trim();
    } catch {
      // Name from argv[0] alone.
    }
    if (comm === 'kubelet' || (argv[0] !== undefined && basename(argv[0]) === 'kubelet')) found.push({ pid, argv });
  }
  return found;
}

/** The value of a Go flag in an argv: -name=value, --name=value, -name value or --name value (the last one wins). */
export function flagValue(argv: readonly string[], name: string): string | undefined {
  let value: string | undefined;
  for (let i = 1; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === '--') break;
    for (const prefix of [`--${name}`, `-${name}`]) {
      if (arg === prefix && i + 1 < argv.length) value = argv[i + 1];
      else if (arg.startsWith(`${prefix}=`)) value = arg.slice(prefix.length + 1);
    }
  }
  return value === '' ? undefined : value;
}

/**
 * Reads kubelet's config file as kubelet sees it: a relative path is relative to kubelet's working directory, and
 * the file is read through /proc/<pid>/root first, so that detection also works from a container sharing the
 * host's pid namespace.
 */
async function readKubeletConfig(
  procRoot: string,
  pid: number,
  configPath: string,
): Promise<{ path: string; text?: string; error?: string }> {
  let path = configPath;
  if (!isAbsolute(path)) {
    try {
      path = resolve(await readlink(join(procRoot, String(pid), 'cwd')), path);
    } catch {
      path = resolve('/', path);
    }
  }
  const candidates = [join(procRoot, String(pid), 'root', path), path];
  let error = '';
  for (const candidate of candidates) {
    try {
      return { path, text: await readFile(candidate, 'utf8') };
    } catch (err) {
      error ||= errorMessage(err);
    }
  }
  return { path, error };
}

/**
 * volumePluginDir from a KubeletConfiguration file, JSON or YAML. It is a top-level scalar, so a line scan is
 * enough for YAML: no YAML parser in the driver, which every kubelet call loads.
 */
export function kubeletConfigPluginDir(text: string): string | undefined {
  const trimmed = text.trim();
  if (trimmed.startsWith('{')) {
    try {
      const value = (JSON.parse(trimmed) as Record<string, unknown>).volumePluginDir;
      return typeof value === 'string' && value !== '' ? value : undefined;
    } catch {
      // Not JSON after all: YAML flow style is not used for kubelet configs; fall through to the line scan.
    }
  }
  let value: string | undefined;
  for (const line of text.split(/\r?\n/)) {
    const match = /^(?:"volumePluginDir"|'volumePluginDir'|volumePluginDir)\s*:\s*(.*)$/.exec(line);
    if (!match) continue;
    value = yamlScalar(match[1]!);
  }
  return value === '' ? undefined : value;
}

function yamlScalar(raw: string): string {
  const text = raw.trim();
  if (text.startsWith('"')) {
    const end = text.indexOf('"', 1);
    try {
      return JSON.parse(text.slice(0, end + 1)) as string;
    } catch {
      return text.slice(1, end < 0 ? undefined : end);
    }
  }
  if (text.startsWith("'")) {
    const match = /^'((?:[^']|'')*)'/.exec(text);
    return match ? match[1]!.replace(/''/g, "'") : text.slice(1);
  }
  // Plain scalar: a comment starts at " #".
  const comment = text.search(/\s#/);
  return (comment < 0 ? text : text.slice(0, comment)).trim();
}

function checkDir(dir: string, what: string): string {
  if (!isAbsolute(dir) || dir.includes('\0')) throw new LatchError(`${what} ${JSON.stringify(dir)} must be an absolute path`);
  return normalize(dir).replace(/(.)\/+$/, '$1');
}

async function isDirectory(path: string): Promise<boolean> {
  try {
    return (await stat(path)).isDirectory();
  } catch {
    return false;
  }
}

// ---- what is installed --------------------------------------------------------------------------------------

/** `<pluginDir>/<vendor~driver>/<driver>` for a driver name vendor/driver. */
export function driverPath(pluginDir: string, driverName: string): { dir: string; file: string } {
  if (!DRIVER_NAME.test(driverName)) {
    throw new LatchError(`driver name ${JSON.stringify(driverName)} must look like vendor/driver, e.g. latch/loop`);
  }
  const [vendor, driver] = driverName.split('/') as [string, string];
  const dir = join(pluginDir, `${vendor}~${driver}`);
  return { dir, file: join(dir, driver) };
}

/** Whether this process is the self-contained build (a Node single-executable application). */
export function isSingleExecutable(): boolean {
  // Not import(): a single-executable application's main script cannot import() at all (Node 20), so that would
  // always say "no" exactly where the answer matters.
  try {
    const getBuiltin = (process as { getBuiltinModule?: (id: string) => unknown }).getBuiltinModule;
    const sea = (typeof getBuiltin === 'function' ? getBuiltin('node:sea') : require('node:sea')) as { isSea?: () => boolean } | undefined;
    return typeof sea?.isSea === 'function' && sea.isSea();
  } catch {
    return false; // Node before 20.12 has no node:sea, and cannot have built one either
  }
}

/** The file kubelet should run: the SEA binary itself, or the bundle file node was started with. */
export async function runningExecutable(): Promise<{ path: string; selfContained: boolean }> {
  if (isSingleExecutable()) return { path: process.execPath, selfContained: true };
  const script = process.argv[1];
  if (!script) throw new LatchError('cannot tell which file is running: process.argv[1] is empty');
  return { path: await realpath(script), selfContained: false };
}

/** sha256 (hex) and size of a file, read in chunks. */
export async function fileDigest(path: string): Promise<{ sha256: string; size: number }> {
  const hash = createHash('sha256');
  const handle = await open(path, 'r');
  let size = 0;
  try {
    const buffer = Buffer.allocUnsafe(CHUNK);
    for (;;) {
      const { bytesRead } = await handle.read(buffer, 0, CHUNK, null);
      if (bytesRead === 0) break;
      hash.update(buffer.subarray(0, bytesRead));
      size += bytesRead;
    }
  } finally {
    await handle.close();
  }
  return { sha256: hash.digest('hex'), size };
}

export type InstalledState =
  { state: 'missing' } | { state: 'present'; sha256: string; size: number; mode: number } | { state: 'not-a-file'; kind: string };

export async function installedState(file: string): Promise<InstalledState> {
  let info;
  try {
    info = await lstat(file);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return { state: 'missing' };
    throw err;
  }
  if (info.isSymbolicLink()) {
    try {
      info = await stat(file);
    } catch {
      return { state: 'not-a-file', kind: 'a dangling symbolic link' };
    }
  }
  if (!info.isFile()) return { state: 'not-a-file', kind: info.isDirectory() ? 'a directory' : 'not a regular file' };
  const digest = await fileDigest(file);
  return { state: 'present', ...digest, mode: info.mode & 0o7777 };
}

// ---- install ------------------------------------------------------------------------------------------------

export interface InstallOptions {
  pluginDir: string;
  driverName: string;
  /** The executable to install. */
  source: string;
}

export interface InstallResult {
  action: 'installed' | 'upgraded' | 'unchanged';
  path: string;
  sha256: string;
  size: number;
  previousSha256?: string;
}

/**
 * Copies `source` to the driver's path atomically. Same content and mode already there: nothing is written (an
 * unchanged file does not make kubelet re-probe). Otherwise: dot-file in the same directory, write, fsync, chmod
 * 0755, rename over the old file, fsync the directory.
 */
export async function installDriver(options: InstallOptions): Promise<InstallResult> {
  const { dir, file } = driverPath(options.pluginDir, options.driverName);
  const wanted = await fileDigest(options.source);
  const before = await installedState(file);
  if (before.state === 'not-a-file') {
    throw new LatchError(`${file} is ${before.kind}; remove it by hand before installing (kubelet cannot run it anyway)`);
  }
  if (before.state === 'present' && before.sha256 === wanted.sha256 && before.mode === 0o755) {
    return { action: 'unchanged', path: file, ...wanted };
  }

  const created = await mkdir(dir, { recursive: true, mode: 0o755 });
  if (created !== undefined) await syncDir(dirname(dir)); // the new driver directory survives a crash too
  await removeStaleTemps(dir, basename(file));
  const temp = join(dir, `.${basename(file)}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`);
  const copied = await copyTo(options.source, temp);
  try {
    if (copied !== wanted.sha256) {
      throw new LatchError(`${options.source} changed while it was being copied (a build running?); run install again`);
    }
    await rename(temp, file);
  } catch (err) {
    await unlink(temp).catch(() => undefined);
    throw err;
  }
  await syncDir(dir);
  return {
    action: before.state === 'present' ? 'upgraded' : 'installed',
    path: file,
    ...wanted,
    ...(before.state === 'present' && { previousSha256: before.sha256 }),
  };
}

/** Copies into a new file (exclusive create), fsyncs it and makes it 0755; returns the sha256 of what was written. */
async function copyTo(source: string, target: string): Promise<string> {
  const hash = createHash('sha256');
  const input = await open(source, 'r');
  try {
    const output = await open(target, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o700);
    try {
      const buffer = Buffer.allocUnsafe(CHUNK);
      for (;;) {
        const { bytesRead } = await input.read(buffer, 0, CHUNK, null);
        if (bytesRead === 0) break;
        const chunk = buffer.subarray(0, bytesRead);
        hash.update(chunk);
        let written = 0;
        while (written < bytesRead) written += (await output.write(chunk, written, bytesRead - written)).bytesWritten;
      }
      await output.sync();
      await output.chmod(0o755);
    } catch (err) {
      await output.close().catch(() => undefined);
      await unlink(target).catch(() => undefined);
      throw err;
    }
    await output.close();
  } finally {
    await input.close();
  }
  return hash.digest('hex');
}

async function removeStaleTemps(dir: string, driver: string): Promise<void> {
  let names: string[];
  try {
    names = await readdir(dir);
  } catch {
    return;
  }
  const ours = new RegExp(`^\\.${driver.replace(/[.]/g, '\\.')}\\.[0-9]+\\.[0-9a-f]{8}\\.tmp$`);
  for (const name of names.filter((n) => ours.test(n))) {
    try {
      if (Date.now() - (await lstat(join(dir, name))).mtimeMs > STALE_TEMP_MS) await unlink(join(dir, name));
    } catch {
      // Another install removed it or renamed it into place meanwhile.
    }
  }
}

// ---- uninstall ----------------------------------------------------------------------------------------------

export interface NodeHoldings {
  /** "volume (phase)" for every volume whose ledger says this node holds its device. */
  volumes: string[];
  /** "/dev/loopN (image)" for every loop device set up over a pool image. */
  devices: string[];
}

/** What this node still holds, from the ledger and from the kernel: the reasons not to take the driver away. */
export async function nodeHoldings(config: Config): Promise<NodeHoldings> {
  const ledger = new Ledger(await openStore(config));
  const volumes = (await ledger.list())
    .filter((doc) => nodeHoldsDevice(doc, config.nodeName))
    .map((doc) => `${doc.name} (${doc.status.nodes[config.nodeName]?.phase})`);
  let pool: string | undefined;
  try {
    pool = await realpath(config.poolDir);
  } catch {
    pool = undefined;
  }
  const devices =
    pool === undefined
      ? []
      : (await listLoopDevices())
          .filter((d) => dirname(d.backingFile) === pool)
          .map((d) => `${d.device} (${basename(d.backingFile)}${d.deleted ? ', deleted' : ''})`);
  return { volumes, devices };
}

export interface UninstallResult {
  action: 'removed' | 'absent';
  path: string;
  /** The driver's directory could not be removed because something else is in it. */
  leftInDir?: string[];
}

export async function uninstallDriver(options: { pluginDir: string; driverName: string }): Promise<UninstallResult> {
  const { dir, file } = driverPath(options.pluginDir, options.driverName);
  let removed = true;
  try {
    await unlink(file);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    removed = false;
  }
  let leftInDir: string[] | undefined;
  try {
    await rmdir(dir);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOTEMPTY' || code === 'EEXIST') leftInDir = await readdir(dir);
    else if (code !== 'ENOENT') throw err;
  }
  if (removed) await syncDir(options.pluginDir).catch(() => undefined);
  return { action: removed ? 'removed' : 'absent', path: file, ...(leftInDir && { leftInDir }) };
}

// ---- the commands -------------------------------------------------------------------------------------------

/** The driver name: --driver, else the config's driverName, else latch/loop. */
function driverNameFrom(option: string | undefined): { name: string; config?: Config; configError?: string } {
  try {
    const config = loadConfig();
    return { name: option ?? config.driverName, config };
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    return { name: option ?? DEFAULT_DRIVER, configError: err.message };
  }
}

function short(sha256: string): string {
  return sha256.slice(0, 12);
}

export function registerInstallCommands(program: Command): void {
  program
    .command('install')
    .description('install this executable as the FlexVolume driver <plugin dir>/<vendor~driver>/<driver>, atomically')
    .addHelpText(
      'after',
      [
        '',
        'The plugin dir: --plugin-dir, else $LATCH_VOLUME_PLUGIN_DIR, else what kubelet on this host uses:',
        '  1. its --volume-plugin-dir flag (from the command line of the running kubelet)',
        '  2. volumePluginDir in its --config file',
        `  3. ${OPENSHIFT_PLUGIN_DIR}, if it exists (OpenShift 4)`,
        `  4. ${DEFAULT_PLUGIN_DIR} (kubelet's default)`,
        'Installing the same build again changes nothing, so kubelet does not re-probe.',
      ].join('\n'),
    )
    .option('--plugin-dir <dir>', "kubelet's FlexVolume plugin directory (default: detected)")
    .option('--driver <vendor/driver>', 'driver name (default: driverName from the config, else latch/loop)')
    .option('-o, --output <format>', 'table or json', parseFormat, 'table')
    .action(async (opts: { pluginDir?: string; driver?: string; output: OutputFormat }) => {
      const driver = driverNameFrom(opts.driver);
      const choice = await choosePluginDir(opts.pluginDir);
      const source = await runningExecutable();
      const result = await installDriver({ pluginDir: choice.dir, driverName: driver.name, source: source.path });
      if (opts.output === 'json') {
        return printJson({
          pluginDir: choice.dir,
          pluginDirSource: choice.source,
          reason: choice.reason,
          driver: driver.name,
          source: source.path,
          selfContained: source.selfContained,
          ...result,
        });
      }
      const lines = [`plugin dir: ${choice.dir} (${choice.reason})`];
      if (result.action === 'unchanged') {
        lines.push(
          `${result.path} is already this executable (sha256 ${short(result.sha256)}); nothing changed, so kubelet does not re-probe`,
        );
      } else {
        lines.push(
          `${result.action} ${result.path} from ${source.path} (${formatSize(result.size)}, sha256 ${short(result.sha256)}` +
            `${result.previousSha256 ? `, was ${short(result.previousSha256)}` : ''}); kubelet picks it up on its next probe`,
        );
      }
      if (!source.selfContained) {
        lines.push(
          'note: this is the Node.js bundle: kubelet runs it with the `node` on its PATH; hosts without Node.js need the self-contained build (npm run build:sea)',
        );
      }
      if (driver.configError)
        lines.push(`note: configuration not loaded (${driver.configError}); the driver will fail its calls until it is fixed`);
      process.stdout.write(`${lines.join('\n')}\n`);
    });

  program
    .command('uninstall')
    .description("remove the driver from kubelet's plugin dir; refused while this node holds volumes, unless --force")
    .option('--plugin-dir <dir>', "kubelet's FlexVolume plugin directory (default: detected)")
    .option('--driver <vendor/driver>', 'driver name (default: driverName from the config, else latch/loop)')
    .option('--force', 'remove it even though this node still holds volumes (kubelet can then no longer unmount them)')
    .action(async (opts: { pluginDir?: string; driver?: string; force?: boolean }) => {
      const driver = driverNameFrom(opts.driver);
      const choice = await choosePluginDir(opts.pluginDir);
      if (!opts.force) {
        if (!driver.config) {
          throw new LatchError(
            `cannot tell which volumes this node holds: ${driver.configError}; fix the configuration or repeat with --force`,
          );
        }
        const held = await nodeHoldings(driver.config);
        if (held.volumes.length > 0 || held.devices.length > 0) {
          const parts = [];
          if (held.volumes.length > 0) parts.push(`volume(s) ${held.volumes.join(', ')} in the ledger`);
          if (held.devices.length > 0) parts.push(`loop device(s) ${held.devices.join(', ')} of the pool ${driver.config.poolDir}`);
          throw new LatchError(
            `refusing to uninstall: node ${driver.config.nodeName} still holds ${parts.join(' and ')}. Without the driver ` +
              `kubelet cannot unmount or detach them. Drain the node first (kubectl drain ${driver.config.nodeName}), ` +
              'or repeat with --force',
          );
        }
      }
      const result = await uninstallDriver({ pluginDir: choice.dir, driverName: driver.name });
      const lines = [`plugin dir: ${choice.dir} (${choice.reason})`];
      lines.push(result.action === 'removed' ? `removed ${result.path}` : `${result.path} is not installed; nothing to do`);
      if (result.leftInDir) lines.push(`left ${dirname(result.path)} in place: it also holds ${result.leftInDir.join(', ')}`);
      process.stdout.write(`${lines.join('\n')}\n`);
    });
}

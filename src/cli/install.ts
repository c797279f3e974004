// latch install: put the running executable where kubelet's FlexVolume prober finds it.
//
// kubelet watches the plugin dir and re-creates a driver's plugin (re-running init) on any change of a name that
// does not start with '.', and unregisters it when the file disappears. So the driver is written under a dot-name in
// its own directory, fsynced, made executable and renamed over the old one: kubelet only ever sees a complete file,
// never a missing one, and nothing else is ever written below the plugin dir but what the driver needs beside it,
// under the dot-name .latch: the runtime of the self-contained build and, when asked, the configuration
// (host/beside-driver.ts; docs/protocol.md, "Discovery and install").
import { createHash } from 'node:crypto';
import { constants } from 'node:fs';
import { access, lstat, mkdir, open, readdir, stat, unlink } from 'node:fs/promises';
import type { FileHandle } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { LatchError } from '../errors.js';
import type { Config } from '../config.js';
import {
  prepareConfigBeside,
  writeConfigBeside,
  installRuntime,
  planRuntime,
  pruneBesideDir,
  runtimeBeside,
  runtimeNamedBy,
  withDriverDirLock,
} from '../host/beside-driver.js';
import { CHUNK, driverPath, fileDigest, installedState, isLatchDriver, runningExecutable, shortDigest } from '../host/driver-file.js';
import { applyEdits, type ByteEdit } from '../host/elf.js';
import { choosePluginDir } from '../host/plugin-dir.js';
import type { Preset } from '../host/presets.js';
import { formatSize } from '../size.js';
import { leftoverOf, syncDir, writeFileAtomic } from '../atomic-file.js';
import { reloadPageCache, type PageCacheReload } from '../sys/page-cache.js';
import { driverNameFrom } from './driver-name.js';
import type { CommandIO } from './io.js';
import { formatJson, type OutputFormat } from './output.js';

/** A temp file of ours this old was left by an install that was killed; the next install removes it. */
const STALE_TEMP_MS = 10 * 60 * 1000;

export interface InstallOptions {
  pluginDir?: string;
  /** --preset: a distribution's plugin dir (src/host/presets.ts). */
  preset?: Preset;
  /** --host-root: the host's / is mounted there (the DaemonSet's pod); detect and write the host's plugin dir under it. */
  hostRoot?: string;
  driver?: string;
  /** The plugin dir as kubelet and kube-controller-manager see it, where it differs from --plugin-dir. */
  pluginDirSeenAs?: string;
  /** Also write the configuration (and the etcd client's files) beside the driver, for a containerized KCM. */
  configBesideDriver?: boolean;
  output: OutputFormat;
}

export async function install(options: InstallOptions, io: CommandIO): Promise<void> {
  const driver = driverNameFrom(options.driver, io);
  const choice = await choosePluginDir(options.pluginDir, io.env, {
    ...(options.preset && { preset: options.preset }),
    ...(options.hostRoot !== undefined && { hostRoot: options.hostRoot }),
  });
  const source = await runningExecutable();
  if (options.configBesideDriver && !driver.config) {
    throw new LatchError(`--config-beside-driver: the configuration does not load (${driver.configError}); fix it first`);
  }
  const runtime = source.selfContained ? runtimeBeside(source.path) : undefined;
  const hasRuntime = runtime !== undefined && (await isDirectory(runtime));
  // Under --host-root the driver is written at the host's path as this process sees it; what it names inside (its
  // runtime) must be the host's own path.
  const seenAs = options.pluginDirSeenAs ?? (choice.localDir !== choice.dir ? choice.dir : undefined);
  const result = await installDriver({
    pluginDir: choice.localDir,
    driverName: driver.name,
    source: source.path,
    ...(hasRuntime && { runtime }),
    ...(seenAs !== undefined && { pluginDirSeenAs: seenAs }),
    ...(options.configBesideDriver && driver.config && { configBeside: driver.config }),
    reloadPageCache: source.selfContained,
  });
  if (options.output === 'json') {
    io.out(
      formatJson({
        pluginDir: choice.dir,
        pluginDirSource: choice.source,
        reason: choice.reason,
        driver: driver.name,
        source: source.path,
        selfContained: source.selfContained,
        ...result,
      }),
    );
    return;
  }
  const lines = [`plugin dir: ${choice.dir} (${choice.reason})`];
  if (result.action === 'unchanged') {
    lines.push(
      `${result.path} is already this executable (sha256 ${shortDigest(result.sha256)}); nothing changed, so kubelet does not re-probe`,
    );
  } else {
    lines.push(
      `${result.action} ${result.path} from ${source.path} (${formatSize(result.size)}, sha256 ${shortDigest(result.sha256)}` +
        `${result.previousSha256 ? `, was ${shortDigest(result.previousSha256)}` : ''}); kubelet picks it up on its next probe`,
    );
  }
  if (result.runtime)
    lines.push(`the driver runs with the loader and libraries in ${result.runtime}: it needs nothing outside the plugin dir`);
  if (result.pageCache?.reloaded === false) {
    lines.push(`note: the driver's page cache was not reloaded (${result.pageCache.reason}); its calls start as they did before`);
  }
  if (result.config)
    lines.push(`wrote the configuration beside the driver: ${[result.config, ...(result.configFiles ?? [])].join(', ')} (0600)`);
  if (source.selfContained && !hasRuntime) {
    lines.push(
      `note: no runtime beside ${source.path} (${runtime}): the driver uses the host's glibc and libstdc++, and its native helper from where it was built, ` +
        'so a kube-controller-manager in a distroless container cannot run it, nor any host where that build is gone',
    );
  }
  if (!source.selfContained) {
    lines.push(
      'note: this is the Node.js bundle: kubelet runs it with the `node` on its PATH; hosts without Node.js need the self-contained build (npm run build:sea)',
    );
  }
  if (driver.configError)
    lines.push(`note: configuration not loaded (${driver.configError}); the driver will fail its calls until it is fixed`);
  io.out(`${lines.join('\n')}\n`);
}

export interface InstallDriverOptions {
  pluginDir: string;
  driverName: string;
  /** The executable to install. */
  source: string;
  /** The runtime of a self-contained build (`<source>.runtime`): installed beside the driver, and the driver pointed at it. */
  runtime?: string;
  /** The plugin dir as kubelet and kube-controller-manager see it (default: pluginDir). */
  pluginDirSeenAs?: string;
  /** Write this configuration beside the driver too. */
  configBeside?: Config;
  /**
   * Reload the page cache of the driver and its runtime, whether written now or not (a self-contained build: every
   * call maps them; src/sys/page-cache.ts).
   */
  reloadPageCache?: boolean;
}

export interface InstallResult {
  action: 'installed' | 'upgraded' | 'unchanged';
  path: string;
  sha256: string;
  size: number;
  previousSha256?: string;
  /** The runtime directory beside the driver that it runs with. */
  runtime?: string;
  /** The configuration written beside the driver, and the files it names. */
  config?: string;
  configFiles?: string[];
  /** Whether the driver's page cache was reloaded, with reloadPageCache. */
  pageCache?: PageCacheReload;
}

/**
 * Copies `source` to the driver's path atomically. Same content and mode already there: nothing is written (an
 * unchanged file does not make kubelet re-probe). Otherwise written atomically, 0755 (atomic-file.ts): under a
 * dot-name that kubelet's prober ignores, renamed over the old file.
 */
export async function installDriver(options: InstallDriverOptions): Promise<InstallResult> {
  return withDriverDirLock(driverPath(options.pluginDir, options.driverName).dir, async () => {
    const result = await installLocked(options);
    if (!options.reloadPageCache) return result;
    // Also when nothing changed: this is what runs on every start of the DaemonSet's pod, so after each reboot, when
    // kubelet's first calls have faulted the driver into the page cache in 4 KiB pieces.
    const { runtime } = result;
    const libraries = runtime === undefined ? [] : (await readdir(runtime)).sort().map((name) => join(runtime, name));
    return { ...result, pageCache: await reloadPageCache([result.path, ...libraries]) };
  });
}

async function installLocked(options: InstallDriverOptions): Promise<InstallResult> {
  const { dir, file } = driverPath(options.pluginDir, options.driverName);
  const seenAsDir = driverPath(options.pluginDirSeenAs ?? options.pluginDir, options.driverName).dir;
  const runtime = options.runtime !== undefined ? await planRuntime(options.source, options.runtime, dir, seenAsDir) : undefined;
  const configBeside = options.configBeside && (await prepareConfigBeside(options.configBeside));
  const edits = runtime?.edits ?? [];
  const wanted = await fileDigest(options.source, edits);
  const before = await installedState(file);
  if (before.state === 'not-a-file') {
    throw new LatchError(`${file} is ${before.kind}; remove it by hand before installing (kubelet cannot run it anyway)`);
  }
  if (before.state === 'present' && before.sha256 !== wanted.sha256 && !(await isLatchDriver(file))) {
    throw new LatchError(
      `${file} is not a latch driver (another vendor's driver named ${options.driverName}?); refusing to replace it. ` +
        'Install latch under another name (--driver vendor/name), or remove that file by hand if it is yours to replace',
    );
  }
  const created = await mkdir(dir, { recursive: true, mode: 0o755 }).catch(async (err: unknown) => {
    throw await unwritable(options.pluginDir, err);
  });
  if (created !== undefined) await syncDir(dirname(dir)); // the new driver directory survives a crash too
  // What the driver needs before the driver: the configuration beside it (rewritten only when it changed), the
  // runtime it will name (an intact one is left alone, a damaged one repaired).
  const config = configBeside && (await writeConfigBeside(dir, configBeside));
  if (runtime) await installRuntime(runtime);
  const extras = {
    ...(runtime && { runtime: runtime.installedDir }),
    ...(config && { config: config.path, configFiles: config.files }),
  };
  if (before.state === 'present' && before.sha256 === wanted.sha256 && before.mode === 0o755) {
    return { action: 'unchanged', path: file, ...wanted, ...extras };
  }

  await removeStaleTemps(dir, basename(file));
  // The runtime the replaced driver names stays until the next install: a call of it may be starting right now.
  const previousRuntime = before.state === 'present' ? await runtimeNamedBy(file, seenAsDir) : undefined;
  await writeFileAtomic(
    file,
    async (output) => {
      if ((await copyTo(options.source, output, edits)) !== wanted.sha256) {
        throw new LatchError(`${options.source} changed while it was being copied (a build running?); run install again`);
      }
    },
    { mode: 0o755 },
  );
  const keep = [runtime && basename(runtime.installedDir), previousRuntime].filter((n): n is string => n !== undefined);
  await pruneBesideDir(dir, keep);
  return {
    action: before.state === 'present' ? 'upgraded' : 'installed',
    path: file,
    ...wanted,
    ...(before.state === 'present' && { previousSha256: before.sha256 }),
    ...extras,
  };
}

/** Copies `source` into `output`, with the edits applied; returns the sha256 of what was written. */
async function copyTo(source: string, output: FileHandle, edits: readonly ByteEdit[]): Promise<string> {
  const hash = createHash('sha256');
  const input = await open(source, 'r');
  try {
    const buffer = Buffer.allocUnsafe(CHUNK);
    let position = 0;
    for (;;) {
      const { bytesRead } = await input.read(buffer, 0, CHUNK, null);
      if (bytesRead === 0) break;
      const chunk = buffer.subarray(0, bytesRead);
      applyEdits(chunk, position, edits);
      position += bytesRead;
      hash.update(chunk);
      let written = 0;
      while (written < bytesRead) written += (await output.write(chunk, written, bytesRead - written)).bytesWritten;
    }
  } finally {
    await input.close();
  }
  return hash.digest('hex');
}

/** Why the driver's directory cannot be made, in words: a read-only plugin dir gets the advice it needs. */
async function unwritable(pluginDir: string, err: unknown): Promise<LatchError> {
  let existing = pluginDir;
  while (!(await isDirectory(existing)) && dirname(existing) !== existing) existing = dirname(existing);
  const code = await access(existing, constants.W_OK).then(
    () => (err as NodeJS.ErrnoException).code ?? String(err),
    (e: NodeJS.ErrnoException) => e.code ?? String(e),
  );
  const readOnly = code === 'EROFS' ? ' (a read-only file system: on Flatcar or Fedora CoreOS, /usr is)' : '';
  return new LatchError(
    `cannot install into the plugin dir ${pluginDir}: ${existing} is not writable${readOnly}, ${code}. Nothing was installed. ` +
      'Give kubelet (--volume-plugin-dir) and kube-controller-manager (--flex-volume-plugin-dir) a writable directory, ' +
      'e.g. /var/lib/kubelet/volumeplugins, and install there with --plugin-dir',
  );
}

async function isDirectory(path: string): Promise<boolean> {
  try {
    return (await stat(path)).isDirectory();
  } catch {
    return false;
  }
}

async function removeStaleTemps(dir: string, driver: string): Promise<void> {
  let names: string[];
  try {
    names = await readdir(dir);
  } catch {
    return;
  }
  for (const name of names.filter((n) => leftoverOf(n)?.name === driver)) {
    try {
      if (Date.now() - (await lstat(join(dir, name))).mtimeMs > STALE_TEMP_MS) await unlink(join(dir, name));
    } catch {
      // Another install removed it or renamed it into place meanwhile.
    }
  }
}

// latch install: put the running executable where kubelet's FlexVolume prober finds it.
//
// kubelet watches the plugin dir and re-creates a driver's plugin (re-running init) on any change of a name that
// does not start with '.', and unregisters it when the file disappears. So the driver is written under a dot-name in
// its own directory, fsynced, made executable and renamed over the old one: kubelet only ever sees a complete file,
// never a missing one, and nothing else is ever written below the plugin dir (docs/protocol.md, "Discovery and install").
import { createHash, randomBytes } from 'node:crypto';
import { constants } from 'node:fs';
import { lstat, mkdir, open, readdir, rename, unlink } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { LatchError } from '../errors.js';
import { CHUNK, driverPath, fileDigest, installedState, runningExecutable, shortDigest } from '../host/driver-file.js';
import { choosePluginDir } from '../host/plugin-dir.js';
import type { Preset } from '../host/presets.js';
import { formatSize } from '../size.js';
import { syncDir } from '../sys/files.js';
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
  output: OutputFormat;
}

export async function install(options: InstallOptions, io: CommandIO): Promise<void> {
  const driver = driverNameFrom(options.driver, io);
  const choice = await choosePluginDir(options.pluginDir, io.env, {
    ...(options.preset && { preset: options.preset }),
    ...(options.hostRoot !== undefined && { hostRoot: options.hostRoot }),
  });
  const source = await runningExecutable();
  const result = await installDriver({ pluginDir: choice.localDir, driverName: driver.name, source: source.path });
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
export async function installDriver(options: InstallDriverOptions): Promise<InstallResult> {
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

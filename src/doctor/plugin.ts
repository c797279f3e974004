// doctor: the plugin dir kubelet reads, the driver installed in it, and whether kubelet can run that driver.
import { open, readdir, stat } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { BESIDE_DRIVER_DIR, type Config } from '../config.js';
import { DEFAULT_DRIVER_NAME } from '../names.js';
import { missingRuntime, sameBuild } from '../host/beside-driver.js';
import { errorMessage } from '../errors.js';
import {
  driverPath,
  fileDigest,
  installedState,
  isLatchDriver,
  runningExecutable,
  shortDigest,
  type InstalledState,
} from '../host/driver-file.js';
import { choosePluginDir } from '../host/plugin-dir.js';
import { findTool, toolSearchPath } from '../sys/run.js';
import { sh, type AddFinding } from './findings.js';

export interface PluginCheckOptions {
  /** --plugin-dir; otherwise $LATCH_VOLUME_PLUGIN_DIR or detection, as for install. */
  pluginDir?: string;
  /** The executable the installed driver is compared with (default: the one running). */
  self?: string;
}

export async function checkPlugin(
  config: Config | undefined,
  options: PluginCheckOptions,
  env: NodeJS.ProcessEnv,
  add: AddFinding,
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
  const driverName = config?.driverName ?? DEFAULT_DRIVER_NAME;
  const installFix = `latch install${dirOption}${driverName !== DEFAULT_DRIVER_NAME ? ` --driver ${driverName}` : ''}`;
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
  await checkDriver(file, installed, { driverName, installFix, self: options.self }, add);
  if (installed.state === 'present') await checkInterpreter(file, env, add);
  if (installed.state === 'present') {
    const missing = await missingRuntime(file, dir);
    if (missing) {
      add({
        check: 'driver',
        severity: 'error',
        message: `${file} names the loader ${missing} beside it, which is not there: the driver cannot start`,
        fix: installFix,
        note: 'with the self-contained build and bin/latch-sea.runtime beside it',
      });
    }
  }

  let names: string[] = [];
  try {
    names = await readdir(dir);
  } catch {
    names = [];
  }
  // .latch holds what install put beside the driver: its runtime and configuration (checked by the kcm check).
  for (const name of names.filter((n) => n !== basename(file) && n !== BESIDE_DRIVER_DIR)) {
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

/** The installed driver: present, executable, and the same build as this one. */
async function checkDriver(
  file: string,
  installed: InstalledState,
  { driverName, installFix, self: selfPath }: { driverName: string; installFix: string; self: string | undefined },
  add: AddFinding,
): Promise<void> {
  if (installed.state === 'missing') {
    add({
      check: 'driver',
      severity: 'error',
      message: `${file} is not installed: kubelet does not know the driver ${driverName}`,
      fix: installFix,
    });
    return;
  }
  if (installed.state === 'not-a-file') {
    add({
      check: 'driver',
      severity: 'error',
      message: `${file} is ${installed.kind}: kubelet cannot run it`,
      fix: `rm -r ${sh(file)} && ${installFix}`,
    });
    return;
  }
  let self: { sha256: string; path: string } | undefined;
  try {
    const path = selfPath ?? (await runningExecutable()).path;
    self = { path, sha256: (await fileDigest(path)).sha256 };
  } catch {
    self = undefined;
  }
  const installedSha = shortDigest(installed.sha256);
  if ((installed.mode & 0o111) !== 0o111) {
    add({ check: 'driver', severity: 'error', message: `${file} is not executable (mode ${installed.mode.toString(8)})`, fix: installFix });
  } else if (self === undefined) {
    add({ check: 'driver', severity: 'ok', message: `${file} is installed (sha256 ${installedSha})` });
  } else if (self.sha256 === installed.sha256) {
    add({ check: 'driver', severity: 'ok', message: `${file} is installed and identical to ${self.path} (sha256 ${installedSha})` });
  } else if (await sameBuild(self.path, file)) {
    add({
      check: 'driver',
      severity: 'ok',
      message: `${file} is installed and identical to ${self.path}, pointed at the runtime beside it (sha256 ${installedSha})`,
    });
  } else if (!(await isLatchDriver(file))) {
    add({
      check: 'driver',
      severity: 'error',
      message: `${file} is not a latch driver: another vendor's driver has the name ${driverName}, and kubelet runs it for latch's volumes`,
      fix: `latch install --driver vendor/another-name`,
      note: 'and use that driver name in the PVs; or remove the other driver if it is not in use',
    });
  } else {
    add({
      check: 'driver',
      severity: 'warning',
      message: `${file} (sha256 ${installedSha}) differs from ${self.path} (sha256 ${shortDigest(self.sha256)}): kubelet runs another build than this one`,
      fix: installFix,
      note: 'with the build you want kubelet to run',
    });
  }
}

/** The Node.js bundle needs `node` wherever kubelet runs it; the self-contained build needs nothing. */
async function checkInterpreter(file: string, env: NodeJS.ProcessEnv, add: AddFinding): Promise<void> {
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
  const line = (head.slice(2).split('\n')[0] ?? '').trim();
  const words = line.split(/\s+/);
  const interpreter = words[0] && basename(words[0]) === 'env' ? words[1] : words[0];
  if (!interpreter) return;
  const found = interpreter.startsWith('/')
    ? findTool(basename(interpreter), [dirname(interpreter)])
    : findTool(interpreter, toolSearchPath(env));
  if (found) return;
  add({
    check: 'driver',
    severity: 'error',
    message: `${file} is the Node.js bundle (#!${line}) but ${interpreter} is not found: kubelet cannot run it`,
    fix: 'npm run build:sea && bin/latch-sea install',
    note: 'installs the self-contained build, which needs no Node.js; or install Node.js 20 on the host',
  });
}

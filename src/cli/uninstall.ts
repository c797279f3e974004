// latch uninstall: take the driver out of kubelet's plugin dir; refused while this node holds volumes, because
// without the driver kubelet can no longer unmount or detach them.
import { readdir, rmdir, unlink } from 'node:fs/promises';
import { basename, dirname } from 'node:path';
import { LatchError } from '../errors.js';
import { removeBesideDir, withDriverDirLock } from '../host/beside-driver.js';
import { driverPath } from '../host/driver-file.js';
import { inventory } from '../host/inventory.js';
import { choosePluginDir } from '../host/plugin-dir.js';
import { syncDir } from '../atomic-file.js';
import { driverNameFrom } from './driver-name.js';
import type { CommandIO } from './io.js';

export interface UninstallOptions {
  pluginDir?: string;
  driver?: string;
  /** Remove it even though this node still holds volumes. */
  force?: boolean;
}

export async function uninstall(options: UninstallOptions, io: CommandIO): Promise<void> {
  const driver = driverNameFrom(options.driver, io);
  const choice = await choosePluginDir(options.pluginDir, io.env);
  if (!options.force) {
    const config = driver.config;
    if (!config) {
      throw new LatchError(
        `cannot tell which volumes this node holds: ${driver.configError}; fix the configuration or repeat with --force`,
      );
    }
    const held = await inventory(io.context(config).ledger, config);
    if (held.holds.length > 0 || held.devices.length > 0 || held.damaged.length > 0) {
      const parts = [];
      if (held.holds.length > 0) {
        const volumes = held.holds.map((doc) => `${doc.name} (${doc.status.nodes[config.nodeName]?.phase})`);
        parts.push(`volume(s) ${volumes.join(', ')} in the ledger`);
      }
      if (held.devices.length > 0) {
        const devices = held.devices.map((d) => `${d.device} (${basename(d.backingFile)}${d.deleted ? ', deleted' : ''})`);
        parts.push(`loop device(s) ${devices.join(', ')} of the pool ${config.poolDir}`);
      }
      if (held.damaged.length > 0) {
        // A document that cannot be read may hold a volume here.
        parts.push(`perhaps volume(s) ${held.damaged.map((d) => d.name).join(', ')}, whose ledger documents cannot be read`);
      }
      throw new LatchError(
        `refusing to uninstall: node ${config.nodeName} still holds ${parts.join(' and ')}. Without the driver ` +
          `kubelet cannot unmount or detach them. Drain the node first (kubectl drain ${config.nodeName}), ` +
          'or repeat with --force',
      );
    }
  }
  const result = await uninstallDriver({ pluginDir: choice.dir, driverName: driver.name });
  const lines = [`plugin dir: ${choice.dir} (${choice.reason})`];
  lines.push(result.action === 'removed' ? `removed ${result.path}` : `${result.path} is not installed; nothing to do`);
  if (result.leftInDir) lines.push(`left ${dirname(result.path)} in place: it also holds ${result.leftInDir.join(', ')}`);
  io.out(`${lines.join('\n')}\n`);
}

export interface UninstallResult {
  action: 'removed' | 'absent';
  path: string;
  /** The driver's directory could not be removed because something else is in it. */
  leftInDir?: string[];
}

export async function uninstallDriver(options: { pluginDir: string; driverName: string }): Promise<UninstallResult> {
  return withDriverDirLock(driverPath(options.pluginDir, options.driverName).dir, () => uninstallLocked(options));
}

async function uninstallLocked(options: { pluginDir: string; driverName: string }): Promise<UninstallResult> {
  const { dir, file } = driverPath(options.pluginDir, options.driverName);
  let removed = true;
  try {
    await unlink(file);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    removed = false;
  }
  // What was installed beside it goes after the driver: kubelet has let go of the driver by then.
  await removeBesideDir(dir);
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

// doctor, on a control-plane node: can kube-controller-manager run the driver? In attach mode KCM calls attach,
// isattached and detach itself. On kubeadm, RKE2, OpenShift and most control planes it runs in a distroless
// container (no shell, no glibc, no /etc/latch) that sees the plugin dir mounted at its --flex-volume-plugin-dir
// (default /usr/libexec/kubernetes/kubelet-plugins/volume/exec), and nothing else of the host. This check looks at
// that directory as KCM sees it (through /proc/<pid>/root), the configuration KCM would read, and makes a trial
// `init` in an empty root holding only the driver's directory, the way that container runs it.
import { open, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { DEFAULT_CONFIG_PATH, loadConfig, type Config } from '../config.js';
import { DEFAULT_DRIVER_NAME } from '../names.js';
import { errorMessage } from '../errors.js';
import { driverPath, installedState } from '../host/driver-file.js';
import { callInEmptyRoot, emptyRootWith } from '../host/empty-root.js';
import { DEFAULT_PLUGIN_DIR, flagValue } from '../host/plugin-dir.js';
import { findProcesses, type HostProcess } from '../host/processes.js';
import { sh, type AddFinding } from './findings.js';

const CHECK = 'kcm';

export interface ControllerManagerCheckOptions {
  /** Make the trial `init` (needs root for chroot); default true. */
  trial?: boolean;
}

/** kube-controller-manager itself, or hyperkube running it; comm is cut to 15 characters by the kernel. */
function isControllerManager(p: HostProcess): boolean {
  const name = p.argv[0]?.split('/').pop();
  if (name === 'kube-controller-manager') return true;
  if (name === 'hyperkube' && ['kube-controller-manager', 'controller-manager'].includes(p.argv[1] ?? '')) return true;
  return p.comm === 'kube-controller' && name === undefined;
}

export async function checkControllerManager(
  config: Config | undefined,
  env: NodeJS.ProcessEnv,
  add: AddFinding,
  options: ControllerManagerCheckOptions = {},
): Promise<void> {
  if (config && !config.attach) return; // in non-attach mode KCM never calls the driver
  const procRoot = env.LATCH_PROC_ROOT || '/proc';
  const [kcm, ...others] = await findProcesses(procRoot, isControllerManager);
  if (!kcm) return; // not a control-plane node (or KCM is not visible from here): nothing to say
  const who = `kube-controller-manager (pid ${kcm.pid}${others.length > 0 ? `, the first of ${others.length + 1}` : ''})`;

  const controllers = flagValue(kcm.argv, 'controllers');
  if (controllers?.split(',').includes('-attachdetach')) {
    add({
      check: CHECK,
      severity: 'ok',
      message: `${who} runs without its attach/detach controller (--controllers=${controllers}): kubelet attaches and detaches on each node`,
    });
    return;
  }
  const flag = flagValue(kcm.argv, 'flex-volume-plugin-dir');
  const pluginDir = flag ?? DEFAULT_PLUGIN_DIR;
  const whence = flag ? `its --flex-volume-plugin-dir` : `its default; it has no --flex-volume-plugin-dir`;
  const kcmRoot = join(procRoot, String(kcm.pid), 'root');
  const containerized = !(await sameDirectory(kcmRoot, '/'));
  const driverName = config?.driverName ?? DEFAULT_DRIVER_NAME;
  const { dir, file } = driverPath(pluginDir, driverName);
  const seen = (path: string) => join(kcmRoot, path); // a path as KCM sees it, read from here
  const where = containerized ? "in KCM's container" : 'on this host';
  const installFix =
    `latch install --plugin-dir ${sh(pluginDir)}` +
    `${driverName !== DEFAULT_DRIVER_NAME ? ` --driver ${driverName}` : ''}${containerized ? ' --config-beside-driver' : ''}`;
  const installNote =
    'with the self-contained build (bin/latch-sea, bin/latch-sea.runtime beside it)' +
    (containerized
      ? `; --plugin-dir is the host directory mounted at ${pluginDir} in KCM's container (add --plugin-dir-seen-as ${sh(pluginDir)} if it differs)`
      : '');

  const installed = await installedState(seen(file));
  if (installed.state !== 'present') {
    add({
      check: CHECK,
      severity: 'error',
      message:
        `${who} looks for FlexVolume drivers in ${pluginDir} (${whence}) and finds ${installed.state === 'missing' ? 'no' : 'an unusable'} ` +
        `${file} ${where}: it cannot attach or detach latch volumes`,
      fix: installFix,
      note: installNote,
    });
    return;
  }
  if ((await head(seen(file))).startsWith('#!')) {
    add({
      check: CHECK,
      severity: 'error',
      message: `${file} ${where} is the Node.js bundle: KCM ${containerized ? 'has no node in its container' : 'needs node on its PATH'}`,
      fix: installFix,
      note: installNote,
    });
    return;
  }
  add({ check: CHECK, severity: 'ok', message: `${who} finds the driver ${file} (${whence}) ${where}` });

  // The configuration KCM reads: its own /etc/latch/config.json, else the one beside the driver.
  let kcmConfig: Config | undefined;
  try {
    kcmConfig = loadConfig({}, { defaultPath: seen(DEFAULT_CONFIG_PATH), driverFile: seen(file) });
  } catch (err) {
    add({
      check: CHECK,
      severity: 'error',
      message: `KCM would fail every call: ${errorMessage(err)}`,
      fix: installFix,
      note: installNote,
    });
  }
  if (kcmConfig?.source === 'built-in defaults' && config && config.source !== 'built-in defaults') {
    add({
      check: CHECK,
      severity: 'error',
      message:
        `KCM sees no configuration ${where} (neither ${DEFAULT_CONFIG_PATH} nor ${join(dir, '.latch/config.json')}): ` +
        `it would keep a ledger of its own instead of this cluster's`,
      fix: installFix,
      note: installNote,
    });
  } else if (kcmConfig && config && JSON.stringify(storeOf(kcmConfig)) !== JSON.stringify(storeOf(config))) {
    add({
      check: CHECK,
      severity: 'warning',
      message: `KCM's configuration (${kcmConfig.source}) names another ledger than this node's (${config.source})`,
      fix: installFix,
      note: "writes this node's configuration beside the driver",
    });
  } else if (kcmConfig) {
    add({ check: CHECK, severity: 'ok', message: `KCM reads its configuration from ${kcmConfig.source.replace(kcmRoot, '')}` });
  }

  if (options.trial !== false) await trialInit(seen(dir), dir, file, installFix, installNote, add);
}

/** The store as it decides which ledger a call reaches (the TLS files may sit at other paths). */
function storeOf(config: Config): unknown {
  return config.store.type === 'etcd' ? { type: 'etcd', endpoints: config.store.endpoints, prefix: config.store.prefix } : config.store;
}

async function trialInit(viewDir: string, dir: string, file: string, fix: string, note: string, add: AddFinding): Promise<void> {
  if (process.getuid?.() !== 0) {
    add({ check: CHECK, severity: 'warning', message: 'no trial init in an empty root: it needs root (chroot)', fix: 'sudo latch doctor' });
    return;
  }
  let root;
  try {
    root = await emptyRootWith(viewDir, dir, file);
    const result = await callInEmptyRoot(root, ['init'], 30_000);
    const reply = parseReply(result.stdout);
    if (reply?.status === 'Success' && result.stderr === '') {
      add({
        check: CHECK,
        severity: 'ok',
        message: `a trial init in an empty root holding only ${dir} (no /lib, /usr, /etc, /proc), as KCM's container runs it, answered Success`,
      });
    } else {
      const said = `${result.stdout}${result.stderr}`.trim().slice(-300) || `exit ${result.exitCode}`;
      add({ check: CHECK, severity: 'error', message: `a trial init in an empty root holding only ${dir} failed: ${said}`, fix, note });
    }
  } catch (err) {
    add({
      check: CHECK,
      severity: 'error',
      message: `a trial init in an empty root holding only ${dir} failed: ${errorMessage(err)}`,
      fix,
      note,
    });
  } finally {
    await root?.remove();
  }
}

function parseReply(stdout: string): { status?: string } | undefined {
  try {
    return JSON.parse(stdout) as { status?: string };
  } catch {
    return undefined;
  }
}

async function sameDirectory(a: string, b: string): Promise<boolean> {
  try {
    const [x, y] = await Promise.all([stat(a), stat(b)]);
    return x.dev === y.dev && x.ino === y.ino;
  } catch {
    return false;
  }
}

async function head(file: string): Promise<string> {
  const handle = await open(file, 'r');
  try {
    const buffer = Buffer.alloc(2);
    const { bytesRead } = await handle.read(buffer, 0, 2, 0);
    return buffer.subarray(0, bytesRead).toString('latin1');
  } finally {
    await handle.close();
  }
}

// Where kubelet looks for FlexVolume drivers on this host: --plugin-dir or --preset, $LATCH_VOLUME_PLUGIN_DIR, else
// kubelet's own setting read from its command line and config file, else the OpenShift 4 or the kubelet default
// directory. With a host root (the DaemonSet's pod, which mounts the host's / there and shares its pid namespace)
// the same detection reads the host's files under that root and says where the host's directory is reached.
import { findProcesses } from './processes.js';
import { readdir, readFile, readlink, stat } from 'node:fs/promises';
import { basename, isAbsolute, join, normalize, resolve } from 'node:path';
import { LatchError, errorMessage } from '../errors.js';

export const DEFAULT_PLUGIN_DIR = '/usr/libexec/kubernetes/kubelet-plugins/volume/exec';
export const OPENSHIFT_PLUGIN_DIR = '/etc/kubernetes/kubelet-plugins/volume/exec';

/** Where detection looks; each can be redirected for tests (and for unusual hosts). */
export interface DetectionPaths {
  /** $LATCH_PROC_ROOT, default /proc: where kubelet's command line is read from. */
  procRoot: string;
  /** $LATCH_OPENSHIFT_PLUGIN_DIR, default /etc/kubernetes/kubelet-plugins/volume/exec. */
  openshiftDir: string;
  /** $LATCH_DEFAULT_PLUGIN_DIR, default /usr/libexec/kubernetes/kubelet-plugins/volume/exec. */
  defaultDir: string;
  /** --host-root: the host's files (kubelet's config file, the OpenShift directory) are read under it. */
  hostRoot?: string;
}

type PluginDirSource = 'option' | 'preset' | 'env' | 'kubelet-flag' | 'kubelet-config' | 'openshift' | 'default';

export interface PluginDirChoice {
  /** The plugin dir as kubelet names it, on the host. */
  dir: string;
  source: PluginDirSource;
  /** Why this directory, in words. */
  reason: string;
}

/** A plugin dir and where this process reaches it: `dir` itself, or the same directory under the host root. */
export interface HostPluginDirChoice extends PluginDirChoice {
  localDir: string;
}

export interface PluginDirRequest {
  /** --preset: its name and plugin dir (a --plugin-dir given with it must name the same directory). */
  preset?: { name: string; pluginDir: string };
  /** --host-root: where the host's / is mounted; detection reads the host's files there. */
  hostRoot?: string;
}

function detectionPaths(env: NodeJS.ProcessEnv = process.env): DetectionPaths {
  const pick = (value: string | undefined, fallback: string) => (value && value.length > 0 ? value : fallback);
  return {
    procRoot: pick(env.LATCH_PROC_ROOT, '/proc'),
    openshiftDir: pick(env.LATCH_OPENSHIFT_PLUGIN_DIR, OPENSHIFT_PLUGIN_DIR),
    defaultDir: pick(env.LATCH_DEFAULT_PLUGIN_DIR, DEFAULT_PLUGIN_DIR),
  };
}

/**
 * --plugin-dir or --preset, else $LATCH_VOLUME_PLUGIN_DIR (set by a DaemonSet pinned to a directory), else what
 * kubelet on this host uses.
 */
export async function choosePluginDir(
  explicit: string | undefined,
  env: NodeJS.ProcessEnv = process.env,
  request: PluginDirRequest = {},
): Promise<HostPluginDirChoice> {
  const hostRoot = request.hostRoot === undefined ? undefined : await checkHostRoot(request.hostRoot);
  const choice = await chooseOnHost(explicit, env, request.preset, hostRoot);
  return { ...choice, localDir: hostRoot === undefined ? choice.dir : await resolveUnderRoot(hostRoot, choice.dir) };
}

async function chooseOnHost(
  explicit: string | undefined,
  env: NodeJS.ProcessEnv,
  preset: PluginDirRequest['preset'],
  hostRoot: string | undefined,
): Promise<PluginDirChoice> {
  if (preset !== undefined) {
    const dir = checkDir(preset.pluginDir, `preset ${preset.name}`);
    if (explicit !== undefined && checkDir(explicit, '--plugin-dir') !== dir) {
      throw new LatchError(
        `--plugin-dir ${explicit} conflicts with --preset ${preset.name}, whose plugin dir is ${dir}: give only one of them`,
      );
    }
    return { dir, source: 'preset', reason: `preset ${preset.name}` };
  }
  if (explicit !== undefined) return { dir: checkDir(explicit, '--plugin-dir'), source: 'option', reason: 'given with --plugin-dir' };
  if (env.LATCH_VOLUME_PLUGIN_DIR) {
    return {
      dir: checkDir(env.LATCH_VOLUME_PLUGIN_DIR, 'LATCH_VOLUME_PLUGIN_DIR'),
      source: 'env',
      reason: 'given in $LATCH_VOLUME_PLUGIN_DIR',
    };
  }
  return detectPluginDir({ ...detectionPaths(env), ...(hostRoot !== undefined && { hostRoot }) });
}

/**
 * kubelet's plugin dir, in kubelet's own order of precedence: its --volume-plugin-dir flag, then volumePluginDir in
 * its --config-dir drop-ins, then in its --config file, then (no kubelet setting) the OpenShift 4 directory if it
 * exists, else kubelet's default.
 */
export async function detectPluginDir(paths: DetectionPaths): Promise<PluginDirChoice> {
  const kubelets = await findKubelets(paths.procRoot);
  let why: string;
  const kubelet = kubelets[0];
  if (!kubelet) {
    why = `no kubelet process found in ${paths.procRoot}`;
  } else {
    const who = `${kubelet.label} (pid ${kubelet.pid}${kubelets.length > 1 ? `, the first of ${kubelets.length}` : ''})`;
    const flag = flagValue(kubelet.argv, 'volume-plugin-dir');
    if (flag) {
      return {
        dir: checkDir(flag, 'kubelet --volume-plugin-dir'),
        source: 'kubelet-flag',
        reason: `${who} runs with --volume-plugin-dir=${flag}`,
      };
    }
    // kubelet's own order: flags, then the drop-ins of --config-dir, then the --config file.
    const dropInDir = flagValue(kubelet.argv, 'config-dir');
    const dropIn = dropInDir === undefined ? undefined : await dropInPluginDir(paths, kubelet.pid, dropInDir);
    if (dropIn) {
      return {
        dir: checkDir(dropIn.dir, `volumePluginDir in ${dropIn.file}`),
        source: 'kubelet-config',
        reason: `volumePluginDir in ${dropIn.file}, a drop-in of the --config-dir of ${who}`,
      };
    }
    const configFlag = flagValue(kubelet.argv, 'config');
    if (!configFlag) {
      why = dropInDir
        ? `${who} has no --volume-plugin-dir, no --config, and no volumePluginDir in its --config-dir ${dropInDir}`
        : `${who} has neither --volume-plugin-dir nor --config`;
    } else {
      const found = await readKubeletConfig(paths, kubelet.pid, configFlag);
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
  if (await isDirectory(paths.hostRoot === undefined ? paths.openshiftDir : await resolveUnderRoot(paths.hostRoot, paths.openshiftDir))) {
    return { dir: normalize(paths.openshiftDir), source: 'openshift', reason: `${why}; ${paths.openshiftDir} exists (OpenShift 4)` };
  }
  return { dir: normalize(paths.defaultDir), source: 'default', reason: `${why}; using kubelet's default` };
}

interface KubeletProcess {
  pid: number;
  /** kubelet's own flags, as kubelet would parse them (argv[0] first). */
  argv: string[];
  /** "kubelet", or "k3s" for the kubelet inside a k3s process. */
  label: string;
}

/**
 * Processes named kubelet (by comm or argv[0]), and k3s servers and agents, which run kubelet inside with the flags
 * given as --kubelet-arg key=value (k3s-io/k3s#1631); lowest pid first.
 */
async function findKubelets(procRoot: string): Promise<KubeletProcess[]> {
  const found: KubeletProcess[] = [];
  for (const { pid, argv, comm } of await findProcesses(procRoot, () => true)) {
    const program = argv[0] === undefined ? '' : basename(argv[0]);
    if (comm === 'kubelet' || program === 'kubelet') {
      found.push({ pid, argv, label: 'kubelet' });
    } else if (/^k3s(-server|-agent)?$/.test(comm) || program === 'k3s' || /^k3s-(server|agent)$/.test(program)) {
      if (!argv.slice(1).some((a) => a === 'server' || a === 'agent')) continue; // k3s kubectl, k3s crictl...
      const kubeletArgs = flagValues(argv, 'kubelet-arg').map((a) => (a.startsWith('-') ? a : `--${a}`));
      // k3s 1.32 and later give kubelet this drop-in directory, with /etc/rancher/k3s/kubelet.conf copied into it
      // (k3s-io/k3s#2116); a --kubelet-arg config-dir=... comes after it and wins, as in kubelet.
      found.push({ pid, argv: ['kubelet', `--config-dir=${K3S_KUBELET_DROP_INS}`, ...kubeletArgs], label: 'k3s' });
    }
  }
  return found;
}

const K3S_KUBELET_DROP_INS = '/var/lib/rancher/k3s/agent/etc/kubelet.conf.d';

/** The value of a Go flag in an argv: -name=value, --name=value, -name value or --name value (the last one wins). */
export function flagValue(argv: readonly string[], name: string): string | undefined {
  const value = flagValues(argv, name).pop();
  return value === '' ? undefined : value;
}

/** Every value of a repeatable flag, in order. */
function flagValues(argv: readonly string[], name: string): string[] {
  const values: string[] = [];
  for (let i = 1; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === '--') break;
    for (const prefix of [`--${name}`, `-${name}`]) {
      const next = argv[i + 1];
      if (arg === prefix && next !== undefined) values.push(next);
      else if (arg?.startsWith(`${prefix}=`)) values.push(arg.slice(prefix.length + 1));
    }
  }
  return values;
}

/**
 * Reads kubelet's config file as kubelet sees it: a relative path is relative to kubelet's working directory, and
 * the file is read through /proc/<pid>/root first, so that detection also works from a container sharing the
 * host's pid namespace; then under the host root, if one is given, else at the path itself.
 */
async function readKubeletConfig(
  { procRoot, hostRoot }: DetectionPaths,
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
  const candidates = await asKubeletSeesIt({ procRoot, hostRoot }, pid, path);
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
    if (match) value = yamlScalar(match[1] ?? '');
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
    const quoted = /^'((?:[^']|'')*)'/.exec(text)?.[1];
    return quoted === undefined ? text.slice(1) : quoted.replace(/''/g, "'");
  }
  // Plain scalar: a comment starts at " #".
  const comment = text.search(/\s#/);
  return (comment < 0 ? text : text.slice(0, comment)).trim();
}

function checkDir(dir: string, what: string): string {
  if (!isAbsolute(dir) || dir.includes('\0')) throw new LatchError(`${what} ${JSON.stringify(dir)} must be an absolute path`);
  return normalize(dir).replace(/(.)\/+$/, '$1');
}

/** Where this process finds a path of kubelet's: through /proc/<pid>/root, then under the host root or as it is. */
async function asKubeletSeesIt({ procRoot, hostRoot }: Pick<DetectionPaths, 'procRoot' | 'hostRoot'>, pid: number, path: string) {
  return [join(procRoot, String(pid), 'root', path), hostRoot === undefined ? path : await resolveUnderRoot(hostRoot, path)];
}

/**
 * volumePluginDir from kubelet's --config-dir drop-ins: the *.conf files below it, walked in lexical order (as
 * kubelet walks them), the last one that sets it winning. A directory that cannot be read sets nothing, as for
 * kubelet, which then fails to start anyway.
 */
async function dropInPluginDir(paths: DetectionPaths, pid: number, dir: string): Promise<{ dir: string; file: string } | undefined> {
  for (const candidate of await asKubeletSeesIt(paths, pid, isAbsolute(dir) ? dir : resolve('/', dir))) {
    let files: string[];
    try {
      files = await confFiles(candidate);
    } catch {
      continue;
    }
    let found: { dir: string; file: string } | undefined;
    for (const file of files) {
      let value: string | undefined;
      try {
        value = kubeletConfigPluginDir(await readFile(join(candidate, file), 'utf8'));
      } catch {
        continue; // gone meanwhile
      }
      if (value) found = { dir: value, file: join(dir, file) };
    }
    return found;
  }
  return undefined;
}

/** The *.conf files below a directory, relative to it, in the order of Go's filepath.WalkDir (lexical, depth first). */
async function confFiles(dir: string, prefix = ''): Promise<string[]> {
  const entries = (await readdir(join(dir, prefix), { withFileTypes: true })).sort((a, b) =>
    a.name < b.name ? -1 : a.name > b.name ? 1 : 0,
  );
  const files: string[] = [];
  for (const entry of entries) {
    const name = join(prefix, entry.name);
    if (entry.isDirectory()) files.push(...(await confFiles(dir, name)));
    else if (entry.name.endsWith('.conf')) files.push(name);
  }
  return files;
}

async function checkHostRoot(hostRoot: string): Promise<string> {
  const root = checkDir(hostRoot, '--host-root');
  if (!(await isDirectory(root))) throw new LatchError(`--host-root ${hostRoot} is not a directory (mount the host's / there)`);
  return root;
}

/**
 * `path` on the host, reached under `root`, where the host's / is mounted: its symbolic links are followed as the
 * host would follow them (an absolute target starts again at `root`, never at this process's /). Components that do
 * not exist (yet) are kept as they are.
 */
export async function resolveUnderRoot(root: string, path: string): Promise<string> {
  if (root === '/') return normalize(path);
  const rest = path.split('/').filter((p) => p !== '' && p !== '.');
  const done: string[] = [];
  let links = 0;
  for (let part = rest.shift(); part !== undefined; part = rest.shift()) {
    if (part === '..') {
      done.pop(); // never above the host's /
      continue;
    }
    let target: string | undefined;
    try {
      target = await readlink(join(root, ...done, part));
    } catch {
      // Not a symbolic link, or not there: a plain component.
    }
    if (target === undefined) {
      done.push(part);
      continue;
    }
    if (++links > 40) throw new LatchError(`too many levels of symbolic links in ${path} under ${root}`);
    if (target.startsWith('/')) done.length = 0;
    rest.unshift(...target.split('/').filter((p) => p !== '' && p !== '.'));
  }
  return join(root, ...done);
}

async function isDirectory(path: string): Promise<boolean> {
  try {
    return (await stat(path)).isDirectory();
  } catch {
    return false;
  }
}

// One JSON configuration file, validated at start: $LATCH_CONFIG, else /etc/latch/config.json, else the one beside
// the driver in the plugin dir (<driver dir>/.latch/config.json: all that kube-controller-manager's container sees),
// else defaults.
import { closeSync, fstatSync, openSync, readFileSync, statSync } from 'node:fs';
import { hostname } from 'node:os';
import { basename, dirname, isAbsolute, join, normalize, resolve } from 'node:path';
import { writeFileAtomicSync } from './atomic-file.js';
import type * as ConfigSchema from './config-schema.js';
import { ConfigError, errorMessage } from './errors.js';
import type { FsType } from './filesystems.js';

export const DEFAULT_CONFIG_PATH = '/etc/latch/config.json';
/** Beside the driver file, the directory of what it needs besides itself (a dot-name: kubelet's prober skips it). */
export const BESIDE_DRIVER_DIR = '.latch';

export interface EtcdStoreConfig {
  type: 'etcd';
  endpoints: string[];
  prefix: string;
  timeoutMs: number;
  tls?: { ca?: string; cert?: string; key?: string };
}
type StoreConfig = { type: 'file' } | EtcdStoreConfig;

/** Volumes as RBD images of a Ceph pool, reached from this node as its own cephx identity (docs/operations.md). */
export interface RbdBackendConfig {
  type: 'rbd';
  /** The rbd pool that holds latch's images. */
  pool: string;
  /** The cluster's conf file (mon_host, fsid). */
  cephConf: string;
  /** This node's cephx id, without the `client.` prefix. */
  clientId: string;
  /** The identity's keyring file (0600): the key is only ever read from it. */
  keyring: string;
  /**
   * Node-private directory for the per-volume rbd-fuse mounts, the client instance recorded for each mapping, keys
   * from PV secrets and exported snapshots.
   */
  mountDir: string;
  /**
   * How this node maps images: rbd-fuse + a loop device, or the kernel client; "auto" (the default): the kernel client
   * where the kernel has the rbd module, else rbd-fuse (backend/client-choice.ts, docs/operations.md).
   */
  client: RbdClientSetting;
  /**
   * The identity that may blocklist single client instances (docs/operations.md, "Fencing"): only on the machines
   * that run `latch node fence` and `latch volume release --node-is-down`, never in a node's configuration.
   */
  fencer?: { clientId: string; keyring: string };
  /** Shared (ReadWriteMany) volumes as CephFS subvolumes on the same cluster; unset: none (docs/operations.md). */
  cephfs?: CephFsConfig;
}

/** Where shared volumes live: subvolumes of `group` in file system `fsName`, mounted on this node by `client`. */
export interface CephFsConfig {
  fsName: string;
  /** The subvolume group that holds latch's shared volumes; each node's identity may reach only this group. */
  group: string;
  /** How this node mounts them: ceph-fuse, or the kernel client where the ceph module is; "auto": the kernel's if present. */
  client: CephFsClientSetting;
  /** Node-private directory of the per-volume mounts that the pods' bind mounts come from, and their client records. */
  mountDir: string;
}
export type CephFsClientKind = 'ceph-fuse' | 'kernel';
export type CephFsClientSetting = CephFsClientKind | 'auto';
export type RbdClientKind = 'rbd-fuse' | 'krbd';
export type RbdClientSetting = RbdClientKind | 'auto';
type BackendConfig = { type: 'loop' } | RbdBackendConfig;

/**
 * Where `latch backup` writes: an existing directory, local or a shared mount (NFS, CephFS) every node sees, or a prefix
 * in an S3 bucket (docs/operations.md, "Backups"). `keyFile`: a root-only file holding the key that encrypts chunks and
 * authenticates manifests, every node the same; `encrypt: false` keeps new chunks in the clear (manifests still
 * authenticated).
 */
export type BackupTargetConfig =
  | { type: 'dir'; path: string; keyFile?: string; encrypt?: boolean }
  | {
      type: 's3';
      endpoint: string;
      bucket: string;
      prefix: string;
      region?: string;
      credentialsFile?: string;
      credentialsDir?: string;
      caFile?: string;
      keyFile?: string;
      encrypt?: boolean;
    };

export interface Config {
  /** Where the configuration came from: a file path, or "built-in defaults". */
  source: string;
  driverName: string;
  nodeName: string;
  /**
   * The one node that uses this configuration: a store of its own (the file store) is then enough, and every other
   * node name is refused (unsafeConfigReason).
   */
  singleNode?: string;
  /**
   * Every node name that uses this configuration runs on this one host (simulated nodes: `latch demo`, tests): they
   * share its file store, and where their poolDir is the same, its pool (docs/operations.md, "Where a volume lives").
   */
  oneHost?: boolean;
  attach: boolean;
  poolDir: string;
  stateDir: string;
  logFile: string;
  logMaxBytes: number;
  defaultSize: number;
  maxSize: number;
  defaultFsType: FsType;
  allowedFsTypes: FsType[];
  /** Seconds waitforattach waits for the grant (at most 480: the call itself must answer before kubelet kills it at 600). */
  waitForAttachTimeout: number;
  /** Seconds any child process (losetup, mkfs, mount...) may run before its process group is killed. */
  commandTimeout: number;
  store: StoreConfig;
  /** Where volumes' bytes live: image files in poolDir (loop, the default) or RBD images in a Ceph pool. */
  backend: BackendConfig;
  /**
   * Whether a driver call (attach, or mount in non-attach mode) may create a volume that does not exist yet; false:
   * only an admin command creates volumes (docs/operations.md, "Tenancy").
   */
  lazyCreate: boolean;
  /** What the calls from one namespace's pods may create, each namespace on its own; unset: no limit. */
  namespaceQuota?: NamespaceQuota;
  /** Where backups go; unset: `latch backup` refuses, saying so. */
  backupTarget?: BackupTargetConfig;
  /**
   * Seconds after which a waiting workload ticket that no attach, isattached or waitforattach asked for is reaped
   * (0: never). The default, 900, is well above the longest gap a live requester leaves: the controller's retry
   * backoff caps at 2m2s, plus one call of at most 9 minutes (docs/operations.md, "Automatic recovery").
   */
  abandonedTicketSeconds: number;
  /** Seconds between two records of "still wanted" on a waiting ticket (a write at most this often per ticket). */
  ticketTouchSeconds: number;
  /**
   * The longest a snapshot may hold a mounted volume's filesystem frozen (0: never freeze; snapshots of mounted
   * volumes are then crash-consistent). A copy that cannot be cut at once (a pool that cannot reflink) is never made
   * under freeze (docs/operations.md, "Snapshots").
   */
  freezeSeconds: number;
  /** Where a manual attach (`latch volume attach --mount`) mounts, and how (docs/jobs.md, "Manual attach"). */
  manualAttach: ManualAttachConfig;
  /** latch agent: where /metrics listens (host:port, loopback by default) and how often its tasks run. */
  agent: AgentConfig;
  /** Snapshots and backups the agents take on a schedule (docs/jobs.md, "Recurring jobs"); empty by default. */
  recurringJobs: RecurringJobConfig[];
}

/**
 * One recurring job: every slot of `cron` (five fields, UTC), a snapshot or a backup of each volume `volumes` selects,
 * named `<name>-<YYYYMMDD-HHMM>`; the newest `retain` of those this job made are kept.
 */
export interface RecurringJobConfig {
  name: string;
  task: 'snapshot' | 'backup';
  /** Checked here for its shape only; the agent parses it with the cron library (jobs/recurring.ts). */
  cron: string;
  /** Volume names and glob patterns (`*` any run of characters, `?` one character), e.g. ["db", "pvc-*"]. */
  volumes: string[];
  retain: number;
}

/**
 * A manual attach mounts volume V at `<mountRoot>/<V>` and nowhere else (the ledger may not choose the path: any node
 * can write it), always nosuid and nodev, and noexec unless `exec`.
 */
export interface ManualAttachConfig {
  mountRoot: string;
  exec: boolean;
}

/**
 * The volumes a namespace's pods may have created by their calls (counted from the ledger: the volumes created for a
 * pod of that namespace) and their total size in bytes. Only a call that carries the namespace counts and is counted:
 * mount, in non-attach mode.
 */
export interface NamespaceQuota {
  volumes?: number | undefined;
  bytes?: number | undefined;
}

export interface AgentConfig {
  listen: string;
  intervalSeconds: number;
}

/** Where loadConfig looks when $LATCH_CONFIG is not set; tests redirect both. */
export interface ConfigLocations {
  /** Default /etc/latch/config.json. */
  defaultPath?: string;
  /** The driver file this process is (default: ownDriverFile()); its .latch/config.json comes next. */
  driverFile?: string;
}

/** Reads and validates the configuration; throws ConfigError naming the file and the field. */
export function loadConfig(env: NodeJS.ProcessEnv = process.env, locations: ConfigLocations = {}): Config {
  const { raw, source } = readConfigFile(env, locations);
  return refuseUnsafe(parseConfig(raw, source));
}

/**
 * Why volumes are not safe under this configuration, or undefined: the one rule every entry point applies (driver
 * calls, the agent and every admin command through loadDriverConfig and loadConfig, install's manifests, doctor).
 * Pure and cheap, so that a driver call applies it also to a configuration it remembers as validated.
 * docs/operations.md, "Configurations latch refuses".
 */
export function unsafeConfigReason(config: Config): string | undefined {
  const { source, nodeName, singleNode } = config;
  if (singleNode !== undefined && singleNode !== nodeName) {
    return (
      `invalid configuration in ${source}: it is for node ${singleNode} alone ("singleNode"), but this is node ${nodeName}; ` +
      'more than one node needs a store they all share (the etcd store) and no "singleNode"'
    );
  }
  // The file store is one host's ledger: shared among node names only when the configuration says they are one node,
  // or simulated nodes of one host.
  if (config.store.type !== 'file' || singleNode !== undefined || config.oneHost === true) return undefined;
  const fix = `use the etcd store that every node shares ("store": {"type": "etcd", ...}), or, if no other node ever uses it, set "singleNode": "${nodeName}"`;
  if (config.backend.type === 'rbd') {
    return (
      `invalid configuration in ${source}: the rbd backend keeps volumes where every node reaches them, but the file store is ` +
      `this node's own ledger, so two nodes could each map one image read-write; ${fix}`
    );
  }
  if (!config.attach) {
    return (
      `invalid configuration in ${source}: non-attach mode ("attach": false) with the file store gives every node a ledger of its ` +
      `own, so a pod that moves to another node would get a new, empty volume there; ${fix}`
    );
  }
  return undefined;
}

/** The configuration, or the ConfigError that unsafeConfigReason gives. */
export function refuseUnsafe(config: Config): Config {
  const reason = unsafeConfigReason(config);
  if (reason !== undefined) throw new ConfigError(reason);
  return config;
}

/** Replaced at build time (build.mjs) by a digest of the code; undefined when run from source. */
declare const LATCH_BUILD: string | undefined;

/** What a driver call remembers of a configuration it validated (see loadDriverConfig). */
interface RememberedConfig {
  build: string;
  hostname: string;
  text: string;
  config: Config;
}

/**
 * loadConfig for a driver call: a configuration that this build has validated before, byte for byte, on this host, is
 * taken as it was then, from the copy the call that validated it left beside it (`.<name>.validated`, 0600), so that
 * the call does not evaluate zod (measured: 4 ms of CPU, a sixth of a node start-up, on every call KCM and kubelet
 * make). The copy is only a cache: any difference (the file's text, the build, the host name that names the node by
 * default) and it is validated again; a copy that cannot be read, or that others than its owner may write, is
 * ignored; one that cannot be written is not written. `remember` is false for init, which leaves nothing behind.
 */
export function loadDriverConfig(
  env: NodeJS.ProcessEnv,
  remember: boolean,
  build = typeof LATCH_BUILD === 'string' ? LATCH_BUILD : undefined,
): Config {
  const { raw, source, text } = readConfigFile(env, {});
  if (text === undefined || build === undefined) return refuseUnsafe(parseConfig(raw, source));
  const copyPath = join(dirname(source), `.${basename(source)}.validated`);
  const host = hostName();
  const copy = readRemembered(copyPath);
  // The safety rule is applied to the remembered copy too: it costs nothing, and a copy never vouches for it.
  if (copy && copy.build === build && copy.hostname === host && copy.text === text && copy.config.source === source)
    return refuseUnsafe(copy.config);
  const config = parseConfig(raw, source);
  if (remember) writeRemembered(copyPath, { build, hostname: host, text, config });
  return refuseUnsafe(config);
}

/**
 * The host name, as the kernel holds it for this process's UTS namespace: the file that os.hostname() reads through
 * uname(2), without loading node:os (a module and three functions to compile on every call).
 */
function hostName(): string {
  try {
    return readFileSync('/proc/sys/kernel/hostname', 'utf8').trimEnd();
  } catch {
    return hostname(); // no /proc mounted
  }
}

function readRemembered(path: string): RememberedConfig | undefined {
  let fd: number | undefined;
  try {
    fd = openSync(path, 'r');
    const { uid, mode } = fstatSync(fd);
    if (uid !== process.geteuid?.() || (mode & 0o022) !== 0) return undefined;
    return JSON.parse(readFileSync(fd, 'utf8')) as RememberedConfig;
  } catch {
    return undefined;
  } finally {
    if (fd !== undefined) closeSync(fd);
  }
}

function writeRemembered(path: string, remembered: RememberedConfig): void {
  // Renamed into place whole: a reader sees the old copy or the new one. Not synced: a copy lost is validated again.
  try {
    writeFileAtomicSync(path, JSON.stringify(remembered), { sync: 'none' });
  } catch {
    // Not written: the next call validates again.
  }
}

function readConfigFile(env: NodeJS.ProcessEnv, locations: ConfigLocations): { raw: unknown; source: string; text?: string } {
  const explicit = env.LATCH_CONFIG;
  if (explicit && explicit.length > 0) {
    const found = readJson(explicit);
    if (found === undefined) throw new ConfigError(`configuration file ${explicit} (from LATCH_CONFIG) does not exist`);
    return { ...found, source: explicit };
  }
  const path = locations.defaultPath ?? DEFAULT_CONFIG_PATH;
  const found = readJson(path);
  if (found !== undefined) return { ...found, source: path };
  // /etc/latch is not there: kube-controller-manager's container, which sees only the plugin dir.
  const driverFile = locations.driverFile ?? ownDriverFile();
  if (driverFile !== undefined) {
    const beside = besideDriverConfigPath(driverFile);
    const besideFound = readJson(beside);
    if (besideFound !== undefined) {
      checkBesideDriverPermissions(beside, besideFound.raw);
      return { ...besideFound, source: beside };
    }
  }
  return { raw: {}, source: 'built-in defaults' };
}

/** The file's text and what it parses to, or undefined when it does not exist. */
function readJson(path: string): { raw: unknown; text: string } | undefined {
  try {
    const text = readFileSync(path, 'utf8');
    return { raw: JSON.parse(text) as unknown, text };
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT' || code === 'ENOTDIR') return undefined;
    if (err instanceof SyntaxError) throw new ConfigError(`configuration file ${path} is not valid JSON: ${err.message}`);
    throw new ConfigError(`configuration file ${path} cannot be read: ${errorMessage(err)}`);
  }
}

/** `<driver dir>/.latch/config.json`: the configuration `latch install --config-beside-driver` writes. */
function besideDriverConfigPath(driverFile: string): string {
  return join(dirname(driverFile), BESIDE_DRIVER_DIR, 'config.json');
}

/**
 * A configuration in the plugin dir that names a key (the etcd client key, a Ceph keyring) must be readable by its
 * owner alone, and so must the key: the plugin dir is mounted into other containers and read by other tools, and
 * nobody checks what is in it. Refused, with the chmod that fixes it, rather than used.
 */
function checkBesideDriverPermissions(path: string, raw: unknown): void {
  const doc = (typeof raw === 'object' && raw !== null ? raw : {}) as {
    store?: { tls?: { key?: unknown } };
    backend?: { keyring?: unknown };
  };
  const keys = [doc.store?.tls?.key, doc.backend?.keyring].filter((k): k is string => typeof k === 'string' && k.length > 0);
  if (keys.length === 0) return;
  for (const file of [path, ...keys.map((k) => resolve(dirname(path), k))]) {
    let mode: number;
    try {
      mode = statSync(file).mode & 0o777;
    } catch {
      continue; // a missing key is the store's to report, when it reads it
    }
    if ((mode & 0o077) !== 0) {
      throw new ConfigError(
        `configuration file ${path} beside the driver names a key, and ${file === path ? 'it' : `the key ${file}`} is readable ` +
          `by others than its owner (mode ${mode.toString(8).padStart(4, '0')}): run chmod 600 ${file}`,
      );
    }
  }
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

/** The file kubelet runs as this process: the single executable, or the bundle script node was started with. */
function ownDriverFile(): string | undefined {
  if (isSingleExecutable()) return process.execPath;
  const script = process.argv[1];
  return script ? resolve(script) : undefined;
}

/**
 * The schema (config-schema.ts, zod), loaded on first use: a call whose configuration is validated already (see
 * loadDriverConfig) never evaluates zod, which costs more than the rest of a driver call. In bin/latch-sea's driver
 * bundles it is an asset of its own (src/sea/load.ts).
 */
function configSchema(): typeof ConfigSchema {
  return require('./config-schema.js') as typeof ConfigSchema;
}

/**
 * The schema's verdict, with its ConfigError as this module's: in bin/latch-sea the schema is a bundle of its own,
 * whose errors.ts is another copy, and a call tells a configuration error from a crash by its class.
 */
function validateConfig(raw: unknown, source: string): ReturnType<typeof ConfigSchema.validateConfig> {
  try {
    return configSchema().validateConfig(raw, source);
  } catch (err) {
    if (err instanceof Error && err.name === 'ConfigError' && !(err instanceof ConfigError)) throw new ConfigError(err.message);
    throw err;
  }
}

/** Validates an already parsed configuration object; `source` names it in messages. */
export function parseConfig(raw: unknown, source: string): Config {
  const c = validateConfig(raw, source);
  if (c.maxSize < c.defaultSize) {
    throw new ConfigError(`invalid configuration in ${source}: field "defaultSize": it is larger than maxSize`);
  }
  if (!c.allowedFsTypes.includes(c.defaultFsType)) {
    throw new ConfigError(`invalid configuration in ${source}: field "defaultFsType": "${c.defaultFsType}" is not in allowedFsTypes`);
  }
  const nodeName = c.nodeName ?? defaultNodeName();
  return { ...c, source, nodeName, store: resolveStoreFiles(c.store, source), backend: completeBackend(c.backend, nodeName) };
}

/** The etcd client's files, relative to the configuration's directory when given relative. */
function resolveStoreFiles(store: StoreConfig, source: string): StoreConfig {
  if (store.type !== 'etcd' || !store.tls) return store;
  const tls: NonNullable<EtcdStoreConfig['tls']> = {};
  for (const field of ['ca', 'cert', 'key'] as const) {
    const path = store.tls[field];
    if (path !== undefined) tls[field] = isAbsolute(path) ? normalize(path) : resolve(dirname(source), path);
  }
  return { ...store, tls };
}

/**
 * The rbd backend's identity defaults to `latch-<nodeName>` (one cephx identity per node, so that one node can be
 * fenced alone) and its keyring to where Ceph's tools look for it: /etc/ceph/ceph.client.<id>.keyring.
 */
function completeBackend(
  backend:
    { type: 'loop' } | (Omit<RbdBackendConfig, 'clientId' | 'keyring'> & { clientId?: string | undefined; keyring?: string | undefined }),
  nodeName: string,
): BackendConfig {
  if (backend.type === 'loop') return backend;
  const clientId = backend.clientId ?? `latch-${nodeName}`;
  return { ...backend, clientId, keyring: backend.keyring ?? `/etc/ceph/ceph.client.${clientId}.keyring` };
}

/** kubelet names a node after its host name, lower-cased. */
function defaultNodeName(): string {
  return hostname().toLowerCase();
}

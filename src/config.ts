// One JSON configuration file, validated at start: $LATCH_CONFIG, else /etc/latch/config.json, else the one beside
// the driver in the plugin dir (<driver dir>/.latch/config.json: all that kube-controller-manager's container sees),
// else defaults.
import { readFileSync, statSync } from 'node:fs';
import { hostname } from 'node:os';
import { dirname, isAbsolute, join, normalize, resolve } from 'node:path';
import * as z from 'zod/mini';
import { ConfigError, errorMessage } from './errors.js';
import { FS_TYPES, type FsType } from './filesystems.js';
import { parseSize } from './size.js';

export const DEFAULT_CONFIG_PATH = '/etc/latch/config.json';
/** Beside the driver file, the directory of what it needs besides itself (a dot-name: kubelet's prober skips it). */
export const BESIDE_DRIVER_DIR = '.latch';
export const DEFAULT_DRIVER_NAME = 'latch/loop';
/** vendor/driver: kubelet makes the plugin directory `vendor~driver` of it. */
export const DRIVER_NAME_PATTERN = /^[a-z0-9][a-z0-9.-]*\/[a-z0-9][a-z0-9.-]*$/;

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
  /** Node-private directory for the per-volume rbd-fuse mounts. */
  mountDir: string;
  /**
   * The identity that may blocklist single client instances (docs/operations.md, "Fencing"): only on the machines
   * that run `latch node fence` and `latch volume release --node-is-down`, never in a node's configuration.
   */
  fencer?: { clientId: string; keyring: string };
}
type BackendConfig = { type: 'loop' } | RbdBackendConfig;

/** Where `latch backup` writes: an existing directory, local or a shared mount (NFS, CephFS) every node sees. */
export interface BackupTargetConfig {
  type: 'dir';
  path: string;
}

export interface Config {
  /** Where the configuration came from: a file path, or "built-in defaults". */
  source: string;
  driverName: string;
  nodeName: string;
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
  /** Checked here for its shape only; the agent parses it with the cron library (cli/agent/recurring.ts). */
  cron: string;
  /** Volume names and glob patterns (`*` any run of characters, `?` one character), e.g. ["db", "pvc-*"]. */
  volumes: string[];
  retain: number;
}

export interface AgentConfig {
  listen: string;
  intervalSeconds: number;
}

// Plugin directories that kubelet watches: nothing of ours but the driver itself may live below them.
const PLUGIN_DIR_MARKER = 'kubelet-plugins/volume/exec';

/**
 * Adds a failed check to a transform's payload (zod/mini's transforms have no addIssue) and returns zod's marker for
 * "no value".
 */
function failTransform(ctx: z.core.ParsePayload, message: string): never {
  ctx.issues.push({ code: 'custom', message, input: ctx.value });
  return z.NEVER;
}

/**
 * `schema.safeParse(raw)`, with zod's English messages for the checks that carry no message of ours ("Too big:
 * expected number to be <=480"). zod/mini has no messages until a locale is configured; the locale is configured
 * only when a value fails, since almost every call parses a valid configuration.
 */
function parseWithMessages<S extends z.ZodMiniType>(schema: S, raw: unknown): ReturnType<S['safeParse']> {
  // One parse per process: zod's compiled fast path for objects (new Function per object schema) would cost more
  // than it saves.
  z.config({ jitless: true });
  const result = schema.safeParse(raw) as ReturnType<S['safeParse']>;
  if (result.success || english) return result;
  english = true;
  z.config(z.locales.en());
  return schema.safeParse(raw) as ReturnType<S['safeParse']>;
}
let english = false;

/**
 * The configuration schema, in zod/mini: the same checks as zod's classic API in about a tenth of the code, which
 * matters because every driver call validates its configuration (evaluating classic zod cost a node start-up).
 */
function buildSchema() {
  const absolutePath = z.pipe(
    z.string().check(
      z.refine((p) => isAbsolute(p), 'must be an absolute path'),
      z.refine((p) => !p.includes('\0'), 'must not contain NUL'),
      z.refine((p) => !normalize(p).includes(PLUGIN_DIR_MARKER), 'must not be inside the kubelet plugin directory'),
    ),
    z.transform((p: string) => normalize(p)),
  );
  const size = z.pipe(
    z.union([z.string(), z.number()]),
    z.transform((v: string | number, ctx) => {
      try {
        return parseSize(v);
      } catch (err) {
        return failTransform(ctx, errorMessage(err));
      }
    }),
  );
  const fsType = z.enum(FS_TYPES as [FsType, ...FsType[]]);
  const integer = (min: number, max?: number) =>
    max === undefined ? z.int().check(z.minimum(min)) : z.int().check(z.minimum(min), z.maximum(max));
  // A file the configuration names, relative to the configuration's own directory (resolved in parseConfig): the
  // etcd client's files beside a configuration beside the driver are inside the plugin dir, and that is fine.
  const filePath = z.string().check(
    z.minLength(1),
    z.refine((p) => !p.includes('\0'), 'must not contain NUL'),
  );
  const store = z.discriminatedUnion('type', [
    z.strictObject({ type: z.literal('file') }),
    z.strictObject({
      type: z.literal('etcd'),
      endpoints: z.array(z.url()).check(z.minLength(1)),
      prefix: z._default(z.string(), '/latch/'),
      timeoutMs: z._default(integer(100, 60_000), 5000),
      tls: z.optional(z.strictObject({ ca: z.optional(filePath), cert: z.optional(filePath), key: z.optional(filePath) })),
    }),
  ]);
  // Ceph's own rules for pool names and cephx ids, minus what would need quoting; `client.` is added by Ceph.
  const cephName = z.string().check(z.regex(/^[A-Za-z0-9][A-Za-z0-9_.-]*$/, 'must be letters, digits, ".", "_" and "-"'), z.maxLength(128));
  const cephxId = cephName.check(z.refine((id) => !id.startsWith('client.'), 'is the cephx id without the "client." prefix'));
  const backend = z.discriminatedUnion('type', [
    z.strictObject({ type: z.literal('loop') }),
    z.strictObject({
      type: z.literal('rbd'),
      pool: z._default(cephName, 'latch'),
      cephConf: z._default(absolutePath, '/etc/ceph/ceph.conf'),
      clientId: z.optional(cephxId),
      keyring: z.optional(absolutePath),
      mountDir: z._default(absolutePath, '/var/lib/latch/rbd'),
      fencer: z.optional(z.strictObject({ clientId: cephxId, keyring: absolutePath })),
    }),
  ]);
  const recurringJob = z.strictObject({
    // Lower-case letters, digits and '-' (no '.'): the job's name starts the names of what it makes.
    name: z
      .string()
      .check(z.regex(/^[a-z0-9]([a-z0-9-]*[a-z0-9])?$/, "must be lower-case letters, digits and '-', e.g. nightly"), z.maxLength(63)),
    task: z.enum(['snapshot', 'backup']),
    // The shape only (five fields, as cron writes them): the agent checks it with the cron library, which driver calls
    // never load.
    cron: z.string().check(z.regex(/^\s*(@[a-z]+|\S+(\s+\S+){4})\s*$/, 'must be a cron expression of five fields, e.g. "0 3 * * *"')),
    volumes: z
      .array(z.string().check(z.regex(/^[a-z0-9._*?-]+$/, "must be a volume name or a pattern of them with '*' and '?'")))
      .check(z.minLength(1)),
    retain: integer(1, 1000),
  });
  return z.strictObject({
    driverName: z._default(
      z.string().check(z.regex(DRIVER_NAME_PATTERN, `must look like vendor/driver, e.g. ${DEFAULT_DRIVER_NAME}`)),
      DEFAULT_DRIVER_NAME,
    ),
    nodeName: z.optional(
      z
        .string()
        .check(z.regex(/^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$/, 'must be a lower-case host name as kubelet reports it'), z.maxLength(253)),
    ),
    attach: z._default(z.boolean(), true),
    poolDir: z._default(absolutePath, '/var/lib/latch/pool'),
    stateDir: z._default(absolutePath, '/var/lib/latch/state'),
    logFile: z._default(absolutePath, '/var/log/latch/latch.log'),
    logMaxBytes: z._default(integer(4096), 10 * 1024 * 1024),
    defaultSize: z._default(size, 1024 ** 3),
    maxSize: z._default(size, 1024 ** 4),
    defaultFsType: z._default(fsType, 'ext4'),
    allowedFsTypes: z._default(z.array(fsType).check(z.minLength(1)), [...FS_TYPES]),
    waitForAttachTimeout: z._default(integer(1, 480), 120),
    commandTimeout: z._default(integer(1, 3600), 120),
    store: z._default(store, { type: 'file' }),
    backend: z._default(backend, { type: 'loop' }),
    backupTarget: z.optional(z.strictObject({ type: z.literal('dir'), path: absolutePath })),
    abandonedTicketSeconds: z._default(integer(0), 900),
    ticketTouchSeconds: z._default(integer(1, 3600), 60),
    agent: z._default(
      z.strictObject({
        listen: z._default(
          z.string().check(z.regex(/^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):[0-9]{1,5}$/, 'must be host:port, e.g. 127.0.0.1:9742')),
          '127.0.0.1:9742',
        ),
        intervalSeconds: z._default(integer(1, 3600), 30),
      }),
      { listen: '127.0.0.1:9742', intervalSeconds: 30 },
    ),
    recurringJobs: z._default(
      z.array(recurringJob).check(
        z.superRefine((jobs, ctx) => {
          const seen = new Set<string>();
          jobs.forEach((job, i) => {
            if (seen.has(job.name))
              ctx.addIssue({ code: 'custom', path: [i, 'name'], message: `a recurring job named "${job.name}" is already defined` });
            seen.add(job.name);
          });
        }),
      ),
      [],
    ),
  });
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
  return parseConfig(raw, source);
}

function readConfigFile(env: NodeJS.ProcessEnv, locations: ConfigLocations): { raw: unknown; source: string } {
  const explicit = env.LATCH_CONFIG;
  if (explicit && explicit.length > 0) {
    const raw = readJson(explicit);
    if (raw === undefined) throw new ConfigError(`configuration file ${explicit} (from LATCH_CONFIG) does not exist`);
    return { raw, source: explicit };
  }
  const path = locations.defaultPath ?? DEFAULT_CONFIG_PATH;
  const raw = readJson(path);
  if (raw !== undefined) return { raw, source: path };
  // /etc/latch is not there: kube-controller-manager's container, which sees only the plugin dir.
  const driverFile = locations.driverFile ?? ownDriverFile();
  if (driverFile !== undefined) {
    const beside = besideDriverConfigPath(driverFile);
    const found = readJson(beside);
    if (found !== undefined) {
      checkBesideDriverPermissions(beside, found);
      return { raw: found, source: beside };
    }
  }
  return { raw: {}, source: 'built-in defaults' };
}

/** The parsed file, or undefined when it does not exist. */
function readJson(path: string): unknown {
  try {
    return JSON.parse(readFileSync(path, 'utf8')) as unknown;
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

let schema: ReturnType<typeof buildSchema> | undefined;

/** Validates an already parsed configuration object; `source` names it in messages. */
export function parseConfig(raw: unknown, source: string): Config {
  schema ??= buildSchema();
  const result = parseWithMessages(schema, raw);
  if (!result.success) {
    const issue = result.error.issues[0];
    if (!issue) throw new ConfigError(`invalid configuration in ${source}`);
    const field = issue.path.length > 0 ? issue.path.join('.') : '(top level)';
    const detail = issue.code === 'unrecognized_keys' ? `unknown field(s) ${issue.keys.map((k) => `"${k}"`).join(', ')}` : issue.message;
    throw new ConfigError(`invalid configuration in ${source}: field "${field}": ${detail}`);
  }
  const c = result.data;
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

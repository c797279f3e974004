// The configuration's schema (zod/mini): what config.json may hold, its defaults and its messages. Loaded by
// config.ts only when a configuration must be validated, which a driver call rarely needs (config.ts, loadDriverConfig).
import { isAbsolute, normalize } from 'node:path';
import * as z from 'zod/mini';
import { ConfigError, errorMessage } from './errors.js';
import { FS_TYPES, type FsType } from './filesystems.js';
import { DEFAULT_DRIVER_NAME, DRIVER_NAME_PATTERN } from './names.js';
import { parseSize } from './size.js';

// Plugin directories that kubelet watches: nothing of ours but the driver itself may live below them.
const PLUGIN_DIR_MARKER = 'kubelet-plugins/volume/exec';

/**
 * The configuration schema, in zod/mini: the same checks as zod's classic API in about a tenth of the code (evaluating
 * classic zod cost a node start-up, on each call that validates).
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
        // zod/mini's transforms have no addIssue.
        ctx.issues.push({ code: 'custom', message: errorMessage(err), input: v });
        return z.NEVER;
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
      client: z._default(z.enum(['auto', 'rbd-fuse', 'krbd']), 'auto'),
      fencer: z.optional(z.strictObject({ clientId: cephxId, keyring: absolutePath })),
      cephfs: z.optional(
        z.strictObject({
          fsName: z._default(cephName, 'cephfs'),
          group: z._default(cephName, 'latch'),
          client: z._default(z.enum(['auto', 'ceph-fuse', 'kernel']), 'auto'),
          mountDir: z._default(absolutePath, '/var/lib/latch/cephfs'),
        }),
      ),
    }),
  ]);
  // Backups: a directory, or a prefix in an S3 bucket (src/backup/s3-store.ts). The key encrypts and authenticates.
  const backupKeys = { keyFile: z.optional(absolutePath), encrypt: z.optional(z.boolean()) };
  const backupTarget = z.discriminatedUnion('type', [
    z.strictObject({ type: z.literal('dir'), path: absolutePath, ...backupKeys }),
    z
      .strictObject({
        type: z.literal('s3'),
        endpoint: z.url({ protocol: /^https?$/, error: 'must be an http:// or https:// URL, e.g. https://s3.example.com' }).check(
          z.refine((u) => {
            // (Also run when the URL check above failed: that one then says what is wrong.)
            const url = URL.canParse(u) ? new URL(u) : undefined;
            return url === undefined || (url.username === '' && url.password === '' && url.search === '' && url.hash === '');
          }, 'must be a plain URL: no user, password, query or fragment (credentials go in credentialsFile)'),
        ),
        // S3's bucket name rules (3-63 lower-case letters, digits, "." and "-").
        bucket: z
          .string()
          .check(z.regex(/^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$/, 'must be an S3 bucket name (3-63 of a-z, 0-9, "." and "-")')),
        prefix: z._default(
          z.string().check(
            z.regex(/^([A-Za-z0-9._-]+\/)*$/, 'must be empty or path segments each ending in "/", e.g. "cluster-a/"'),
            z.refine((p) => !p.split('/').some((s) => s === '.' || s === '..'), 'must not have "." or ".." segments'),
            z.maxLength(512),
          ),
          '',
        ),
        region: z.optional(z.string().check(z.regex(/^[a-z0-9-]{1,64}$/, 'must be a region name, e.g. us-east-1'))),
        credentialsFile: z.optional(absolutePath),
        credentialsDir: z.optional(absolutePath),
        caFile: z.optional(absolutePath),
        ...backupKeys,
      })
      .check(
        z.refine(
          (t) => (t.credentialsFile === undefined) !== (t.credentialsDir === undefined),
          'an S3 target needs exactly one of credentialsFile (a JSON file) and credentialsDir (a Kubernetes secret volume)',
        ),
      ),
  ]);
  const nodeName = z
    .string()
    .check(z.regex(/^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$/, 'must be a lower-case host name as kubelet reports it'), z.maxLength(253));
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
    nodeName: z.optional(nodeName),
    singleNode: z.optional(nodeName),
    oneHost: z.optional(z.boolean()),
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
    backupTarget: z.optional(backupTarget),
    lazyCreate: z._default(z.boolean(), true),
    namespaceQuota: z.optional(z.strictObject({ volumes: z.optional(integer(0)), bytes: z.optional(size) })),
    abandonedTicketSeconds: z._default(integer(0), 900),
    freezeSeconds: z._default(integer(0, 60), 5),
    manualAttach: z._default(
      z.strictObject({
        mountRoot: z._default(absolutePath, '/var/lib/latch/manual'),
        exec: z._default(z.boolean(), false),
      }),
      { mountRoot: '/var/lib/latch/manual', exec: false },
    ),
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

let schema: ReturnType<typeof buildSchema> | undefined;
let english = false;

/**
 * The configuration as the schema reads it (defaults applied), or a ConfigError naming `source` and the field.
 * @public (config.ts requires this module on first use, which knip does not follow)
 */
export function validateConfig(raw: unknown, source: string): z.output<ReturnType<typeof buildSchema>> {
  if (!schema) {
    // A process validates once or twice: zod's compiled fast path for objects (new Function per object schema)
    // would cost more than it saves.
    z.config({ jitless: true });
    schema = buildSchema();
  }
  let result = schema.safeParse(raw);
  if (!result.success && !english) {
    // zod/mini has no messages for the checks that carry none of ours ("Too big: expected number to be <=480") until
    // a locale is configured; configured only when a value fails, since almost every configuration is valid.
    english = true;
    z.config(z.locales.en());
    result = schema.safeParse(raw);
  }
  if (result.success) return result.data;
  const issue = result.error.issues[0];
  if (!issue) throw new ConfigError(`invalid configuration in ${source}`);
  const field = issue.path.length > 0 ? issue.path.join('.') : '(top level)';
  const detail = issue.code === 'unrecognized_keys' ? `unknown field(s) ${issue.keys.map((k) => `"${k}"`).join(', ')}` : issue.message;
  throw new ConfigError(`invalid configuration in ${source}: field "${field}": ${detail}`);
}

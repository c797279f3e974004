// The options JSON kubelet and the controller pass: Go's json.Marshal of a map[string]string,
// the kubernetes.io/* keys plus the user's flexVolume.options (docs/protocol.md, "The options JSON").
import * as z from 'zod/mini';
import { failTransform, parseWithMessages, type Config } from '../config.js';
import type { FsType } from '../filesystems.js';
import { LatchError } from '../errors.js';
import { LATCH_OPTIONS, checkPvName, checkVolumeName } from '../names.js';
import { parseSize } from '../size.js';

const MOUNT_OPTION_ALLOWLIST = [
  'noatime',
  'nodiratime',
  'relatime',
  'strictatime',
  'lazytime',
  'nodev',
  'nosuid',
  'noexec',
  'discard',
  'nodiscard',
  'sync',
  'dirsync',
] as const;

/** How many unknown option names a log line lists, and how long each may be: a log line stays bounded. */
const MAX_UNKNOWN_LISTED = 20;
const MAX_UNKNOWN_NAME = 64;

const K8S = 'kubernetes.io/';
const SECRET_PREFIX = 'kubernetes.io/secret/';
const KNOWN_K8S_KEYS = new Set([
  'kubernetes.io/fsType',
  'kubernetes.io/readwrite',
  'kubernetes.io/pvOrVolumeName',
  'kubernetes.io/pod.name',
  'kubernetes.io/pod.namespace',
  'kubernetes.io/pod.uid',
  'kubernetes.io/serviceAccount.name',
  'kubernetes.io/mounterArgs.FsGroup',
]);

export interface PodInfo {
  name?: string;
  namespace?: string;
  uid?: string;
  serviceAccount?: string;
}

export interface VolumeOptions {
  /** The user's `volume` option, when given: the volume's stable name. */
  volume?: string;
  /** What Kubernetes calls it: the PV name or the inline volume name. */
  pvOrVolumeName?: string;
  /** The name to use before any ledger look-up: `volume`, else `kubernetes.io/pvOrVolumeName`. */
  name: string;
  /** Size in bytes, when the user asked for one. */
  size?: number;
  /** fsType asked for (user `fsType`, else a non-empty `kubernetes.io/fsType`). */
  fsType?: FsType;
  readOnly: boolean;
  mountOptions: string[];
  pod?: PodInfo;
  fsGroup?: number;
  /** Decoded `kubernetes.io/secret/*` values. Never log these, never put them in a message or on a command line. */
  secrets: Record<string, string>;
  /**
   * Names of the user's options latch does not know (another tool's, like the spec's `fooServer`), sorted, for the
   * call's log line. Only names: their values are dropped, they may be secrets.
   */
  unknownKeys: string[];
}

/**
 * The latch option that `key` is probably a misspelling of, or undefined. The rule (docs/protocol.md): a key that
 * equals one of latch's options ignoring case, or, when it has at least 4 characters, is within an edit distance of
 * 2 of one, ignoring case (an edit inserts, deletes or replaces a character, or swaps two adjacent ones).
 * `sise`, `Size`, `fstype`, `readonly` are misspellings; `fooServer`, `vol`, `pool` are someone else's options.
 */
export function misspelledOptionOf(key: string): string | undefined {
  const lower = key.toLowerCase();
  const exact = LATCH_OPTIONS.find((o) => o.toLowerCase() === lower);
  if (exact !== undefined || key.length < 4) return exact;
  let best: { option: string; distance: number } | undefined;
  for (const option of LATCH_OPTIONS) {
    const distance = editDistance(lower, option.toLowerCase(), 2);
    if (distance <= 2 && (best === undefined || distance < best.distance)) best = { option, distance };
  }
  return best?.option;
}

/** Optimal-string-alignment distance between a and b, or limit + 1 once it is certain to exceed limit. */
function editDistance(a: string, b: string, limit: number): number {
  if (Math.abs(a.length - b.length) > limit) return limit + 1;
  const width = b.length + 1;
  const d = new Array<number>((a.length + 1) * width).fill(0);
  const at = (i: number, j: number) => d[i * width + j] ?? 0;
  for (let i = 0; i <= a.length; i++) d[i * width] = i;
  for (let j = 0; j <= b.length; j++) d[j] = j;
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let best = Math.min(at(i - 1, j) + 1, at(i, j - 1) + 1, at(i - 1, j - 1) + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) best = Math.min(best, at(i - 2, j - 2) + 1);
      d[i * width + j] = best;
    }
  }
  return at(a.length, b.length);
}

/** Parses the JSON argument. Every error names the offending field and never echoes a secret. */
export function parseOptions(json: string, config: Pick<Config, 'allowedFsTypes' | 'maxSize'>): VolumeOptions {
  if (json.trim() === '') throw new LatchError('the options argument is empty; expected a JSON object');
  let raw: unknown;
  try {
    raw = JSON.parse(json);
  } catch (err) {
    throw new LatchError(`the options argument is not valid JSON (${(err as Error).message})`);
  }
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) {
    throw new LatchError(`the options argument must be a JSON object, not ${Array.isArray(raw) ? 'an array' : describe(raw)}`);
  }
  // The options are a free-form dictionary (the FlexVolume spec): other keys are accepted, except likely typos of ours.
  const unknownKeys: string[] = [];
  for (const key of Object.keys(raw)) {
    if (key.startsWith(K8S) || (LATCH_OPTIONS as readonly string[]).includes(key)) continue;
    const meant = misspelledOptionOf(key);
    if (meant !== undefined) throw new LatchError(`unknown option "${key.slice(0, MAX_UNKNOWN_NAME)}": did you mean "${meant}"?`);
    unknownKeys.push(key);
  }

  const result = parseWithMessages(cachedOptionsSchema(config), raw);
  if (!result.success) {
    const issue = result.error.issues[0];
    if (!issue) throw new LatchError('the options argument is not valid');
    const field = String(issue.path[0] ?? '');
    if (issue.code === 'invalid_type') {
      const what = field.startsWith(SECRET_PREFIX) ? 'a base64 string' : 'a string (FlexVolume options are strings)';
      throw new LatchError(`option "${field}" must be ${what}, not ${describe((raw as Record<string, unknown>)[field])}`);
    }
    throw new LatchError(issue.message.startsWith('option "') ? issue.message : `option "${field}" ${issue.message}`);
  }
  const o = result.data;

  const secrets: Record<string, string> = {};
  for (const [key, value] of Object.entries(o)) {
    if (key.startsWith(SECRET_PREFIX)) secrets[key.slice(SECRET_PREFIX.length)] = value as string;
  }
  const volume = o.volume;
  const pvOrVolumeName = o['kubernetes.io/pvOrVolumeName'];
  // The PV name is the volume's name unless "volume" says otherwise; as a volume name it must fit a file name.
  const name =
    volume ?? (pvOrVolumeName === undefined ? undefined : checkVolumeName(pvOrVolumeName, 'option "kubernetes.io/pvOrVolumeName"'));
  if (name === undefined) throw new LatchError('the options name no volume: set "volume", or pass "kubernetes.io/pvOrVolumeName"');
  const k8sFsType = o['kubernetes.io/fsType'];
  const fsType = o.fsType ?? (k8sFsType === '' ? undefined : k8sFsType);

  const pod: PodInfo = {};
  if (o['kubernetes.io/pod.name']) pod.name = o['kubernetes.io/pod.name'];
  if (o['kubernetes.io/pod.namespace']) pod.namespace = o['kubernetes.io/pod.namespace'];
  if (o['kubernetes.io/pod.uid']) pod.uid = o['kubernetes.io/pod.uid'];
  if (o['kubernetes.io/serviceAccount.name']) pod.serviceAccount = o['kubernetes.io/serviceAccount.name'];
  const fsGroup = o['kubernetes.io/mounterArgs.FsGroup'];

  return {
    ...(volume !== undefined && { volume }),
    ...(pvOrVolumeName !== undefined && { pvOrVolumeName }),
    name,
    ...(o.size !== undefined && { size: o.size }),
    ...(fsType !== undefined && { fsType }),
    readOnly: o['kubernetes.io/readwrite'] === 'ro' || o.readOnly === 'true',
    mountOptions: o.mountOptions ?? [],
    ...(Object.keys(pod).length > 0 && { pod }),
    ...(fsGroup !== undefined && { fsGroup }),
    secrets,
    unknownKeys: unknownKeys
      .sort()
      .slice(0, MAX_UNKNOWN_LISTED)
      .map((key) => key.slice(0, MAX_UNKNOWN_NAME)),
  };
}

const schemas = new Map<string, ReturnType<typeof optionsSchema>>();

/** The options schema for these limits, built once per process. */
function cachedOptionsSchema(config: Pick<Config, 'allowedFsTypes' | 'maxSize'>) {
  const key = `${config.allowedFsTypes.join(',')}|${config.maxSize}`;
  let schema = schemas.get(key);
  if (!schema) schemas.set(key, (schema = optionsSchema(config)));
  return schema;
}

/**
 * The options schema, for the configured limits. Built only by ops that take options,
 * so init never pays for it. Unknown keys pass (newer kubelets add kubernetes.io/* ones, other tools their own); the
 * likely misspellings of latch's options were refused before.
 */
function optionsSchema(config: Pick<Config, 'allowedFsTypes' | 'maxSize'>) {
  const text = z.string();
  const name = (field: string, check: typeof checkVolumeName) =>
    z.pipe(
      text,
      z.transform((value: string, ctx) => {
        try {
          return check(value, `option "${field}"`);
        } catch (err) {
          return failTransform(ctx, (err as Error).message);
        }
      }),
    );
  const fsType = (field: string) =>
    text.check(
      z.refine((v) => v === '' || (config.allowedFsTypes as readonly string[]).includes(v), {
        error: (issue) =>
          `option "${field}" is "${String(issue.input).slice(0, 32)}"; allowed filesystem types are ${config.allowedFsTypes.join(', ')}`,
      }),
    );
  const shape = {
    'kubernetes.io/fsType': z.optional(fsType('kubernetes.io/fsType')),
    'kubernetes.io/readwrite': z.optional(
      z.enum(['ro', 'rw'], {
        error: (i) => `option "kubernetes.io/readwrite" must be "ro" or "rw", not "${String(i.input).slice(0, 16)}"`,
      }),
    ),
    'kubernetes.io/pvOrVolumeName': z.optional(name('kubernetes.io/pvOrVolumeName', checkPvName)),
    'kubernetes.io/pod.name': z.optional(text),
    'kubernetes.io/pod.namespace': z.optional(text),
    'kubernetes.io/pod.uid': z.optional(text),
    'kubernetes.io/serviceAccount.name': z.optional(text),
    'kubernetes.io/mounterArgs.FsGroup': z.optional(
      z.pipe(
        text.check(
          z.refine((v) => v === '' || (/^[0-9]{1,10}$/.test(v) && Number(v) <= 0xffffffff), {
            error: (i) => `option "kubernetes.io/mounterArgs.FsGroup" must be a decimal group id, not "${String(i.input).slice(0, 32)}"`,
          }),
        ),
        z.transform((v: string) => (v === '' ? undefined : Number(v))),
      ),
    ),
    volume: z.optional(name('volume', checkVolumeName)),
    size: z.optional(
      z.pipe(
        text,
        z.transform((value: string, ctx) => {
          try {
            const bytes = parseSize(value, 'option "size"');
            if (bytes > config.maxSize)
              return failTransform(ctx, `option "size" (${value}) is above the configured maxSize of ${config.maxSize} bytes`);
            return bytes;
          } catch (err) {
            return failTransform(ctx, (err as Error).message);
          }
        }),
      ),
    ),
    fsType: z.optional(
      z.pipe(
        fsType('fsType'),
        z.transform((v: string) => (v === '' ? undefined : (v as FsType))),
      ),
    ),
    readOnly: z.optional(
      z.enum(['true', 'false'], { error: (i) => `option "readOnly" must be "true" or "false", not "${String(i.input).slice(0, 16)}"` }),
    ),
    mountOptions: z.optional(
      z.pipe(
        text,
        z.transform((value: string, ctx) => {
          const options = [
            ...new Set(
              value
                .split(',')
                .map((o) => o.trim())
                .filter((o) => o !== ''),
            ),
          ];
          const bad = options.find((o) => !(MOUNT_OPTION_ALLOWLIST as readonly string[]).includes(o));
          if (bad !== undefined)
            return failTransform(
              ctx,
              `option "mountOptions" contains "${bad.slice(0, 32)}", which is not allowed; allowed: ${MOUNT_OPTION_ALLOWLIST.join(', ')}`,
            );
          return options;
        }),
      ),
    ),
  };
  // kubernetes.io/* keys and other tools' options reach here: strings, like every value. Secrets are checked and
  // decoded below without echoing their value; the unknown keys are dropped (parseOptions lists their names).
  const withSecretsChecked = z.catchall(z.object(shape), text).check(
    z.superRefine((o, ctx) => {
      for (const [key, value] of Object.entries(o)) {
        if (!key.startsWith(SECRET_PREFIX)) continue;
        if (typeof value !== 'string' || !/^[A-Za-z0-9+/]*={0,2}$/.test(value) || value.length % 4 !== 0) {
          ctx.addIssue({
            code: 'custom',
            path: [key],
            message: `option "${key}" is not valid base64 (kubelet base64-encodes secret values)`,
          });
        }
      }
    }),
  );
  return z.pipe(
    withSecretsChecked,
    z.transform((o: z.output<typeof withSecretsChecked>) => {
      const out: Record<string, unknown> = { ...o };
      for (const key of Object.keys(out)) {
        if (key.startsWith(SECRET_PREFIX)) out[key] = Buffer.from(out[key] as string, 'base64').toString('utf8');
        else if (key.startsWith(K8S) ? !KNOWN_K8S_KEYS.has(key) : !(LATCH_OPTIONS as readonly string[]).includes(key)) delete out[key];
      }
      return out as typeof o & { fsType?: FsType; 'kubernetes.io/fsType'?: FsType | '' };
    }),
  );
}

function describe(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  return `a ${typeof value}`;
}

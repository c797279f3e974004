// The options JSON kubelet and the controller pass: Go's json.Marshal of a map[string]string,
// the kubernetes.io/* keys plus the user's flexVolume.options (docs/protocol.md, "The options JSON").
import type { Config } from '../config.js';
import type { FsType } from '../filesystems.js';
import { LatchError } from '../errors.js';
import { K8S_OPTION_PREFIX, LATCH_OPTIONS, SECRET_OPTION_PREFIX, checkNamespaceName, checkPvName, checkVolumeName } from '../names.js';
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
  /** `accessMode: ReadWriteMany`: the volume is (or is created as) a shared CephFS volume (docs/protocol.md). */
  shared?: boolean;
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
    if (key.startsWith(K8S_OPTION_PREFIX) || (LATCH_OPTIONS as readonly string[]).includes(key)) continue;
    const meant = misspelledOptionOf(key);
    if (meant !== undefined) throw new LatchError(`unknown option "${key.slice(0, MAX_UNKNOWN_NAME)}": did you mean "${meant}"?`);
    unknownKeys.push(key);
  }

  const o = checkValues(raw as Record<string, unknown>, config);

  const secrets: Record<string, string> = {};
  for (const [key, value] of Object.entries(raw as Record<string, string>)) {
    if (key.startsWith(SECRET_OPTION_PREFIX))
      secrets[key.slice(SECRET_OPTION_PREFIX.length)] = Buffer.from(value, 'base64').toString('utf8');
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
    ...(o.accessMode === 'ReadWriteMany' && { shared: true }),
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

/** The values of latch's options and of the kubernetes.io/* keys it reads, checked and parsed. */
interface CheckedValues {
  'kubernetes.io/fsType'?: FsType | '';
  'kubernetes.io/readwrite'?: string;
  'kubernetes.io/pvOrVolumeName'?: string;
  'kubernetes.io/pod.name'?: string;
  'kubernetes.io/pod.namespace'?: string;
  'kubernetes.io/pod.uid'?: string;
  'kubernetes.io/serviceAccount.name'?: string;
  'kubernetes.io/mounterArgs.FsGroup'?: number;
  volume?: string;
  size?: number;
  fsType?: FsType;
  readOnly?: string;
  mountOptions?: string[];
  accessMode?: string;
}

type Limits = Pick<Config, 'allowedFsTypes' | 'maxSize'>;

/**
 * How each option latch reads is checked and parsed: its value is a string (checked before), the result is what
 * VolumeOptions is made of (undefined: as if absent). Each throws a message naming the option. Plain code rather than
 * a schema: every rule here is a check of one string of ours, which a schema library would only wrap.
 */
const VALUE_CHECKS: { [K in keyof CheckedValues]-?: (value: string, limits: Limits) => CheckedValues[K] } = {
  'kubernetes.io/fsType': (value, limits) => (value === '' ? '' : allowedFsType('kubernetes.io/fsType', value, limits)),
  'kubernetes.io/readwrite': (value) => {
    if (value !== 'ro' && value !== 'rw')
      throw new LatchError(`option "kubernetes.io/readwrite" must be "ro" or "rw", not "${value.slice(0, 16)}"`);
    return value;
  },
  'kubernetes.io/pvOrVolumeName': (value) => checkPvName(value, 'option "kubernetes.io/pvOrVolumeName"'),
  'kubernetes.io/pod.name': (value) => value,
  // A namespace is recorded on the volumes its pods create and named in messages: a DNS label, as Kubernetes makes them.
  'kubernetes.io/pod.namespace': (value) => (value === '' ? value : checkNamespaceName(value, 'option "kubernetes.io/pod.namespace"')),
  'kubernetes.io/pod.uid': (value) => value,
  'kubernetes.io/serviceAccount.name': (value) => value,
  'kubernetes.io/mounterArgs.FsGroup': (value) => {
    if (value === '') return undefined;
    if (!/^[0-9]{1,10}$/.test(value) || Number(value) > 0xffffffff)
      throw new LatchError(`option "kubernetes.io/mounterArgs.FsGroup" must be a decimal group id, not "${value.slice(0, 32)}"`);
    return Number(value);
  },
  volume: (value) => checkVolumeName(value, 'option "volume"'),
  size: (value, limits) => {
    const bytes = parseSize(value, 'option "size"');
    if (bytes > limits.maxSize) throw new LatchError(`option "size" (${value}) is above the configured maxSize of ${limits.maxSize} bytes`);
    return bytes;
  },
  fsType: (value, limits) => (value === '' ? undefined : allowedFsType('fsType', value, limits)),
  readOnly: (value) => {
    if (value !== 'true' && value !== 'false')
      throw new LatchError(`option "readOnly" must be "true" or "false", not "${value.slice(0, 16)}"`);
    return value;
  },
  accessMode: (value) => {
    if (value !== 'ReadWriteOnce' && value !== 'ReadOnlyMany' && value !== 'ReadWriteMany') {
      throw new LatchError(`option "accessMode" must be ReadWriteOnce, ReadOnlyMany or ReadWriteMany, not "${value.slice(0, 24)}"`);
    }
    return value;
  },
  mountOptions: (value) => {
    const options = [
      ...new Set(
        value
          .split(',')
          .map((o) => o.trim())
          .filter((o) => o !== ''),
      ),
    ];
    const bad = options.find((o) => !(MOUNT_OPTION_ALLOWLIST as readonly string[]).includes(o));
    if (bad !== undefined) {
      throw new LatchError(
        `option "mountOptions" contains "${bad.slice(0, 32)}", which is not allowed; allowed: ${MOUNT_OPTION_ALLOWLIST.join(', ')}`,
      );
    }
    return options;
  },
};

function allowedFsType(field: string, value: string, limits: Limits): FsType {
  if (!(limits.allowedFsTypes as readonly string[]).includes(value))
    throw new LatchError(`option "${field}" is "${value.slice(0, 32)}"; allowed filesystem types are ${limits.allowedFsTypes.join(', ')}`);
  return value as FsType;
}

/**
 * Checks every value of the options: all are strings (FlexVolume options are), the ones latch reads by their rules,
 * the secrets as base64, in that order (the first problem is reported). Returns the parsed values latch reads.
 */
function checkValues(raw: Record<string, unknown>, limits: Limits): CheckedValues {
  const checked: Record<string, unknown> = {};
  for (const [key, check] of Object.entries(VALUE_CHECKS) as [keyof CheckedValues, (v: string, l: Limits) => unknown][]) {
    if (!Object.hasOwn(raw, key) || raw[key] === undefined) continue;
    const value = raw[key];
    if (typeof value !== 'string')
      throw new LatchError(`option "${key}" must be a string (FlexVolume options are strings), not ${describe(value)}`);
    const parsed = check(value, limits);
    if (parsed !== undefined) checked[key] = parsed;
  }
  for (const [key, value] of Object.entries(raw)) {
    if (typeof value === 'string') continue;
    const what = key.startsWith(SECRET_OPTION_PREFIX) ? 'a base64 string' : 'a string (FlexVolume options are strings)';
    throw new LatchError(`option "${key}" must be ${what}, not ${describe(value)}`);
  }
  for (const [key, value] of Object.entries(raw as Record<string, string>)) {
    if (key.startsWith(SECRET_OPTION_PREFIX) && (!/^[A-Za-z0-9+/]*={0,2}$/.test(value) || value.length % 4 !== 0))
      throw new LatchError(`option "${key}" is not valid base64 (kubelet base64-encodes secret values)`);
  }
  return checked;
}

function describe(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  return `a ${typeof value}`;
}

// The options JSON kubelet and the controller pass: Go's json.Marshal of a map[string]string,
// the kubernetes.io/* keys plus the user's flexVolume.options (see PROTOCOL.md "The options JSON").
import type { Config, FsType } from '../config.js';
import { LatchError } from '../errors.js';
import { checkVolumeName } from '../names.js';
import { parseSize } from '../size.js';

export const MOUNT_OPTION_ALLOWLIST = [
  'noatime', 'nodiratime', 'relatime', 'strictatime', 'lazytime',
  'nodev', 'nosuid', 'noexec', 'discard', 'nodiscard', 'sync', 'dirsync',
] as const;

/** latch's own options, as a user writes them in flexVolume.options. */
export const USER_OPTIONS = ['volume', 'size', 'fsType', 'readOnly', 'mountOptions'] as const;

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
    throw new LatchError(`the options argument must be a JSON object, not ${Array.isArray(raw) ? 'an array' : typeof raw}`);
  }

  const values: Record<string, string> = {};
  const secrets: Record<string, string> = {};
  for (const [key, value] of Object.entries(raw)) {
    if (key.startsWith(SECRET_PREFIX)) {
      // Checked without echoing the value.
      if (typeof value !== 'string') throw new LatchError(`option "${key}" must be a base64 string`);
      secrets[key.slice(SECRET_PREFIX.length)] = decodeSecret(key, value);
      continue;
    }
    if (typeof value !== 'string') {
      throw new LatchError(`option "${key}" must be a string (FlexVolume options are strings), not ${describe(value)}`);
    }
    if (!key.startsWith(K8S) && !(USER_OPTIONS as readonly string[]).includes(key)) {
      throw new LatchError(`unknown option "${key.slice(0, 64)}"; latch understands ${USER_OPTIONS.join(', ')}`);
    }
    // Unknown kubernetes.io/* keys are ignored: newer kubelets may add some.
    if (key.startsWith(K8S) && !KNOWN_K8S_KEYS.has(key)) continue;
    values[key] = value;
  }

  const volume = values.volume !== undefined ? checkVolumeName(values.volume, 'option "volume"') : undefined;
  const pvOrVolumeName =
    values['kubernetes.io/pvOrVolumeName'] !== undefined
      ? checkVolumeName(values['kubernetes.io/pvOrVolumeName'], 'option "kubernetes.io/pvOrVolumeName"')
      : undefined;
  const name = volume ?? pvOrVolumeName;
  if (name === undefined) {
    throw new LatchError('the options name no volume: set "volume", or pass "kubernetes.io/pvOrVolumeName"');
  }

  let size: number | undefined;
  if (values.size !== undefined) {
    size = parseSize(values.size, 'option "size"');
    if (size > config.maxSize) {
      throw new LatchError(`option "size" (${values.size}) is above the configured maxSize of ${config.maxSize} bytes`);
    }
  }

  const fsType = pickFsType(values, config.allowedFsTypes);
  const readOnly = parseReadOnly(values);
  const mountOptions = parseMountOptions(values.mountOptions);

  let fsGroup: number | undefined;
  const fsGroupText = values['kubernetes.io/mounterArgs.FsGroup'];
  if (fsGroupText !== undefined && fsGroupText !== '') {
    if (!/^[0-9]{1,10}$/.test(fsGroupText) || Number(fsGroupText) > 0xffffffff) {
      throw new LatchError(`option "kubernetes.io/mounterArgs.FsGroup" must be a decimal group id, not "${fsGroupText.slice(0, 32)}"`);
    }
    fsGroup = Number(fsGroupText);
  }

  const pod: PodInfo = {};
  if (values['kubernetes.io/pod.name']) pod.name = values['kubernetes.io/pod.name'];
  if (values['kubernetes.io/pod.namespace']) pod.namespace = values['kubernetes.io/pod.namespace'];
  if (values['kubernetes.io/pod.uid']) pod.uid = values['kubernetes.io/pod.uid'];
  if (values['kubernetes.io/serviceAccount.name']) pod.serviceAccount = values['kubernetes.io/serviceAccount.name'];

  return {
    ...(volume !== undefined && { volume }),
    ...(pvOrVolumeName !== undefined && { pvOrVolumeName }),
    name,
    ...(size !== undefined && { size }),
    ...(fsType !== undefined && { fsType }),
    readOnly,
    mountOptions,
    ...(Object.keys(pod).length > 0 && { pod }),
    ...(fsGroup !== undefined && { fsGroup }),
    secrets,
  };
}

function pickFsType(values: Record<string, string>, allowed: readonly FsType[]): FsType | undefined {
  const user = values.fsType;
  const k8s = values['kubernetes.io/fsType'];
  const [field, text] = user !== undefined ? ['fsType', user] : ['kubernetes.io/fsType', k8s];
  if (text === undefined || text === '') return undefined;
  if (!(allowed as readonly string[]).includes(text)) {
    throw new LatchError(`option "${field}" is "${text.slice(0, 32)}"; allowed filesystem types are ${allowed.join(', ')}`);
  }
  return text as FsType;
}

function parseReadOnly(values: Record<string, string>): boolean {
  const rw = values['kubernetes.io/readwrite'];
  if (rw !== undefined && rw !== 'ro' && rw !== 'rw') {
    throw new LatchError(`option "kubernetes.io/readwrite" must be "ro" or "rw", not "${rw.slice(0, 16)}"`);
  }
  const user = values.readOnly;
  if (user !== undefined && user !== 'true' && user !== 'false') {
    throw new LatchError(`option "readOnly" must be "true" or "false", not "${user.slice(0, 16)}"`);
  }
  return rw === 'ro' || user === 'true';
}

function parseMountOptions(text: string | undefined): string[] {
  if (text === undefined || text.trim() === '') return [];
  const options = text.split(',').map((o) => o.trim()).filter((o) => o !== '');
  for (const option of options) {
    if (!(MOUNT_OPTION_ALLOWLIST as readonly string[]).includes(option)) {
      throw new LatchError(
        `option "mountOptions" contains "${option.slice(0, 32)}", which is not allowed; allowed: ${MOUNT_OPTION_ALLOWLIST.join(', ')}`,
      );
    }
  }
  return [...new Set(options)];
}

function decodeSecret(key: string, value: string): string {
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(value) || value.length % 4 !== 0) {
    throw new LatchError(`option "${key}" is not valid base64 (kubelet base64-encodes secret values)`);
  }
  return Buffer.from(value, 'base64').toString('utf8');
}

function describe(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  return `a ${typeof value}`;
}

// Volume names become file names in the pool and state directories, so they are checked before they touch a path.
import { LatchError } from './errors.js';

// Kubernetes names (PVs, nodes) may have 253 characters. A volume's name also names its image file
// (`<name>.img`, at most 255 bytes), so it may have 250: a longer PV needs the `volume` option.
const MAX_KUBERNETES_NAME = 253;
const MAX_VOLUME_NAME = 250;
// Lower-case DNS-subdomain-like names: what PV names and inline volume names already are.
const VOLUME_NAME = /^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$/;

export const DEFAULT_DRIVER_NAME = 'latch/loop';
/** vendor/driver: kubelet makes the plugin directory `vendor~driver` of it. */
export const DRIVER_NAME_PATTERN = /^[a-z0-9][a-z0-9.-]*\/[a-z0-9][a-z0-9.-]*$/;

/**
 * latch's own options, as a user writes them in flexVolume.options. Here, among the base modules, because the options
 * parser checks them and the call log keeps only their values (any other user option may carry a secret).
 */
export const LATCH_OPTIONS = ['volume', 'size', 'fsType', 'readOnly', 'mountOptions', 'accessMode'] as const;

/** The options kubelet adds to the user's (`kubernetes.io/fsType`, `kubernetes.io/pod.uid`, ...). */
export const K8S_OPTION_PREFIX = 'kubernetes.io/';

/**
 * The options that carry a PV's secret, base64, one per key (`kubernetes.io/secret/<key>`): the options parser
 * decodes them, and the call log never writes their values.
 */
export const SECRET_OPTION_PREFIX = 'kubernetes.io/secret/';

/** Throws unless `name` is safe to use as a file name component; `what` names the field in the message. */
export function checkVolumeName(name: string, what = 'volume name', max = MAX_VOLUME_NAME): string {
  if (name.length === 0) throw new LatchError(`${what} is empty`);
  if (name.length > max) {
    throw new LatchError(
      `${what} is ${name.length} characters long; the limit is ${max}` +
        (max === MAX_VOLUME_NAME ? ' (for a longer PV name, set the "volume" option to a shorter name)' : ''),
    );
  }
  if (!VOLUME_NAME.test(name) || name.includes('..')) {
    throw new LatchError(
      `${what} ${JSON.stringify(name.slice(0, 64))} is not allowed: use lower-case letters, digits, '-', '.' and '_', ` +
        `starting and ending with a letter or digit`,
    );
  }
  return name;
}

/** PV and inline volume names as Kubernetes passes them: same characters, up to 253. */
export function checkPvName(name: string, what = 'PV name'): string {
  return checkVolumeName(name, what, MAX_KUBERNETES_NAME);
}

/** Node names come from kubelet (lower-cased hostnames) and from admins; they end up in documents and keys. */
export function checkNodeName(name: string, what = 'node name'): string {
  return checkVolumeName(name, what, MAX_KUBERNETES_NAME);
}

/** Kubernetes namespaces are DNS labels; latch records them on volumes and names them in messages. */
export function checkNamespaceName(name: string, what = 'namespace'): string {
  if (!/^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/.test(name)) {
    throw new LatchError(
      `${what} ${JSON.stringify(name.slice(0, 64))} is not a namespace name (lower-case letters, digits and '-', at most 63)`,
    );
  }
  return name;
}

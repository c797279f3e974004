// The kinds of positional argument FlexVolume ops take (docs/protocol.md, "The calls"). Each kind checks its own form and
// parses it, so an op receives typed values: options as VolumeOptions, byte counts as numbers, paths normalised.
import { isAbsolute, normalize } from 'node:path';
import type { Config } from '../config.js';
import { LatchError } from '../errors.js';
import type { CallLog } from '../log.js';
import { checkNodeName, checkPvName } from '../names.js';
import { parseOptions, type VolumeOptions } from './options.js';

/** Where an argument stands: for messages, the limits in the config, and the call's log line. */
interface ArgSite {
  op: string;
  name: string;
  config: Config;
  log: CallLog;
}

export interface ArgKind<T> {
  /** Whether kubelet may legitimately pass "" here (then the parser sees it). */
  readonly mayBeEmpty: boolean;
  parse(value: string, site: ArgSite): T;
}

const label = (site: ArgSite) => `${site.op}: argument <${site.name}>`;

/** The options JSON: Go's json.Marshal of the kubernetes.io/* keys and the user's options. */
export const volumeOptions: ArgKind<VolumeOptions> = {
  mayBeEmpty: false,
  parse(value, site) {
    const options = parseOptions(value, site.config);
    site.log.volume = options.name;
    // Names only, never values: another tool's options may hold a secret.
    if (options.unknownKeys.length > 0) site.log.unknownOptions = options.unknownKeys;
    return options;
  },
};

/** A node name as the controller passes it. */
export const nodeName: ArgKind<string> = {
  mayBeEmpty: false,
  parse(value, site) {
    return (site.log.node = checkNodeName(value, label(site)));
  },
};

/** A PV (or inline volume) name: all that detach gets. */
export const pvName: ArgKind<string> = {
  mayBeEmpty: false,
  parse(value, site) {
    return (site.log.volume = checkPvName(value, label(site)));
  },
};

/** A path from kubelet: absolute, no NUL, no `..` segments; normalised, without a trailing slash. */
export const path: ArgKind<string> = {
  mayBeEmpty: false,
  parse: checkPath,
};

/** A path kubelet may pass as "" (a device the controller could not know): undefined then. */
export const optionalPath: ArgKind<string | undefined> = {
  mayBeEmpty: true,
  parse: (value, site) => (value === '' ? undefined : checkPath(value, site)),
};

/** A decimal byte count. */
export const byteCount: ArgKind<number> = {
  mayBeEmpty: false,
  parse(value, site) {
    if (!/^[0-9]{1,17}$/.test(value)) throw new LatchError(`${label(site)} must be a byte count, not "${value.slice(0, 32)}"`);
    return Number(value);
  },
};

function checkPath(value: string, site: ArgSite): string {
  if (value.length > 4096 || value.includes('\0') || !isAbsolute(value) || value.split('/').includes('..')) {
    throw new LatchError(`${label(site)} must be an absolute path without "..", not ${JSON.stringify(value.slice(0, 80))}`);
  }
  const normal = normalize(value);
  return normal.length > 1 && normal.endsWith('/') ? normal.slice(0, -1) : normal;
}

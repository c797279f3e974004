// Volume names become file names in the pool and state directories, so they are checked before they touch a path.
import { LatchError } from './errors.js';

export const MAX_VOLUME_NAME = 200;
// Lower-case DNS-subdomain-like names: what PV names and inline volume names already are.
const VOLUME_NAME = /^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$/;

/** Throws unless `name` is safe to use as a file name component; `what` names the field in the message. */
export function checkVolumeName(name: string, what = 'volume name'): string {
  if (name.length === 0) throw new LatchError(`${what} is empty`);
  if (name.length > MAX_VOLUME_NAME) {
    throw new LatchError(`${what} is ${name.length} characters long; the limit is ${MAX_VOLUME_NAME}`);
  }
  if (!VOLUME_NAME.test(name) || name.includes('..')) {
    throw new LatchError(
      `${what} ${JSON.stringify(name.slice(0, 64))} is not allowed: use lower-case letters, digits, '-', '.' and '_', ` +
        `starting and ending with a letter or digit`,
    );
  }
  return name;
}

/** Node names come from kubelet (lower-cased hostnames) and from admins; same rule, they end up in documents and keys. */
export function checkNodeName(name: string, what = 'node name'): string {
  return checkVolumeName(name, what);
}

// Signing a backup made before the target had a key (manifest.ts, "Authentication"): the admin's explicit word that
// an unauthenticated backup is theirs. The backup is first checked whole, as verify does (every chunk read back, the
// image checksum recomputed), then its manifest is written again with the key's HMAC in place of its checksum.
// Holding the target's lock, so that no delete or gc runs meanwhile.
import { LatchError } from '../errors.js';
import { backupKey } from './keys.js';
import type { BackupTarget } from './layout.js';
import { checkTarget } from './store.js';
import type { LockOptions } from './lock.js';
import { withTargetLock } from './target-lock.js';
import { publishManifest, readCheckedManifest } from './manifest.js';
import { verifyManifest, type VerifyReport } from './verify.js';

export interface AuthenticateReport {
  /** false: it was authenticated already, and was left as it was. */
  signed: boolean;
  verify?: VerifyReport;
}

export async function authenticateBackup(options: {
  target: BackupTarget;
  name: string;
  node?: string;
  lock?: LockOptions;
}): Promise<AuthenticateReport> {
  const { target, name } = options;
  await checkTarget(target);
  if ((await backupKey(target)) === undefined) {
    throw new LatchError('no backup key is configured (backupTarget.keyFile): there is nothing to authenticate a backup with');
  }
  return withTargetLock(target, `authenticate backup ${name}`, { ...options.lock, node: options.node }, async (lock) => {
    const checked = await readCheckedManifest(target, name, { allowUnauthenticated: true });
    if (checked.authenticated) return { signed: false };
    const verify = await verifyManifest(target, checked);
    if (!verify.ok) return { signed: false, verify };
    await lock.check();
    await publishManifest(target, checked.manifest);
    return { signed: true, verify };
  });
}

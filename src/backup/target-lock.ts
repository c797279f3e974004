// The lock of any target: a directory's (lock.ts) or an S3 bucket's (s3-lock.ts, loaded only for an S3 target).
import type { BackupTarget } from './layout.js';
import { forgetOwner, newOwner, withDirLock, type HeldLock, type LockOptions } from './lock.js';

/** Runs `fn` holding the target's lock; `purpose` ("create backup X") is shown to whoever waits for it. */
export async function withTargetLock<T>(
  target: BackupTarget,
  purpose: string,
  options: LockOptions,
  fn: (lock: HeldLock) => Promise<T>,
): Promise<T> {
  const owner = newOwner(purpose, options);
  try {
    if (target.type === 's3') {
      const { withS3Lock } = await import('./s3-lock.js');
      return await withS3Lock(target, owner, options, fn);
    }
    return await withDirLock(target, owner, options, fn);
  } finally {
    forgetOwner(owner);
  }
}

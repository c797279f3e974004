// A target's store (target-store.ts): a directory's or an S3 bucket's, opened once per target object.
import type { BackupTarget } from './layout.js';
import type { TargetStore } from './target-store.js';

const stores = new WeakMap<BackupTarget, Promise<TargetStore>>();

/** The target's store (one per target object: an S3 client and its connections are made once). */
export function storeOf(target: BackupTarget): Promise<TargetStore> {
  let store = stores.get(target);
  if (store === undefined) {
    // The S3 client library is loaded only by backups to S3 (never by a driver call, nor by a directory target).
    store =
      target.type === 'dir'
        ? import('./dir-store.js').then(({ DirStore }) => new DirStore(target))
        : import('./s3-store.js').then(({ openS3Store }) => openS3Store(target));
    store.catch(() => stores.delete(target));
    stores.set(target, store);
  }
  return store;
}

/** Refuses a target that cannot be used, before anything is read or written (the directory is missing, S3 refuses). */
export async function checkTarget(target: BackupTarget): Promise<void> {
  await (await storeOf(target)).check();
}

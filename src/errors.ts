// A few named errors. Their messages are read by people in pod events and `kubectl describe`,
// so each one says what was wrong and, where it can, what to do about it.

/** Something the caller can fix: bad arguments, bad options, a refused request. Reply: Failure. */
export class LatchError extends Error {
  override name = 'LatchError';
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
  }
}

/** The configuration file is unreadable or invalid. */
export class ConfigError extends LatchError {
  override name = 'ConfigError';
}

/** The store (file or etcd) could not be read or written. Callers retry. */
export class StoreError extends LatchError {
  override name = 'StoreError';
}

/**
 * One stored document cannot be read as what it should be: not JSON, or not the shape its reader expects. The store
 * itself answers; only this document is damaged, so whoever reads many documents names it and goes on with the rest.
 */
export class DamagedDocumentError extends StoreError {
  override name = 'DamagedDocumentError';
}

/** A compare-and-swap lost against a concurrent writer; the caller re-reads and tries again. */
export class ConflictError extends StoreError {
  override name = 'ConflictError';
}

/** The operation is not available in this mode (e.g. `mount` while attach mode is on). Reply: Not supported. */
export class NotSupportedError extends LatchError {
  override name = 'NotSupportedError';
}

/**
 * A job that must be redone rather than failed: the world it read changed under it (a pod asked for the volume on the
 * job's node while a backup read the device), so nothing was published; the node agent runs it again at once.
 */
export class JobInterruptedError extends LatchError {
  override name = 'JobInterruptedError';
}

export function errorMessage(err: unknown): string {
  if (err instanceof Error) return err.message;
  return String(err);
}

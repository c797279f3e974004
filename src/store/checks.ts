// The checks every store makes of what it is given, with the store's name in the message: one kind, one revision
// and one value check for both the file and the etcd store.
import { LatchError, errorMessage } from '../errors.js';

/** What a kind (the first part of a key) may be. */
const KIND = /^[a-z]+$/;

export function checkKind(store: string, kind: string): void {
  if (!KIND.test(kind)) throw new LatchError(`${store} store: invalid kind ${JSON.stringify(kind)}`);
}

export function checkRevision(store: string, expectedRevision: number): void {
  if (!Number.isSafeInteger(expectedRevision) || expectedRevision < 0) {
    throw new LatchError(`${store} store: expected revision must be a non-negative integer, got ${String(expectedRevision)}`);
  }
}

/** The value as JSON text; refused when it has none (a function, undefined) or cannot have one (a cycle, a BigInt). */
export function encodeValue(store: string, key: string, value: unknown): string {
  let text: string | undefined;
  try {
    text = JSON.stringify(value);
  } catch (err) {
    throw new LatchError(`${store} store: the value for ${key} cannot be stored as JSON: ${errorMessage(err)}`, { cause: err });
  }
  if (text === undefined) throw new LatchError(`${store} store: the value for ${key} cannot be stored as JSON (${typeof value})`);
  return text;
}

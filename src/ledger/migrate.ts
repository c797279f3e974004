// Copying the ledger from one store to another (`latch ledger migrate`): every volume document and PV alias, key by
// key, each with a compare-and-swap write. Safe to repeat: a key whose destination already holds the same content
// is skipped. A key whose destination holds *different* content is refused (it may be newer: a driver may already
// be running on the destination store) unless `overwrite`. Keys that exist only in the destination are left alone.
// The source is never changed.
import { isDeepStrictEqual } from 'node:util';
import { ConflictError } from '../errors.js';
import type { Store } from '../store/types.js';
import { LEDGER_KINDS } from './keys.js';

type MigrationAction = 'copied' | 'overwritten' | 'skipped' | 'refused';

interface MigrationEntry {
  key: string;
  action: MigrationAction;
  detail?: string;
}

export interface MigrationReport {
  from: string;
  to: string;
  dryRun: boolean;
  counts: Record<MigrationAction, number> & { onlyInDestination: number };
  entries: MigrationEntry[];
  /** Keys present in the destination but not in the source: left alone. */
  onlyInDestination: string[];
}

export interface MigrateOptions {
  /** Replace destination documents whose content differs. */
  overwrite?: boolean;
  /** Decide and report, write nothing. */
  dryRun?: boolean;
  /** How the stores are named in the report. */
  fromName?: string;
  toName?: string;
}

/** Copies every ledger key from `from` to `to` (see the top of this file for the rules). */
export async function migrateLedger(from: Store, to: Store, options: MigrateOptions = {}): Promise<MigrationReport> {
  const entries: MigrationEntry[] = [];
  const onlyInDestination: string[] = [];
  for (const kind of LEDGER_KINDS) {
    const names = await from.list(kind);
    const source = new Set(names);
    for (const name of names) {
      const entry = await migrateKey(from, to, `${kind}/${name}`, options);
      if (entry) entries.push(entry);
    }
    for (const name of await to.list(kind)) if (!source.has(name)) onlyInDestination.push(`${kind}/${name}`);
  }
  const counts = { copied: 0, overwritten: 0, skipped: 0, refused: 0, onlyInDestination: onlyInDestination.length };
  for (const e of entries) counts[e.action]++;
  return {
    from: options.fromName ?? from.kind,
    to: options.toName ?? to.kind,
    dryRun: options.dryRun ?? false,
    counts,
    entries,
    onlyInDestination,
  };
}

/** One key; re-decides when the destination changes under us. Undefined when the source key vanished meanwhile. */
async function migrateKey(from: Store, to: Store, key: string, options: MigrateOptions): Promise<MigrationEntry | undefined> {
  for (let attempt = 1; ; attempt++) {
    const src = await from.get(key);
    if (src === undefined) return undefined;
    const dst = await to.get(key);
    let action: MigrationAction;
    if (dst === undefined) action = 'copied';
    else if (isDeepStrictEqual(dst.value, src.value)) return { key, action: 'skipped', detail: 'identical' };
    else if (options.overwrite) action = 'overwritten';
    else {
      return {
        key,
        action: 'refused',
        detail:
          `the destination holds different content (revision ${dst.revision}), which may be newer; ` +
          'compare the two, then repeat with --overwrite to replace it',
      };
    }
    if (options.dryRun) return { key, action, detail: 'dry run: nothing written' };
    try {
      await to.put(key, src.value, dst?.revision ?? 0);
      return { key, action };
    } catch (err) {
      if (!(err instanceof ConflictError)) throw err;
      if (attempt >= 3) {
        return { key, action: 'refused', detail: 'the destination kept changing during the migration: is a driver writing to it?' };
      }
    }
  }
}

// latch ledger migrate: copy the ledger between the file store and etcd, in either direction.
//
// Copies every volume document (kind `volumes`) and every PV alias (kind `pvs`) from one store to the other, key by
// key, each with a compare-and-swap write. Safe to repeat: a key whose destination already holds the same content
// is skipped. A key whose destination holds *different* content is refused (it may be newer: a driver may already
// be running on the destination store) unless --overwrite. Keys that exist only in the destination are left alone.
// The source is never changed. Exit code 1 when any key was refused, so scripts notice an incomplete migration.
//
// Settings: the file store is the config's stateDir (or --state-dir); etcd is the config's `store` when it is etcd,
// with any --etcd-* flag taking precedence (so a node still on the file store can migrate with --etcd-endpoints).
import { isDeepStrictEqual } from 'node:util';
import type { Command } from 'commander';
import { loadConfig, type Config, type EtcdStoreConfig } from '../config.js';
import { ConflictError, LatchError } from '../errors.js';
import type { Store } from '../store/types.js';
import { parseFormat, printJson, printTable, type OutputFormat } from './output.js';

/** The kinds of key the ledger keeps: volume documents and PV-name aliases. */
export const LEDGER_KINDS = ['volumes', 'pvs'] as const;

export type MigrationAction = 'copied' | 'overwritten' | 'skipped' | 'refused';

export interface MigrationEntry {
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

type StoreName = 'file' | 'etcd';

interface MigrateFlags {
  from: string;
  to: string;
  stateDir?: string;
  etcdEndpoints?: string;
  etcdPrefix?: string;
  etcdCa?: string;
  etcdCert?: string;
  etcdKey?: string;
  etcdTimeoutMs?: string;
  overwrite?: boolean;
  dryRun?: boolean;
  output: OutputFormat;
}

function storeName(value: string, flag: string): StoreName {
  if (value !== 'file' && value !== 'etcd') throw new LatchError(`${flag} must be "file" or "etcd", not "${value}"`);
  return value;
}

/** The etcd settings: the config's etcd store, overridden by the --etcd-* flags. */
export function etcdSettings(config: Config, flags: Partial<MigrateFlags>): EtcdStoreConfig {
  const base: Partial<EtcdStoreConfig> = config.store.type === 'etcd' ? config.store : {};
  const endpoints =
    flags.etcdEndpoints !== undefined
      ? flags.etcdEndpoints
          .split(',')
          .map((e) => e.trim())
          .filter(Boolean)
      : base.endpoints;
  if (!endpoints || endpoints.length === 0) {
    throw new LatchError(
      `no etcd endpoints: the configuration (${config.source}) uses the ${config.store.type} store; ` +
        'give --etcd-endpoints https://host:2379[,...]',
    );
  }
  let timeoutMs = base.timeoutMs ?? 5000;
  if (flags.etcdTimeoutMs !== undefined) {
    timeoutMs = Number(flags.etcdTimeoutMs);
    if (!Number.isInteger(timeoutMs) || timeoutMs < 100) throw new LatchError('--etcd-timeout-ms must be an integer of at least 100');
  }
  const tls = { ...base.tls };
  if (flags.etcdCa !== undefined) tls.ca = flags.etcdCa;
  if (flags.etcdCert !== undefined) tls.cert = flags.etcdCert;
  if (flags.etcdKey !== undefined) tls.key = flags.etcdKey;
  return {
    type: 'etcd',
    endpoints,
    prefix: flags.etcdPrefix ?? base.prefix ?? '/latch/',
    timeoutMs,
    ...(Object.keys(tls).length > 0 && { tls }),
  };
}

async function openNamed(name: StoreName, config: Config, flags: MigrateFlags): Promise<{ store: Store; describe: string }> {
  if (name === 'file') {
    const stateDir = flags.stateDir ?? config.stateDir;
    const { FileStore } = await import('../store/file.js');
    return { store: new FileStore(stateDir), describe: `file store ${stateDir}` };
  }
  const settings = etcdSettings(config, flags);
  const { EtcdStore } = await import('../store/etcd.js');
  return { store: new EtcdStore(settings), describe: `etcd ${settings.endpoints.join(',')} prefix ${settings.prefix}` };
}

export function registerLedgerCommands(program: Command): void {
  const ledger = program.command('ledger').description('move the ledger between stores');

  ledger
    .command('migrate')
    .description(
      'copy every volume document and PV alias from one store to the other; idempotent; refuses to replace a ' +
        'destination document that differs unless --overwrite; never changes the source. Exit 1 if any was refused.',
    )
    .requiredOption('--from <store>', 'file or etcd')
    .requiredOption('--to <store>', 'etcd or file')
    .option('--state-dir <dir>', "the file store's directory (default: stateDir from the configuration)")
    .option('--etcd-endpoints <urls>', 'comma-separated etcd client URLs (default: store.endpoints from the configuration)')
    .option('--etcd-prefix <prefix>', 'key prefix in etcd (default: store.prefix from the configuration, else /latch/)')
    .option('--etcd-ca <file>', 'PEM CA that signed the etcd members (default: store.tls.ca)')
    .option('--etcd-cert <file>', 'PEM client certificate (default: store.tls.cert)')
    .option('--etcd-key <file>', 'PEM client key (default: store.tls.key)')
    .option('--etcd-timeout-ms <ms>', 'deadline of each etcd request (default: store.timeoutMs, else 5000)')
    .option('--overwrite', 'replace destination documents whose content differs')
    .option('--dry-run', 'report what would be done, write nothing')
    .option('-o, --output <format>', 'table or json', parseFormat, 'table')
    .action(async (flags: MigrateFlags) => {
      const fromName = storeName(flags.from, '--from');
      const toName = storeName(flags.to, '--to');
      if (fromName === toName) throw new LatchError('--from and --to must differ: one is file, the other etcd');
      const config = loadConfig();
      const from = await openNamed(fromName, config, flags);
      try {
        const to = await openNamed(toName, config, flags);
        try {
          const report = await migrateLedger(from.store, to.store, {
            overwrite: flags.overwrite,
            dryRun: flags.dryRun,
            fromName: from.describe,
            toName: to.describe,
          });
          printReport(report, flags.output);
          if (report.counts.refused > 0) process.exitCode = 1;
        } finally {
          await to.store.close();
        }
      } finally {
        await from.store.close();
      }
    });
}

function printReport(report: MigrationReport, output: OutputFormat): void {
  if (output === 'json') return printJson(report);
  process.stdout.write(`${report.dryRun ? 'dry run: would migrate' : 'migrated'} ${report.from} -> ${report.to}\n`);
  const interesting = report.entries.filter((e) => e.action !== 'skipped');
  if (interesting.length > 0)
    printTable(
      ['key', 'action', 'detail'],
      interesting.map((e) => [e.key, e.action, e.detail ?? '']),
    );
  const c = report.counts;
  process.stdout.write(
    `copied ${c.copied}, overwritten ${c.overwritten}, skipped ${c.skipped} (identical), refused ${c.refused}` +
      (c.onlyInDestination > 0 ? `; ${c.onlyInDestination} only in the destination (left alone)` : '') +
      '\n',
  );
  if (c.refused > 0) process.stdout.write('some documents were refused: see above; nothing else was changed for them\n');
}

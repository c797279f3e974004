// latch ledger migrate: copy the ledger between the file store and etcd, in either direction (the rules are in
// src/ledger/migrate.ts). Exit code 1 when any key was refused, so that scripts notice an incomplete migration.
//
// Settings: the file store is the config's stateDir (or --state-dir); etcd is the config's `store` when it is etcd,
// with any --etcd-* flag taking precedence (so a node still on the file store can migrate with --etcd-endpoints).
import type { Config, EtcdStoreConfig } from '../../config.js';
import { LatchError } from '../../errors.js';
import { migrateLedger, type MigrationReport } from '../../ledger/migrate.js';
import { openStore } from '../../store/index.js';
import type { Store } from '../../store/types.js';
import { configOf, type CommandIO } from '../io.js';
import { formatJson, formatTable, type OutputFormat } from '../output.js';

export type StoreName = 'file' | 'etcd';

/** The etcd settings given as flags; each one replaces the configuration's. */
interface EtcdFlags {
  etcdEndpoints?: string;
  etcdPrefix?: string;
  etcdCa?: string;
  etcdCert?: string;
  etcdKey?: string;
  etcdTimeoutMs?: string;
}

export interface LedgerMigrateOptions extends EtcdFlags {
  from: StoreName;
  to: StoreName;
  stateDir?: string;
  overwrite?: boolean;
  dryRun?: boolean;
  output: OutputFormat;
}

/** A --from/--to value; a LatchError (which the surface reports as a bad option value) for anything else. */
export function parseStoreName(flag: string): (value: string) => StoreName {
  return (value) => {
    if (value !== 'file' && value !== 'etcd') throw new LatchError(`${flag} must be "file" or "etcd", not "${value}"`);
    return value;
  };
}

export async function ledgerMigrate(options: LedgerMigrateOptions, io: CommandIO): Promise<number> {
  if (options.from === options.to) throw new LatchError('--from and --to must differ: one is file, the other etcd');
  const config = configOf(io);
  const from = await openNamed(options.from, config, options);
  try {
    const to = await openNamed(options.to, config, options);
    try {
      const report = await migrateLedger(from.store, to.store, {
        overwrite: options.overwrite,
        dryRun: options.dryRun,
        fromName: from.describe,
        toName: to.describe,
      });
      io.out(options.output === 'json' ? formatJson(report) : describeReport(report));
      return report.counts.refused > 0 ? 1 : 0;
    } finally {
      await to.store.close();
    }
  } finally {
    await from.store.close();
  }
}

/** The etcd settings: the config's etcd store, overridden by the --etcd-* flags. */
function etcdSettings(config: Config, flags: EtcdFlags): EtcdStoreConfig {
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

/** A store named on the command line, opened on its own: a migration reads one store and writes the other. */
async function openNamed(name: StoreName, config: Config, options: LedgerMigrateOptions): Promise<{ store: Store; describe: string }> {
  if (name === 'file') {
    const stateDir = options.stateDir ?? config.stateDir;
    return { store: await openStore({ store: { type: 'file' }, stateDir }), describe: `file store ${stateDir}` };
  }
  const settings = etcdSettings(config, options);
  return {
    store: await openStore({ store: settings, stateDir: config.stateDir }),
    describe: `etcd ${settings.endpoints.join(',')} prefix ${settings.prefix}`,
  };
}

function describeReport(report: MigrationReport): string {
  let text = `${report.dryRun ? 'dry run: would migrate' : 'migrated'} ${report.from} -> ${report.to}\n`;
  const interesting = report.entries.filter((e) => e.action !== 'skipped');
  if (interesting.length > 0) {
    text += formatTable(
      ['key', 'action', 'detail'],
      interesting.map((e) => [e.key, e.action, e.detail ?? '']),
    );
  }
  const c = report.counts;
  text +=
    `copied ${c.copied}, overwritten ${c.overwritten}, skipped ${c.skipped} (identical), refused ${c.refused}` +
    (c.onlyInDestination > 0 ? `; ${c.onlyInDestination} only in the destination (left alone)` : '') +
    '\n';
  if (c.refused > 0) text += 'some documents were refused: see above; nothing else was changed for them\n';
  return text;
}

// Runs a command with one shared etcd member up, its client URL in $LATCH_TEST_ETCD_ENDPOINTS, and stops it
// afterwards whatever happens (also when this process is killed: the member dies with it).
//
//   node --import tsx test/etcd/with-etcd.ts -- <command> [args...]
//
// npm test (test/run-all.sh) runs the unit tests this way, so the ledger suite's worker processes all reach the same
// etcd (test/fixtures/ledger-stores.ts). Without etcd installed it runs the command as is (etcd tests skip).
import { spawn } from 'node:child_process';
import { constants } from 'node:os';
import { EtcdCluster, etcdSkipReason } from './etcd.js';

async function main(): Promise<number> {
  const dash = process.argv.indexOf('--');
  const [file, ...args] = dash >= 0 ? process.argv.slice(dash + 1) : process.argv.slice(2);
  if (file === undefined) {
    process.stderr.write('usage: node --import tsx test/etcd/with-etcd.ts -- <command> [args...]\n');
    return 2;
  }
  let cluster: EtcdCluster | undefined;
  const env = { ...process.env };
  const skip = etcdSkipReason();
  if (skip) {
    process.stderr.write(`with-etcd: ${skip}; running without a shared etcd\n`);
  } else if (!env.LATCH_TEST_ETCD_ENDPOINTS) {
    cluster = await EtcdCluster.start({ size: 1 });
    env.LATCH_TEST_ETCD_ENDPOINTS = cluster.endpoints.join(',');
    process.stderr.write(`with-etcd: etcd at ${env.LATCH_TEST_ETCD_ENDPOINTS}\n`);
  }
  try {
    const child = spawn(file, args, { stdio: 'inherit', env });
    for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(signal, () => child.kill(signal));
    return await new Promise<number>((resolve) => {
      child.on('error', (err) => {
        process.stderr.write(`with-etcd: cannot run ${file}: ${err.message}\n`);
        resolve(127);
      });
      child.on('exit', (code, signal) => resolve(code ?? 128 + (signal ? constants.signals[signal] : 0)));
    });
  } finally {
    await cluster?.stop();
  }
}

void main().then((code) => process.exit(code));

// Runs a command with a one-host Ceph cluster up (test/ceph/cluster.ts) and tears it down afterwards, whatever
// happens (the daemons also die with this process; a later run sweeps any mounts a SIGKILL left behind).
//
//   node --import tsx test/ceph/with-ceph.ts -- <command> [args...]
//
// The command sees CEPH_CONF (the cluster's conf, with client.admin's keyring in it, so plain `ceph` and `rbd`
// work), LATCH_TEST_CEPH_DIR (the cluster's temp dir: put mounts under it so the teardown finds them) and
// LATCH_TEST_CEPH_POOL. Without root or the ceph packages it says why and exits 77 ("skipped").
import { spawn } from 'node:child_process';
import { constants } from 'node:os';
import { cephSkipReason, startCephCluster, type CephCluster } from './cluster.js';

async function main(): Promise<number> {
  const dash = process.argv.indexOf('--');
  const command = dash >= 0 ? process.argv.slice(dash + 1) : process.argv.slice(2);
  const [program, ...programArgs] = command;
  if (program === undefined) {
    process.stderr.write('usage: node --import tsx test/ceph/with-ceph.ts -- <command> [args...]\n');
    return 2;
  }
  const skip = cephSkipReason();
  if (skip) {
    process.stderr.write(`with-ceph: ${skip}\n`);
    return 77;
  }
  let cluster: CephCluster | undefined;
  try {
    const started = performance.now();
    cluster = await startCephCluster();
    process.stderr.write(`with-ceph: cluster ${cluster.fsid} in ${cluster.dir}, up in ${Math.round(performance.now() - started)} ms\n`);
    const env = { ...process.env, CEPH_CONF: cluster.confPath, LATCH_TEST_CEPH_DIR: cluster.dir, LATCH_TEST_CEPH_POOL: cluster.pool };
    const child = spawn(program, programArgs, { stdio: 'inherit', env });
    for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(signal, () => child.kill(signal));
    return await new Promise<number>((resolve) => {
      child.on('error', (err) => {
        process.stderr.write(`with-ceph: cannot run ${program}: ${err.message}\n`);
        resolve(127);
      });
      child.on('exit', (code, signal) => resolve(code ?? 128 + (signal ? constants.signals[signal] : 0)));
    });
  } finally {
    const stopping = performance.now();
    await cluster?.stop();
    if (cluster) process.stderr.write(`with-ceph: torn down in ${Math.round(performance.now() - stopping)} ms\n`);
  }
}

void main().then(
  (code) => process.exit(code),
  (err: unknown) => {
    process.stderr.write(`with-ceph: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(1);
  },
);

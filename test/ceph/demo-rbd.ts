// npm run demo:rbd: `latch demo --backend rbd` on a throwaway one-host Ceph cluster (test/ceph/cluster.ts), brought up
// for it and torn down afterwards, even when the demo fails. Needs root, Debian's ceph packages (scripts/setup.sh)
// and bin/latch (npm run build). Exits with the demo's status.
import { spawnSync } from 'node:child_process';
import { join, resolve } from 'node:path';
import { startCephCluster } from './cluster.js';

async function main(): Promise<number> {
  const latch = resolve(__dirname, '../../bin/latch');
  process.stdout.write('Bringing up a one-host Ceph cluster (mon, mgr, one OSD on a sparse file)...\n');
  const ceph = await startCephCluster();
  try {
    process.stdout.write(`... up in ${ceph.startupSteps.reduce((ms, s) => ms + s.ms, 0)} ms (${join(ceph.dir, 'ceph.conf')})\n\n`);
    const args = ['demo', '--backend', 'rbd', '--ceph-conf', ceph.confPath, '--ceph-keyring', ceph.adminKeyring, '--pool', ceph.pool];
    return spawnSync(process.execPath, [latch, ...args], { stdio: 'inherit' }).status ?? 1;
  } finally {
    await ceph.stop();
  }
}

main().then(
  (status) => process.exit(status),
  (err: unknown) => {
    process.stderr.write(`${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(1);
  },
);

// The attach-mode pod lifecycle through the driver (bin/latch, from `npm run build`) with the rbd backend, on a real
// one-host Ceph cluster: node-a and node-b have their own config, cephx identity, keyring and rbd mount dir, and share
// only the ledger (a common file-store stateDir) and the Ceph pool; no pool directory is shared. A file written on
// node-a is read on node-b after the pod moves: the volume's data follows the pod.
// Needs root, Debian's ceph packages and bin/latch; skips with a message otherwise.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { promisify } from 'node:util';
import { rbdFusePids } from '../../src/sys/fuse.js';
import { listLoopDevices } from '../../src/sys/loop.js';
import { readMountInfo } from '../../src/sys/mounts.js';
import { cephSkipReason, startCephCluster, type CephCluster } from '../ceph/cluster.js';

const REPO = resolve(__dirname, '../..');
const LATCH = join(REPO, 'bin/latch');
const execFileAsync = promisify(execFile);
const skip = cephSkipReason() ?? (existsSync(LATCH) ? undefined : 'bin/latch is missing: run npm run build first');

interface Reply {
  status: string;
  message?: string;
  device?: string;
  [key: string]: unknown;
}

describe('the driver with the rbd backend: the pod moves from node-a to node-b, and its data with it', { skip }, () => {
  let ceph: CephCluster;
  const configs: Record<string, string> = {};
  const mountDirs: Record<string, string> = {};
  const keyrings: Record<string, string> = {};

  before(
    async () => {
      ceph = await startCephCluster();
      const stateDir = join(ceph.dir, 'latch-state');
      for (const node of ['node-a', 'node-b']) {
        const client = await ceph.createClient(`latch-${node}`);
        keyrings[node] = client.keyringPath;
        mountDirs[node] = join(ceph.dir, 'mnt', node); // under the cluster's dir: its teardown sweeps leftovers
        const config = {
          nodeName: node,
          poolDir: join(ceph.dir, node, 'pool'),
          stateDir,
          logFile: join(ceph.dir, node, 'latch.log'),
          maxSize: '4Gi',
          waitForAttachTimeout: 10,
          commandTimeout: 60,
          backend: {
            type: 'rbd',
            pool: ceph.pool,
            cephConf: client.confPath,
            clientId: client.id,
            keyring: client.keyringPath,
            mountDir: mountDirs[node],
          },
        };
        mkdirSync(join(ceph.dir, node), { recursive: true });
        configs[node] = join(ceph.dir, node, 'config.json');
        writeFileSync(configs[node], JSON.stringify(config, null, 2));
      }
    },
    { timeout: 120_000 },
  );

  after(async () => {
    await ceph?.stop();
  });

  /** One driver call as `node`: exactly one JSON object on stdout, nothing on stderr. */
  async function call(node: string, ...args: string[]): Promise<Reply> {
    const config = configs[node];
    assert.ok(config, `no config for ${node}`);
    const { stdout, stderr } = await execFileAsync(LATCH, args, { env: { ...process.env, LATCH_CONFIG: config }, timeout: 120_000 }).catch(
      (err: { stdout?: string; stderr?: string }) => ({ stdout: err.stdout ?? '', stderr: err.stderr ?? '' }),
    );
    assert.equal(stderr, '', `${args[0]} on ${node} wrote to stderr`);
    const reply = JSON.parse(stdout) as Reply;
    assert.equal(reply.status, 'Success', `${args.join(' ')} on ${node}: ${stdout}`);
    return reply;
  }

  it('attach, waitforattach, mountdevice, write, unmountdevice, detach on node-a; the same on node-b reads it back', async (t) => {
    const pv = 'pv-rbd-moves';
    const options = JSON.stringify({
      'kubernetes.io/fsType': '',
      'kubernetes.io/pvOrVolumeName': pv,
      'kubernetes.io/readwrite': 'rw',
      size: '256Mi',
    });
    for (const node of ['node-a', 'node-b']) {
      const globalPath = join(ceph.dir, `kubelet-${node}`, 'plugins/kubernetes.io/flexvolume/latch/loop/mounts', pv);
      mkdirSync(globalPath, { recursive: true, mode: 0o750 });
      const mountDir = mountDirs[node] ?? '';
      await call(node, 'init');
      await call(node, 'attach', options, node);

      const started = performance.now();
      const { device } = await call(node, 'waitforattach', '', options);
      assert.match(device ?? '', /^\/dev\/loop[0-9]+$/);
      const loop = (await listLoopDevices()).find((l) => l.device === device);
      assert.equal(loop?.backingFile, join(mountDir, pv, pv), `${device} is backed by ${node}'s rbd-fuse file of the image`);
      await call(node, 'mountdevice', globalPath, device ?? '', options);
      t.diagnostic(`${node}: waitforattach + mountdevice (attach to mounted): ${Math.round(performance.now() - started)} ms`);
      const mounted = (await readMountInfo()).filter((m) => m.mountPoint === globalPath);
      assert.deepEqual(
        mounted.map((m) => [m.source, m.fsType]),
        [[device, 'ext4']],
      );
      assert.equal((await rbdFusePids(join(mountDir, pv))).length, 1, 'one rbd-fuse for the volume');

      if (node === 'node-a') {
        writeFileSync(join(globalPath, 'hello.txt'), 'written on node-a\n');
      } else {
        assert.equal(readFileSync(join(globalPath, 'hello.txt'), 'utf8'), 'written on node-a\n');
      }

      await call(node, 'unmountdevice', globalPath);
      assert.equal((await readMountInfo()).filter((m) => m.mountPoint === globalPath || m.mountPoint.startsWith(`${mountDir}/`)).length, 0);
      assert.deepEqual(await rbdFusePids(join(mountDir, pv)), []);
      assert.equal((await listLoopDevices()).filter((l) => l.backingFile.startsWith(`${mountDir}/`)).length, 0);
      await call(node, 'detach', pv, node);
    }
    // The bytes live in the pool, not on either node: no image file was made in their poolDirs.
    for (const node of ['node-a', 'node-b']) assert.equal(existsSync(join(ceph.dir, node, 'pool', `${pv}.img`)), false);
    const info = JSON.parse((await ceph.rbd(['info', '--format', 'json', `${ceph.pool}/${pv}`])).stdout) as { size: number };
    assert.equal(info.size, 256 * 1024 * 1024);
    // Keys stay in keyring files: not in either node's call log.
    for (const node of ['node-a', 'node-b']) {
      const key = /key = (\S+)/.exec(readFileSync(keyrings[node] ?? '', 'utf8'))?.[1];
      assert.ok(key);
      const logs = readdirSync(join(ceph.dir, node)).filter((f) => f.startsWith('latch.log'));
      assert.ok(logs.length > 0, 'the calls were logged');
      for (const log of logs) assert.ok(!readFileSync(join(ceph.dir, node, log), 'utf8').includes(key));
    }
  });
});

// The attach-mode pod lifecycle through the driver (bin/latch, from `npm run build`) with the rbd backend, on a real
// one-host Ceph cluster: node-a and node-b have their own config, cephx identity, keyring and rbd mount dir, and share
// only the ledger (a common file-store stateDir) and the Ceph pool; no pool directory is shared. A file written on
// node-a is read on node-b after the pod moves: the volume's data follows the pod. A force-detach while node-a still
// writes ends with node-a fenced by the cluster (the admin's config holds the fencer identity), node-b mounting a
// filesystem that fsck passes, and none of node-a's post-fence writes in the image.
// Needs root, Debian's ceph packages and bin/latch; skips with a message otherwise.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { promisify } from 'node:util';
import { rbdFusePids } from '../../src/sys/fuse.js';
import { listLoopDevices } from '../../src/sys/loop.js';
import { readMountInfo } from '../../src/sys/mounts.js';
import { run } from '../../src/sys/run.js';
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
  let adminConfig = '';

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
          oneHost: true, // the simulated nodes share this host's file store
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
      // node-k maps with the kernel client, which this machine does not have (as node-a's identity).
      mountDirs['node-k'] = join(ceph.dir, 'mnt', 'node-k');
      configs['node-k'] = join(ceph.dir, 'node-k', 'config.json');
      const nodeA = JSON.parse(readFileSync(configs['node-a'] ?? '', 'utf8')) as { backend: Record<string, unknown> };
      const nodeK = {
        nodeName: 'node-k',
        oneHost: true,
        stateDir,
        logFile: join(ceph.dir, 'node-k', 'latch.log'),
        commandTimeout: 60,
        backend: { ...nodeA.backend, mountDir: mountDirs['node-k'], client: 'krbd' },
      };
      mkdirSync(join(ceph.dir, 'node-k'), { recursive: true });
      writeFileSync(configs['node-k'], JSON.stringify(nodeK, null, 2));
      // node-c runs in non-attach mode and has no key of its own: its volumes are mapped with a PV's secretRef.
      mkdirSync(join(ceph.dir, 'node-c'), { recursive: true });
      mountDirs['node-c'] = join(ceph.dir, 'mnt', 'node-c');
      configs['node-c'] = join(ceph.dir, 'node-c', 'config.json');
      const nodeC = {
        nodeName: 'node-c',
        attach: false,
        oneHost: true,
        stateDir,
        logFile: join(ceph.dir, 'node-c', 'latch.log'),
        commandTimeout: 60,
        backend: {
          type: 'rbd',
          pool: ceph.pool,
          cephConf: ceph.confPath,
          clientId: 'latch-node-c',
          keyring: join(ceph.dir, 'node-c', 'no-such.keyring'),
          mountDir: mountDirs['node-c'],
        },
      };
      writeFileSync(configs['node-c'], JSON.stringify(nodeC, null, 2));
      // Where the admin runs latch: the same ledger, and the one identity that may blocklist client instances.
      const fencer = await ceph.createClient('latch-fencer', { role: 'fencer' });
      mkdirSync(join(ceph.dir, 'admin'), { recursive: true });
      adminConfig = join(ceph.dir, 'admin', 'config.json');
      const admin = {
        nodeName: 'admin',
        oneHost: true,
        stateDir,
        logFile: join(ceph.dir, 'admin', 'latch.log'),
        backend: {
          type: 'rbd',
          pool: ceph.pool,
          cephConf: fencer.confPath,
          clientId: 'unused-on-admin',
          keyring: fencer.keyringPath,
          mountDir: join(ceph.dir, 'mnt', 'admin'),
          fencer: { clientId: fencer.id, keyring: fencer.keyringPath },
        },
      };
      writeFileSync(adminConfig, JSON.stringify(admin, null, 2));
    },
    { timeout: 120_000 },
  );

  after(async () => {
    await ceph?.stop();
  });

  /** One driver call as `node`: exactly one JSON object on stdout, nothing on stderr; whatever its status. */
  async function reply(node: string, ...args: string[]): Promise<Reply> {
    const config = configs[node];
    assert.ok(config, `no config for ${node}`);
    const { stdout, stderr } = await execFileAsync(LATCH, args, { env: { ...process.env, LATCH_CONFIG: config }, timeout: 120_000 }).catch(
      (err: { stdout?: string; stderr?: string }) => ({ stdout: err.stdout ?? '', stderr: err.stderr ?? '' }),
    );
    assert.equal(stderr, '', `${args[0]} on ${node} wrote to stderr`);
    return JSON.parse(stdout) as Reply;
  }

  /** One driver call as `node` that must succeed. */
  async function call(node: string, ...args: string[]): Promise<Reply> {
    const answer = await reply(node, ...args);
    assert.equal(answer.status, 'Success', `${args.join(' ')} on ${node}: ${JSON.stringify(answer)}`);
    return answer;
  }

  /** An admin command with the admin's configuration (the fencer identity): its output, and its exit code. */
  async function admin(...args: string[]): Promise<{ stdout: string; exitCode: number }> {
    return execFileAsync(LATCH, args, { env: { ...process.env, LATCH_CONFIG: adminConfig }, timeout: 120_000 }).then(
      ({ stdout }) => ({ stdout, exitCode: 0 }),
      (err: { stdout?: string; stderr?: string; code?: number }) => ({
        stdout: `${err.stdout ?? ''}${err.stderr ?? ''}`,
        exitCode: err.code ?? -1,
      }),
    );
  }

  /** The volume's ledger document, as `latch volume inspect -o json` shows it. */
  async function ledgerDoc(volume: string): Promise<any> {
    return JSON.parse((await admin('volume', 'inspect', volume, '-o', 'json')).stdout);
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

  it('a force-detach while node-a writes: node-a fenced first, node-b mounts a clean filesystem, no post-fence write lands', async (t) => {
    const pv = 'pv-rbd-fence';
    const options = JSON.stringify({
      'kubernetes.io/fsType': 'ext4',
      'kubernetes.io/pvOrVolumeName': pv,
      'kubernetes.io/readwrite': 'rw',
      size: '128Mi',
    });
    const globalPath = (node: string) => {
      const path = join(ceph.dir, `kubelet-${node}`, 'plugins/kubernetes.io/flexvolume/latch/loop/mounts', pv);
      mkdirSync(path, { recursive: true, mode: 0o750 });
      return path;
    };
    await call('node-a', 'attach', options, 'node-a');
    const { device: deviceA } = await call('node-a', 'waitforattach', '', options);
    await call('node-a', 'mountdevice', globalPath('node-a'), deviceA ?? '', options);
    const recorded: string | undefined = (await ledgerDoc(pv)).status.nodes['node-a']?.client;
    assert.match(recorded ?? '', /^127\.0\.0\.1:0\/[1-9][0-9]*$/, 'node-a recorded its rbd-fuse instance at attach');

    // node-a's pod writes numbered 4-KiB markers with O_DIRECT and O_DSYNC into blocks allocated beforehand (so no
    // write needs a metadata commit), and logs when each attempt started and how it ended, outside the volume.
    const tag = `T${process.pid}x${Date.now()}`;
    const markers = join(globalPath('node-a'), 'markers.bin');
    await run('dd', ['if=/dev/zero', `of=${markers}`, 'bs=4096', 'count=2048', 'oflag=direct', 'conv=fsync'], { timeoutMs: 60_000 });
    const writerLog = join(ceph.dir, 'writer.log');
    const script =
      'i=0; while [ $i -lt 2048 ]; do echo "start $i $(date +%s%3N)" >> "$2"; ' +
      'printf "LATCH-MARK %s %06d\\n" "$3" $i | dd of="$1" bs=4096 count=1 seek=$i conv=notrunc,sync oflag=direct,dsync status=none 2>/dev/null; ' +
      'echo "end $i $? $(date +%s%3N)" >> "$2"; i=$((i+1)); sleep 0.02; done';
    const writer = spawn('bash', ['-c', script, 'writer', markers, writerLog, tag], { stdio: 'ignore', detached: true });
    const entries = () =>
      readFileSync(writerLog, 'utf8')
        .trim()
        .split('\n')
        .map((l) => l.split(' '));
    const deadline = Date.now() + 60_000;
    while ((existsSync(writerLog) ? entries().filter((e) => e[0] === 'end' && e[2] === '0').length : 0) < 20) {
      assert.ok(Date.now() < deadline, 'the writer did not get 20 writes through');
      await new Promise((r) => setTimeout(r, 100));
    }

    // The controller force-detaches (node-a is unresponsive to it); node-b is refused while node-a has not released.
    await call('node-a', 'detach', pv, 'node-a');
    assert.equal((await reply('node-b', 'attach', options, 'node-b')).status, 'Failure');
    const fenceStarted = Date.now();
    const release = await admin('volume', 'release', pv, '--node', 'node-a', '--node-is-down');
    const fenced = Date.now();
    assert.equal(release.exitCode, 0, release.stdout);
    t.diagnostic(`volume release with the fence: ${fenced - fenceStarted} ms: ${release.stdout.trim()}`);
    const fence = (await ledgerDoc(pv)).status.fences['node-a'];
    assert.equal(fence.state, 'fenced');
    assert.ok(fence.clients.includes(recorded ?? '-'), `the recorded client ${recorded} is fenced: ${fence.clients}`);
    const blocklist = (await ceph.ceph(['osd', 'blocklist', 'ls', '--format', 'json'])).stdout;
    assert.ok(blocklist.includes(recorded ?? '-'), 'the cluster refuses it');

    // node-a keeps trying for a while after the fence; every attempt fails.
    await new Promise((r) => setTimeout(r, 1_500));
    process.kill(-(writer.pid ?? 0), 'SIGKILL');
    const log = entries();
    const startedAfter = new Set(log.filter((e) => e[0] === 'start' && Number(e[2]) > fenced).map((e) => e[1] ?? ''));
    assert.ok(startedAfter.size > 0, 'node-a tried to write after the fence');
    for (const e of log.filter((e) => e[0] === 'end' && startedAfter.has(e[1] ?? '')))
      assert.notEqual(e[2], '0', `write ${e[1]} after the fence failed`);
    const ackedBefore = log.filter((e) => e[0] === 'end' && e[2] === '0' && Number(e[3]) < fenceStarted).map((e) => Number(e[1]));

    // node-b gets the volume; its filesystem mounts (the journal replays) and shows every write acknowledged before.
    await call('node-b', 'attach', options, 'node-b');
    const { device: deviceB } = await call('node-b', 'waitforattach', '', options);
    await call('node-b', 'mountdevice', globalPath('node-b'), deviceB ?? '', options);
    const seen = readFileSync(join(globalPath('node-b'), 'markers.bin'), 'latin1');
    for (const i of ackedBefore)
      assert.ok(seen.includes(`LATCH-MARK ${tag} ${String(i).padStart(6, '0')}`), `acknowledged write ${i} is there`);
    await call('node-b', 'unmountdevice', globalPath('node-b'));
    await call('node-b', 'detach', pv, 'node-b');

    // The raw image holds no marker of an attempt that started after the fence.
    const image = join(ceph.dir, 'fence-export.img');
    await ceph.rbd(['export', '--no-progress', `${ceph.pool}/${pv}`, image]);
    const raw = readFileSync(image, 'latin1');
    const inImage = new Set([...raw.matchAll(new RegExp(`LATCH-MARK ${tag} ([0-9]{6})`, 'g'))].map((m) => String(Number(m[1]))));
    for (const i of startedAfter) assert.ok(!inImage.has(i), `write ${i}, started after the fence, is not in the image`);
    t.diagnostic(
      `${ackedBefore.length} writes acknowledged before the fence, ${startedAfter.size} attempted after it; ${inImage.size} markers in the image`,
    );

    // node-a comes back: kubelet's unmountdevice clears its fenced mapping within the deadline, and says so.
    const started = Date.now();
    await call('node-a', 'unmountdevice', globalPath('node-a'));
    t.diagnostic(`node-a's unmountdevice of the fenced mapping: ${Date.now() - started} ms`);
    assert.deepEqual(await rbdFusePids(join(mountDirs['node-a'] ?? '', pv)), []);
    assert.equal((await listLoopDevices()).filter((l) => l.backingFile.startsWith(`${mountDirs['node-a']}/`)).length, 0);
    assert.ok((await ledgerDoc(pv)).status.fences['node-a'].clearedAt, 'node-a cleared its fence');

    // fsck only now: e2fsck stats every mount point of the host, and node-a's fenced FUSE mount was one (on real
    // hosts the fenced mount is on the fenced node, not where fsck runs).
    const fsck = await run('e2fsck', ['-f', '-n', image], { okExitCodes: [1, 2, 4, 8], timeoutMs: 60_000 });
    assert.equal(fsck.exitCode, 0, `e2fsck -fn of the image: ${fsck.stdout}`);

    // Only now is the fence lifted, and the ledger forgets it.
    const unfence = await admin('node', 'unfence', 'node-a');
    assert.equal(unfence.exitCode, 0, unfence.stdout);
    assert.ok(!(await ceph.ceph(['osd', 'blocklist', 'ls', '--format', 'json'])).stdout.includes(recorded ?? '-'));
    assert.equal((await ledgerDoc(pv)).status.fences, undefined);
  });

  it('with the kernel client on a kernel without the rbd module: waitforattach fails and says so, starting nothing', async () => {
    const pv = 'pv-rbd-krbd';
    const options = JSON.stringify({ 'kubernetes.io/pvOrVolumeName': pv, 'kubernetes.io/readwrite': 'rw', size: '64Mi' });
    await call('node-k', 'attach', options, 'node-k');
    const answer = await reply('node-k', 'waitforattach', '', options);
    assert.equal(answer.status, 'Failure');
    assert.match(
      answer.message ?? '',
      /cannot map \S+\/pv-rbd-krbd with the kernel rbd client: this kernel has no rbd module .*modprobe rbd/,
    );
    const mountDir = mountDirs['node-k'] ?? '';
    assert.deepEqual(await rbdFusePids(join(mountDir, pv)), [], 'no rbd-fuse started');
    assert.equal((await listLoopDevices()).filter((l) => l.backingFile.startsWith(`${mountDir}/`)).length, 0);
    await call('node-k', 'detach', pv, 'node-k');
  });

  it("non-attach mount with a PV's secretRef: mapped as the secret's identity, its key only ever in a 0600 keyring file", async () => {
    const secretUser = await ceph.createClient('latch-secret-user');
    const key = /key = (\S+)/.exec(readFileSync(secretUser.keyringPath, 'utf8'))?.[1] ?? '';
    assert.ok(key.startsWith('AQ'));
    const pv = 'pv-rbd-secret';
    const podDir = join(ceph.dir, 'kubelet-node-c', 'pods', 'pod-s', 'volumes', 'latch~loop', pv);
    mkdirSync(podDir, { recursive: true, mode: 0o750 });
    const options = (secret: Record<string, string>) =>
      JSON.stringify({
        'kubernetes.io/fsType': 'ext4',
        'kubernetes.io/pod.name': 'pod-s',
        'kubernetes.io/pod.namespace': 'default',
        'kubernetes.io/pod.uid': 'pod-s',
        'kubernetes.io/pvOrVolumeName': pv,
        'kubernetes.io/readwrite': 'rw',
        ...Object.fromEntries(Object.entries(secret).map(([k, v]) => [`kubernetes.io/secret/${k}`, Buffer.from(v).toString('base64')])),
        size: '64Mi',
      });
    // Without the secret node-c has no key: refused, and nothing is left set up.
    const refused = await reply('node-c', 'mount', podDir, options({}));
    assert.equal(refused.status, 'Failure', JSON.stringify(refused));
    // A malformed key never reaches a file, and the message does not echo it.
    const bad = await reply('node-c', 'mount', podDir, options({ userId: secretUser.id, key: 'not a key\n[client.x]' }));
    assert.equal(bad.status, 'Failure');
    assert.doesNotMatch(bad.message ?? '', /not a key/);

    await call('node-c', 'mount', podDir, options({ userId: secretUser.id, key }));
    writeFileSync(join(podDir, 'secret.txt'), 'mapped with the secret\n');
    assert.equal(readFileSync(join(podDir, 'secret.txt'), 'utf8'), 'mapped with the secret\n');
    const fuse = (await rbdFusePids(join(mountDirs['node-c'] ?? '', pv)))[0];
    const argv = readFileSync(`/proc/${fuse}/cmdline`, 'utf8').split('\0');
    assert.ok(argv.includes(secretUser.id), `rbd-fuse runs as the secret's identity: ${argv.join(' ')}`);
    assert.ok(!argv.some((a) => a.includes(key)), 'the key is not on its command line');
    const keyring = join(mountDirs['node-c'] ?? '', '.keys', `client.${secretUser.id}.keyring`);
    assert.equal(statSync(keyring).mode & 0o777, 0o600);
    await call('node-c', 'unmount', podDir);
    assert.deepEqual(await rbdFusePids(join(mountDirs['node-c'] ?? '', pv)), []);
    for (const log of readdirSync(join(ceph.dir, 'node-c')).filter((f) => f.startsWith('latch.log'))) {
      assert.ok(!readFileSync(join(ceph.dir, 'node-c', log), 'utf8').includes(key), 'the key is not in the log');
    }
  });
});

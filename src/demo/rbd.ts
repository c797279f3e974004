// latch demo --backend rbd: the move and the fence on a real Ceph cluster. Two simulated nodes with their own cephx
// identities (node caps) and rbd mount dirs share only the ledger and the pool; the admin holds the fencer identity.
// A pod writes on node-a; node-a stops answering the control plane and is force-detached; the admin releases the
// volume, which blocklists node-a's client first; node-a's pod can no longer write, node-b mounts the volume and
// reads what node-a wrote; node-a comes back and clears its mapping; the fence is lifted. Everything it made (the
// identities, the image, the directories) goes at the end. It needs an admin keyring for the cluster and an existing
// pool initialised for rbd.
import { mkdir, mkdtemp, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { DEFAULT_DRIVER_NAME } from '../names.js';
import { LatchError, errorMessage } from '../errors.js';
import { abortFuseConnection, fuseMountsAt, killAndWait, rbdFusePids } from '../sys/fuse.js';
import { readMountInfo } from '../sys/mounts.js';
import { cephAuthExists, cephAuthGetOrCreate, cephAuthRemove, fencerCaps, nodeCaps, rbdInfo, type CephIdentity } from '../sys/rbd.js';
import { run } from '../sys/run.js';
import { cleanUp, kubeletOptions, leftoversOf, Narrator, success, type DemoOptions } from './script.js';

const NODES = ['node-a', 'node-b'] as const;

export async function runRbdDemo(options: DemoOptions, out: (text: string) => void): Promise<number> {
  const cephConf = options.cephConf ?? '/etc/ceph/ceph.conf';
  const admin: CephIdentity = { cephConf, clientId: 'admin', keyring: options.cephKeyring ?? '/etc/ceph/ceph.client.admin.keyring' };
  const pool = options.pool ?? 'latch';
  const work = await mkdtemp('/tmp/latch-demo-');
  const narrator = new Narrator(out);
  const say = (text: string) => narrator.say(text);
  // Unique per run, so that two demos on one cluster never share an identity or an image.
  const run_ = work
    .slice(-6)
    .toLowerCase()
    .replace(/[^a-z0-9]/g, 'x');
  const ids = { 'node-a': `latch-demo-${run_}-a`, 'node-b': `latch-demo-${run_}-b`, fencer: `latch-demo-${run_}-fencer` };
  const pv = `pv-demo-${run_}`;
  try {
    say(`latch demo --backend rbd: a pod with volume ${pv} writes on node-a, node-a is fenced, the pod moves to node-b.`);
    say(`Cluster: ${cephConf}, pool ${pool}. Everything else lives in ${work}.\n`);
    say('== Identities: one per node (no blocklist rights), and the fencer (blocklist single clients only)');
    const conf = await readFile(cephConf, 'utf8').catch((err: unknown) => {
      throw new LatchError(`cannot read the cluster's conf ${cephConf}: ${errorMessage(err)}`);
    });
    const configs: Record<string, string> = {};
    for (const [who, id] of Object.entries(ids)) {
      const keyring = join(work, `client.${id}.keyring`);
      const caps = who === 'fencer' ? fencerCaps(pool) : nodeCaps(pool);
      say(`[ceph admin] ceph auth get-or-create client.${id} ${caps.map((c) => (c.includes(' ') ? `'${c}'` : c)).join(' ')}`);
      await cephAuthGetOrCreate(admin, `client.${id}`, caps, keyring);
      const section = [`[client.${id}]`, `keyring = ${keyring}`, ...(who === 'fencer' ? [] : ['rbd_blocklist_on_break_lock = false'])];
      const confPath = join(work, `${id}.conf`);
      await writeFile(confPath, `${conf}\n${section.join('\n')}\n`, { mode: 0o600 });
      const config = {
        nodeName: who === 'fencer' ? 'admin' : who,
        // The simulated nodes share this host's file store (docs/operations.md, "Configurations latch refuses").
        oneHost: true,
        stateDir: join(work, 'state'),
        logFile: join(work, `latch-${who}.log`),
        waitForAttachTimeout: 10,
        commandTimeout: 60,
        backend: {
          type: 'rbd',
          pool,
          cephConf: confPath,
          clientId: id,
          keyring,
          mountDir: join(work, 'rbd', who),
          ...(who === 'fencer' && { fencer: { clientId: id, keyring } }),
        },
      };
      configs[who] = join(work, `config-${who}.json`);
      await writeFile(configs[who], JSON.stringify(config, null, 2), { mode: 0o600 });
    }
    const [nodeA, nodeB, adminConfig] = [configs['node-a'] ?? '', configs['node-b'] ?? '', configs.fencer ?? ''];
    const options_ = kubeletOptions(pv, '256Mi');
    const globalMount = async (node: string) => {
      const path = join(work, node, `kubelet/plugins/kubernetes.io/flexvolume/${DEFAULT_DRIVER_NAME}/mounts`, pv);
      await mkdir(path, { recursive: true, mode: 0o750 });
      return path;
    };

    say('\n== Pod starts on node-a');
    await narrator.call({ who: 'kubelet node-a', config: nodeA, args: ['init'], expect: success });
    await narrator.call({ who: 'controller', config: nodeA, args: ['attach', options_, 'node-a'], expect: success });
    const waitA = await narrator.call({
      who: 'kubelet node-a',
      config: nodeA,
      args: ['waitforattach', '', options_],
      expect: (r) => typeof r.device === 'string',
      note: `image ${pool}/${pv} created; node-a's rbd-fuse serves it, a loop device over it; its client address recorded`,
    });
    const mountA = await globalMount('node-a');
    await narrator.call({
      who: 'kubelet node-a',
      config: nodeA,
      args: ['mountdevice', mountA, String(waitA.device), options_],
      expect: success,
    });
    const text = `written on node-a at ${new Date().toISOString()}\n`;
    await writeFile(join(mountA, 'hello.txt'), text);
    // The pod's data file, its blocks written once so that later writes to it need no new allocation.
    await run('dd', ['if=/dev/zero', `of=${join(mountA, 'data.bin')}`, 'bs=4096', 'count=16', 'oflag=direct', 'conv=fsync'], {
      timeoutMs: 30_000,
    });
    await run('sync', ['-f', join(mountA, 'hello.txt')], { timeoutMs: 30_000 });
    say(`[pod on node-a] wrote hello.txt: ${text.trim()}`);

    say('\n== node-a stops answering the control plane; after 6 minutes the controller force-detaches');
    await narrator.call({ who: 'controller', config: nodeA, args: ['detach', pv, 'node-a'], expect: success });
    await narrator.call({
      who: 'controller',
      config: nodeB,
      args: ['attach', options_, 'node-b'],
      expect: (r) => r.status === 'Failure' && String(r.message).includes('detaching from node node-a'),
      note: 'refused: node-a has not confirmed its release, and may still write',
    });

    say('\n== The admin releases it: the cluster refuses node-a first, then the volume moves');
    await narrator.admin(adminConfig, ['volume', 'release', pv, '--node', 'node-a', '--node-is-down']);
    narrator.check(await writeRefused(join(mountA, 'data.bin')), '[pod on node-a] its next write to data.bin is refused by the cluster');

    say('\n== The pod moves to node-b and finds its data');
    await narrator.call({ who: 'controller', config: nodeB, args: ['attach', options_, 'node-b'], expect: success });
    const waitB = await narrator.call({
      who: 'kubelet node-b',
      config: nodeB,
      args: ['waitforattach', '', options_],
      expect: (r) => typeof r.device === 'string',
    });
    const mountB = await globalMount('node-b');
    await narrator.call({
      who: 'kubelet node-b',
      config: nodeB,
      args: ['mountdevice', mountB, String(waitB.device), options_],
      expect: success,
    });
    const readBack = await readFile(join(mountB, 'hello.txt'), 'utf8').catch(() => '(missing)');
    narrator.check(readBack === text, `[pod on node-b] read hello.txt: ${readBack.trim()}`);

    say('\n== node-a comes back: kubelet cleans up the old pod, which clears its fenced mapping; then the fence is lifted');
    await narrator.call({
      who: 'kubelet node-a',
      config: nodeA,
      args: ['unmountdevice', mountA],
      expect: success,
      note: "the fenced rbd-fuse hangs every stat of its mount: its FUSE connection is aborted, it is killed, and it's unmounted",
    });
    await narrator.admin(adminConfig, ['node', 'unfence', 'node-a']);

    say('\n== The pod stops on node-b; the volume goes');
    await narrator.call({ who: 'kubelet node-b', config: nodeB, args: ['unmountdevice', mountB], expect: success });
    await narrator.call({ who: 'controller', config: nodeB, args: ['detach', pv, 'node-b'], expect: success });
    await narrator.admin(nodeB, ['volume', 'delete', pv]);
  } catch (err) {
    narrator.check(false, `demo stopped: ${errorMessage(err)}`);
  } finally {
    await clearRbdMounts(work);
    for (const id of Object.values(ids)) await cephAuthRemove(admin, `client.${id}`).catch(() => undefined);
    await cleanUp(work);
  }
  const leftovers = await leftoversOf(work);
  if (await rbdInfo(admin, pool, pv).catch(() => undefined)) leftovers.push(`the image ${pool}/${pv}`);
  for (const id of Object.values(ids)) {
    if (await cephAuthExists(admin, `client.${id}`).catch(() => true)) leftovers.push(`the identity client.${id}`);
  }
  say(
    leftovers.length === 0
      ? '\nLeft nothing behind: no identity, no image, no rbd-fuse, no mount, no file.'
      : `\nLEFT BEHIND: ${leftovers.join(', ')}`,
  );
  const ok = narrator.ok && leftovers.length === 0;
  say(ok ? 'Demo finished: every call answered as kubelet and the controller expect.' : 'Demo FAILED: see the marked lines above.');
  return ok ? 0 : 1;
}

/**
 * Whether a write by the fenced node fails, as it should. It may also wait instead, in D state, on a client the
 * cluster no longer answers (measured: a write that needs a journal commit does): nothing reaches the image either
 * way. run() gives up on such a child after its deadline; the node's unmountdevice later aborts the client, which
 * ends the wait.
 */
async function writeRefused(file: string): Promise<boolean> {
  const args = ['if=/dev/zero', `of=${file}`, 'bs=4096', 'count=1', 'oflag=direct,dsync', 'conv=notrunc'];
  const result = await run('dd', args, { timeoutMs: 5_000, okExitCodes: [1] }).catch(() => undefined);
  return result === undefined || result.exitCode !== 0;
}

/** After a failure: rbd-fuse mounts under the demo's dir are aborted (a fenced one would hang umount), then their daemons killed. */
async function clearRbdMounts(work: string): Promise<void> {
  for (const node of NODES) {
    const dir = join(work, 'rbd', node);
    for (const mount of (await readMountInfo()).filter((m) => m.mountPoint.startsWith(`${dir}/`))) {
      for (const fuse of await fuseMountsAt(mount.mountPoint)) await abortFuseConnection(fuse).catch(() => undefined);
      await killAndWait(await rbdFusePids(mount.mountPoint), 5_000).catch(() => undefined);
    }
  }
}

// latch demo, the main job of the README's quick start: plays, against the real executable, what the controller and
// kubelet do when a pod using a latch volume starts on node-a and stops, shows node-b refused while node-a holds the
// volume, then moves the volume (and its data) to node-b; has node-b's agent take a snapshot of it in use there and
// a backup of that, and node-a's agent restore the backup into a new volume, read back by a pod on node-a; and leaves
// nothing behind.
// `--backend rbd` plays the same on a Ceph cluster, with a fence (rbd.ts). The command, cli/demo.ts, only prints.
import { createHash } from 'node:crypto';
import { mkdir, mkdtemp, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { DEFAULT_DRIVER_NAME } from '../names.js';
import { LatchError } from '../errors.js';
import { cleanUp, kubeletOptions, leftoversOf, Narrator, runSelf, success, type DemoOptions, type Step } from './script.js';

const sha256 = (text: string) => createHash('sha256').update(text).digest('hex');

/**
 * While the pod on node-b uses the volume, an admin on node-a asks for a snapshot and a backup of it: tickets for
 * node-b, which holds it, done by node-b's agent beside the pod (the snapshot cut with the filesystem frozen where the
 * pool reflinks; on one that cannot, a whole-image copy, never made under freeze: crash-consistent). Then a
 * restore of the backup into a new volume, done by node-a's agent; a pod on node-a mounts it and reads hello.txt,
 * whose checksum must be the one written on node-b's volume. Each job is asked for with --no-wait and done by one
 * round of that node's agent (`latch agent --once`), so the demo needs no agent running in the background.
 */
async function snapshotBackupRestore(
  narrator: Narrator,
  demo: { nodeA: string; nodeB: string; pv: string; work: string; text: string },
): Promise<void> {
  const { nodeA, nodeB, pv, work, text } = demo;
  const say = (line: string) => narrator.say(line);
  /** The message of the volume's latest finished job, as its agent recorded it. */
  const lastJob = async (config: string, volume: string, done: string) => {
    const inspected = await runSelf(['volume', 'inspect', volume, '-o', 'json'], config);
    const jobs = (JSON.parse(inspected.stdout || '{}') as { status?: { jobs?: { status: { state: string; message: string } }[] } }).status
      ?.jobs;
    const last = jobs?.at(-1)?.status;
    narrator.check(
      last?.state === 'succeeded' && last.message.includes(done),
      `    -> the job: ${last?.state ?? 'none'}: ${last?.message ?? ''}`,
    );
  };
  say('\n== Snapshot, backup and restore: job tickets, done by the node agents');
  say(`[pod on node-b] sha256 of hello.txt: ${sha256(text)}`);
  await narrator.admin(nodeA, ['snapshot', 'create', pv, 'demo-snapshot', '--no-wait'], false, 'admin on node-a');
  say('       the volume is in use on node-b: the snapshot ticket is for node-b, whose agent takes it beside the pod');
  await narrator.admin(nodeB, ['agent', '--once'], false, 'agent on node-b');
  await lastJob(nodeA, pv, 'demo-snapshot');
  await narrator.admin(
    nodeA,
    ['backup', 'create', pv, 'demo-backup', '--from-snapshot', 'demo-snapshot', '--no-wait'],
    false,
    'admin on node-a',
  );
  await narrator.admin(nodeB, ['agent', '--once'], false, 'agent on node-b');
  await lastJob(nodeA, pv, 'demo-backup');
  await narrator.admin(nodeA, ['backup', 'list', pv]);

  const restored = 'pv-restored';
  await narrator.admin(
    nodeA,
    ['volume', 'restore', restored, '--from-backup', 'demo-backup', '--node', 'node-a', '--no-wait'],
    false,
    'admin on node-a',
  );
  say('       a new volume with a restore ticket (priority 2000): no pod gets it before the restore is done');
  await narrator.admin(nodeA, ['agent', '--once'], false, 'agent on node-a');
  await lastJob(nodeA, restored, 'demo-backup');

  const options = kubeletOptions(restored, '256Mi');
  await narrator.call({ who: 'controller', config: nodeA, args: ['attach', options, 'node-a'], expect: success });
  const wait = await narrator.call({
    who: 'kubelet node-a',
    config: nodeA,
    args: ['waitforattach', '', options],
    expect: (r) => typeof r.device === 'string',
  });
  const mount = join(work, `kubelet/plugins/kubernetes.io/flexvolume/${DEFAULT_DRIVER_NAME}/mounts`, restored);
  await mkdir(mount, { recursive: true, mode: 0o750 });
  await narrator.call({
    who: 'kubelet node-a',
    config: nodeA,
    args: ['mountdevice', mount, String(wait.device), options],
    expect: success,
    note: 'the restored filesystem: mounted, never reformatted',
  });
  const readBack = await readFile(join(mount, 'hello.txt'), 'utf8').catch(() => '(missing)');
  const same = sha256(readBack) === sha256(text);
  narrator.check(
    same,
    `[pod on node-a] read hello.txt from the restored volume: sha256 ${sha256(readBack)} ${same ? '(the same)' : '(DIFFERENT)'}`,
  );
  await narrator.call({ who: 'kubelet node-a', config: nodeA, args: ['unmountdevice', mount], expect: success });
  await narrator.call({ who: 'controller', config: nodeA, args: ['detach', restored, 'node-a'], expect: success });
  await narrator.admin(nodeA, ['volume', 'delete', restored]);
  await narrator.admin(nodeA, ['backup', 'delete', 'demo-backup']);
  await narrator.admin(nodeA, ['snapshot', 'delete', pv, 'demo-snapshot']);
}

/** Exit status 0 when every call answered as expected and nothing was left behind, else 1. */
export async function runDemo(options: DemoOptions, out: (text: string) => void): Promise<number> {
  if (process.getuid?.() !== 0) throw new LatchError('latch demo needs root: it sets up loop devices and mounts filesystems');
  if (options.backend === 'rbd') {
    const { runRbdDemo } = await import('./rbd.js');
    return runRbdDemo(options, out);
  }
  const work = await mkdtemp('/tmp/latch-demo-');
  const narrator = new Narrator(out);
  const say = (text: string) => narrator.say(text);
  const call = (step: Step) => narrator.call(step);
  try {
    const backups = join(work, 'backups');
    await mkdir(backups);
    const configFor = async (node: string) => {
      const path = join(work, `config-${node}.json`);
      const config = {
        nodeName: node,
        // Both node names run on this host and share its ledger and pool (docs/operations.md, "Where a volume lives").
        oneHost: true,
        stateDir: join(work, 'state'),
        poolDir: join(work, 'pool'),
        logFile: join(work, 'latch.log'),
        defaultSize: '256Mi',
        waitForAttachTimeout: 5,
        backupTarget: { type: 'dir', path: backups },
      };
      await writeFile(path, JSON.stringify(config, null, 2));
      return path;
    };
    const nodeA = await configFor('node-a');
    const nodeB = await configFor('node-b');
    const pv = 'pv-demo';
    const options = kubeletOptions(pv, '256Mi');
    const globalMount = join(work, `kubelet/plugins/kubernetes.io/flexvolume/${DEFAULT_DRIVER_NAME}/mounts`, pv);

    say(`latch demo: a pod with volume ${pv} starts on node-a, stops, and the volume moves to node-b.`);
    say(`Everything lives in ${work}; two configs share its ledger and pool, as two nodes sharing storage would.\n`);

    say('== Pod starts on node-a');
    await call({ who: 'kubelet node-a', config: nodeA, args: ['init'], expect: success });
    await call({
      who: 'controller',
      config: nodeA,
      args: ['attach', options, 'node-a'],
      expect: success,
      note: 'volume created lazily, ticket granted to node-a',
    });
    await call({ who: 'controller', config: nodeA, args: ['isattached', options, 'node-a'], expect: (r) => r.attached === true });
    const wait = await call({
      who: 'kubelet node-a',
      config: nodeA,
      args: ['waitforattach', '', options],
      expect: (r) => typeof r.device === 'string',
    });
    const deviceA = String(wait.device);
    await mkdir(globalMount, { recursive: true, mode: 0o750 });
    await call({
      who: 'kubelet node-a',
      config: nodeA,
      args: ['mountdevice', globalMount, deviceA, options],
      expect: success,
      note: 'blank device: formatted ext4, mounted, checked in the mount table',
    });
    const text = `written on node-a at ${new Date().toISOString()}\n`;
    await writeFile(join(globalMount, 'hello.txt'), text);
    say(`[pod on node-a] wrote hello.txt: ${text.trim()}`);

    say('\n== node-b wants the same read-write-once volume while node-a holds it');
    await call({
      who: 'controller',
      config: nodeB,
      args: ['attach', options, 'node-b'],
      expect: (r) => r.status === 'Failure' && String(r.message).includes('node-a'),
    });
    await call({ who: 'controller', config: nodeB, args: ['isattached', options, 'node-b'], expect: (r) => r.attached === false });

    say('\n== Pod stops on node-a');
    await call({
      who: 'kubelet node-a',
      config: nodeA,
      args: ['unmountdevice', globalMount],
      expect: success,
      note: 'unmounted, loop device released, release confirmed in the ledger',
    });
    await call({ who: 'controller', config: nodeA, args: ['detach', pv, 'node-a'], expect: success });

    say('\n== The pod moves to node-b and finds its data');
    await call({ who: 'controller', config: nodeB, args: ['attach', options, 'node-b'], expect: success });
    const waitB = await call({
      who: 'kubelet node-b',
      config: nodeB,
      args: ['waitforattach', '', options],
      expect: (r) => typeof r.device === 'string',
    });
    await call({
      who: 'kubelet node-b',
      config: nodeB,
      args: ['mountdevice', globalMount, String(waitB.device), options],
      expect: success,
      note: 'a filesystem is there already: mounted, never reformatted',
    });
    const readBack = await readFile(join(globalMount, 'hello.txt'), 'utf8').catch(() => '(missing)');
    narrator.check(readBack === text, `[pod on node-b] read hello.txt: ${readBack.trim()}`);

    await snapshotBackupRestore(narrator, { nodeA, nodeB, pv, work, text });

    await call({ who: 'kubelet node-b', config: nodeB, args: ['unmountdevice', globalMount], expect: success });
    await call({ who: 'controller', config: nodeB, args: ['detach', pv, 'node-b'], expect: success });
    const removed = await runSelf(['volume', 'delete', pv], nodeB);
    say(`[admin] latch volume delete ${pv}\n    -> ${removed.stdout.trim() || removed.stderr.trim()}`);
    narrator.ok &&= removed.exitCode === 0;
  } finally {
    await cleanUp(work);
  }
  const leftovers = await leftoversOf(work);
  say(leftovers.length === 0 ? '\nLeft nothing behind: no loop device, no mount, no file.' : `\nLEFT BEHIND: ${leftovers.join(', ')}`);
  const ok = narrator.ok && leftovers.length === 0;
  say(ok ? 'Demo finished: every call answered as kubelet and the controller expect.' : 'Demo FAILED: see the marked lines above.');
  return ok ? 0 : 1;
}

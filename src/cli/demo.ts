// latch demo, the main job of the README's quick start: plays, against the real executable, what the controller and
// kubelet do when a pod using a latch volume starts on node-a and stops, shows node-b refused while node-a holds the
// volume, then moves the volume (and its data) to node-b, and leaves nothing behind.
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { DEFAULT_DRIVER_NAME } from '../config.js';
import { LatchError } from '../errors.js';
import { listLoopDevices, detachLoop } from '../sys/loop.js';
import { readMountInfo, umount } from '../sys/mounts.js';
import { run } from '../sys/run.js';
import { runningExecutable } from '../host/driver-file.js';
import type { CommandIO } from './io.js';

export interface Step {
  who: string;
  config: string;
  args: string[];
  /** What the reply must show for the demo to count as working. */
  expect: (reply: Record<string, unknown>) => boolean;
  note?: string;
}

/** How a demo tells its story: each driver call shown with its reply, and whether everything went as expected. */
export class Narrator {
  ok = true;
  constructor(private readonly io: CommandIO) {}

  say(text: string): void {
    this.io.out(`${text}\n`);
  }

  /** Runs a driver call of this executable as `step.config`'s node and shows it; a reply not as expected fails the demo. */
  async call(step: Step): Promise<Record<string, unknown>> {
    const shown = step.args.map((a) => (a.startsWith('{') ? "'<options json>'" : a === '' ? '""' : a)).join(' ');
    this.say(`[${step.who}] latch ${shown}`);
    const result = await runSelf(step.args, step.config);
    let reply: Record<string, unknown> = {};
    try {
      reply = JSON.parse(result.stdout) as Record<string, unknown>;
    } catch {
      reply = { status: 'unparsable', output: result.stdout };
    }
    const good = step.expect(reply) && result.stderr === '' && result.exitCode === (reply.status === 'Failure' ? 1 : 0);
    this.ok &&= good;
    this.say(`    -> ${result.stdout.trim()}  (exit ${result.exitCode})${good ? '' : '   <-- NOT AS EXPECTED'}`);
    if (step.note) this.say(`       ${step.note}`);
    return reply;
  }

  /** An admin command of this executable with `config`; a non-zero exit fails the demo unless `mayFail`. */
  async admin(config: string, args: string[], mayFail = false): Promise<{ output: string; exitCode: number }> {
    this.say(`[admin] latch ${args.join(' ')}`);
    const result = await runSelf(args, config);
    const output = `${result.stdout}${result.stderr}`.trim();
    const good = mayFail || result.exitCode === 0;
    this.ok &&= good;
    this.say(`${output.replace(/^/gm, '    -> ')}${good ? '' : '   <-- NOT AS EXPECTED'}`);
    return { output, exitCode: result.exitCode };
  }

  check(good: boolean, text: string): void {
    this.ok &&= good;
    this.say(`${text}${good ? '' : '   <-- NOT AS EXPECTED'}`);
  }
}

export const success = (r: Record<string, unknown>) => r.status === 'Success';

/** What kubelet passes as options: Go's json.Marshal of them, keys sorted. */
export function kubeletOptions(pv: string, size: string): string {
  return JSON.stringify({
    'kubernetes.io/fsType': 'ext4',
    'kubernetes.io/pvOrVolumeName': pv,
    'kubernetes.io/readwrite': 'rw',
    size,
  });
}

export interface DemoOptions {
  /** loop (default): two nodes on one host sharing a pool directory; rbd: two nodes on a Ceph cluster, and a fence. */
  backend?: 'loop' | 'rbd';
  cephConf?: string;
  cephKeyring?: string;
  pool?: string;
}

/** Exit status 0 when every call answered as expected and nothing was left behind, else 1. */
export async function demo(options: DemoOptions, io: CommandIO): Promise<number> {
  if (process.getuid?.() !== 0) throw new LatchError('latch demo needs root: it sets up loop devices and mounts filesystems');
  if (options.backend === 'rbd') {
    const { demoRbd } = await import('./demo-rbd.js');
    return demoRbd(options, io);
  }
  const work = await mkdtemp('/tmp/latch-demo-');
  const narrator = new Narrator(io);
  const say = (text: string) => narrator.say(text);
  const call = (step: Step) => narrator.call(step);
  try {
    const configFor = async (node: string) => {
      const path = join(work, `config-${node}.json`);
      const config = {
        nodeName: node,
        stateDir: join(work, 'state'),
        poolDir: join(work, 'pool'),
        logFile: join(work, 'latch.log'),
        defaultSize: '256Mi',
        waitForAttachTimeout: 5,
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
      note: 'blank device: formatted ext4, mounted, checked with findmnt',
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

/** Runs this same executable (bundle or single-executable build) with its own config. */
export async function runSelf(args: string[], config: string) {
  const self = await runningExecutable();
  const [command, prefix] = self.selfContained ? [self.path, []] : [process.execPath, [self.path]];
  const previous = process.env.LATCH_CONFIG;
  process.env.LATCH_CONFIG = config;
  try {
    return await run(command, [...prefix, ...args], { okExitCodes: [0, 1] });
  } finally {
    if (previous === undefined) delete process.env.LATCH_CONFIG;
    else process.env.LATCH_CONFIG = previous;
  }
}

/** Unmounts and detaches whatever the demo left (even after a failure), then removes its directory. */
export async function cleanUp(work: string): Promise<void> {
  const mounts = (await readMountInfo()).filter((m) => m.mountPoint.startsWith(`${work}/`)).reverse();
  for (const m of mounts) await umount(m.mountPoint).catch(() => undefined);
  for (const loop of await listLoopDevices()) {
    if (loop.backingFile.startsWith(`${work}/`)) await detachLoop(loop.device).catch(() => undefined);
  }
  await rm(work, { recursive: true, force: true });
}

export async function leftoversOf(work: string): Promise<string[]> {
  const found: string[] = [];
  if ((await readMountInfo()).some((m) => m.mountPoint.startsWith(`${work}/`))) found.push('a mount');
  if ((await listLoopDevices()).some((l) => l.backingFile.startsWith(`${work}/`))) found.push('a loop device');
  if (existsSync(work)) found.push(work);
  return found;
}

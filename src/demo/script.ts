// What the demos share: the narration of each driver call and its reply, running this executable as a node, and
// the cleanup of what a demo made on the host.
import { existsSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { runningExecutable } from '../host/driver-file.js';
import { detachLoop, listLoopDevices } from '../sys/loop.js';
import { readMountInfo, umount } from '../sys/mounts.js';
import { run } from '../sys/run.js';

export interface DemoOptions {
  /** loop (default): two nodes on one host sharing a pool directory; rbd: two nodes on a Ceph cluster, and a fence. */
  backend?: 'loop' | 'rbd';
  cephConf?: string;
  cephKeyring?: string;
  pool?: string;
}

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
  /** `out` prints a piece of the story (the command's stdout). */
  constructor(private readonly out: (text: string) => void) {}

  say(text: string): void {
    this.out(`${text}\n`);
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

  /**
   * An admin command of this executable with `config`; a non-zero exit fails the demo unless `mayFail`. `who` names
   * where it runs (an admin on node-a, node-b's agent), when that is the point.
   */
  async admin(config: string, args: string[], mayFail = false, who = 'admin'): Promise<{ output: string; exitCode: number }> {
    this.say(`[${who}] latch ${args.join(' ')}`);
    const result = await runSelf(args, config);
    const output = `${result.stdout}${result.stderr}`.trim();
    const good = mayFail || result.exitCode === 0;
    this.ok &&= good;
    this.say(`${(output || `(exit ${result.exitCode})`).replace(/^/gm, '    -> ')}${good ? '' : '   <-- NOT AS EXPECTED'}`);
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

/** Runs this same executable (bundle or single-executable build) with its own config. */
export async function runSelf(args: string[], config: string) {
  const self = await runningExecutable();
  const [command, prefix] = self.selfContained ? [self.path, []] : [process.execPath, [self.path]];
  return run(command, [...prefix, ...args], { okExitCodes: [0, 1], env: { ...process.env, LATCH_CONFIG: config } });
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

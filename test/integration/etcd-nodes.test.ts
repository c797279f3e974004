// Three simulated nodes sharing one etcd ledger and one pool: three configs with different nodeName, the same
// poolDir and etcd store, each running pod lifecycles concurrently through the bundled driver, as kubelet and the
// controller would call it: attach (retried while another node holds the volume), waitforattach, mountdevice,
// write, unmountdevice, detach. Checked:
//  - never two nodes holding a read-write-once volume: the windows in which a node certainly holds it (from its
//    waitforattach reply to the start of its unmountdevice) never overlap, a watcher reading the ledger never sees
//    two nodes on a volume, and a log file on each volume holds every cycle's line (no write lost to a concurrent
//    mount);
//  - no lost ticket: while a node is between its successful attach and its detach, the watcher always finds its
//    ticket; at the end every volume is detached with no ticket left.
// Needs root and loop devices (skips with a message otherwise) and etcd.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { appendFile, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { ticketId } from '../../src/ledger/ids.js';
import { Ledger } from '../../src/ledger/ledger.js';
import { EtcdStore } from '../../src/store/etcd.js';
import { EtcdCluster, etcdSkipReason } from '../etcd/etcd.js';
import { bundleForNode } from '../fixtures/bundle.js';

const NODES = ['node-a', 'node-b', 'node-c'];
const VOLUMES = ['shared-0', 'shared-1'];
const CYCLES_PER_NODE = 3;
const DRIVER = 'latch/loop';

function skipReason(): string | undefined {
  if (process.getuid?.() !== 0) return 'needs root and loop devices';
  if (!existsSync('/dev/loop-control')) return 'needs loop devices (/dev/loop-control is missing)';
  for (const tool of ['losetup', 'mkfs.ext4', 'findmnt', 'blkid', 'mount']) {
    try {
      execFileSync('sh', ['-c', `command -v ${tool}`], { stdio: 'ignore', env: { PATH: `${process.env.PATH}:/usr/sbin:/sbin` } });
    } catch {
      return `needs ${tool}`;
    }
  }
  return etcdSkipReason();
}
const skip = skipReason();

let work: string;
let latchJs: string;
let etcd: EtcdCluster;
const configs = new Map<string, string>();
const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

interface Reply {
  status: string;
  message?: string;
  device?: string;
}

/** One driver call as `node` (its config), like kubelet's exec. */
function driver(node: string, args: string[]): Promise<Reply> {
  const config = configs.get(node);
  assert.ok(config, `a config for ${node}`);
  return new Promise((resolvePromise, reject) => {
    const child = spawn(process.execPath, [latchJs, ...args], {
      env: { ...process.env, LATCH_CONFIG: config, PATH: `${process.env.PATH}:/usr/sbin:/sbin` },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    child.on('error', reject);
    child.on('close', (code) => {
      try {
        const reply = JSON.parse(stdout) as Reply;
        if ((code === 0) !== (reply.status === 'Success' || reply.status === 'Not supported')) {
          reject(new Error(`${args[0]} on ${node}: exit ${code} with ${stdout}`));
        }
        resolvePromise(reply);
      } catch {
        reject(new Error(`${args[0]} on ${node}: exit ${code}, not one JSON reply: ${stdout} ${stderr}`));
      }
    });
  });
}

async function ok(node: string, args: string[]): Promise<Reply> {
  const reply = await driver(node, args);
  assert.equal(reply.status, 'Success', `${args[0]} on ${node}: ${reply.message}`);
  return reply;
}

/** Cleans up whatever a failed run left: mounts under the work dir, loop devices of the pool's images. */
function cleanupKernelState(): void {
  if (!work) return;
  try {
    const mounts = execFileSync('findmnt', ['-rn', '-o', 'TARGET'], { encoding: 'utf8' }).split('\n');
    for (const target of mounts.filter((m) => m.startsWith(`${work}/`)).reverse()) {
      try {
        execFileSync('umount', ['-l', target], { stdio: 'ignore' });
      } catch {
        // already gone
      }
    }
    const loops = execFileSync('losetup', ['--list', '--noheadings', '--output', 'NAME,BACK-FILE'], { encoding: 'utf8' });
    for (const line of loops.split('\n')) {
      const [name, ...rest] = line.trim().split(/\s+/);
      if (name && rest.join(' ').startsWith(`${work}/`)) {
        try {
          execFileSync('losetup', ['-d', name], { stdio: 'ignore' });
        } catch {
          // already gone
        }
      }
    }
  } catch {
    // best effort
  }
}

interface Window {
  node: string;
  volume: string;
  from: number;
  to: number;
}

describe('three nodes, one etcd ledger, concurrent pod lifecycles', { skip, timeout: 180_000 }, () => {
  before(async () => {
    work = mkdtempSync('/tmp/latch-etcd-nodes-');
    latchJs = join(work, 'latch');
    // The same bundle as bin/latch (build.mjs), from the current sources.
    await bundleForNode('src/bin.ts', latchJs);
    etcd = await EtcdCluster.start({ size: 1 });
    for (const node of NODES) {
      const path = join(work, `${node}.json`);
      writeFileSync(
        path,
        JSON.stringify({
          nodeName: node,
          oneHost: true, // simulated nodes on one host share the pool
          poolDir: join(work, 'pool'),
          stateDir: join(work, node, 'state'),
          logFile: join(work, node, 'latch.log'),
          defaultSize: '32Mi',
          defaultFsType: 'ext4',
          waitForAttachTimeout: 60,
          store: { type: 'etcd', endpoints: etcd.endpoints, prefix: '/nodes/' },
        }),
      );
      configs.set(node, path);
    }
  });
  after(async () => {
    cleanupKernelState();
    await etcd?.stop();
    if (work) rmSync(work, { recursive: true, force: true });
  });

  it('never lets two nodes hold a read-write-once volume, and loses no ticket', async () => {
    const windows: Window[] = [];
    const active = new Map<string, { volume: string; since: number }>(); // node -> between attach Success and detach
    const violations: string[] = [];
    const lines = new Map<string, string[]>(VOLUMES.map((v) => [v, []]));
    let snapshots = 0;
    let refusedAttaches = 0;
    let running = true;

    // The watcher: reads the ledger the whole time and checks what every snapshot says.
    const watcher = (async () => {
      const ledger = new Ledger(new EtcdStore({ endpoints: etcd.endpoints, prefix: '/nodes/' }));
      while (running) {
        const readStart = Date.now();
        const docs = await Promise.all(VOLUMES.map((v) => ledger.get(v)));
        snapshots++;
        for (const [i, volume] of VOLUMES.entries()) {
          const doc = docs[i];
          if (doc && Object.keys(doc.status.nodes).length > 1) {
            violations.push(`${volume} held by ${JSON.stringify(doc.status.nodes)} at once`);
          }
          for (const [node, a] of active) {
            if (a.volume !== volume || a.since >= readStart) continue;
            const id = ticketId('workload', volume, DRIVER, node);
            // Still active when the read ended, so the ticket must have been there for the whole read.
            if (active.get(node) === a && !doc?.spec.tickets[id]) violations.push(`lost: ${node}'s ticket on ${volume} is missing`);
          }
        }
        await sleep(20);
      }
      await ledger.store.close();
    })();

    const lifecycle = async (node: string, n: number) => {
      for (let k = 0; k < CYCLES_PER_NODE; k++) {
        const volume = VOLUMES[(n + k) % VOLUMES.length];
        assert.ok(volume);
        const json = JSON.stringify({
          'kubernetes.io/pvOrVolumeName': volume,
          'kubernetes.io/fsType': 'ext4',
          'kubernetes.io/readwrite': 'rw',
          'kubernetes.io/pod.name': `pod-${node}-${k}`,
          'kubernetes.io/pod.namespace': 'default',
        });
        const global = join(work, node, 'plugins', 'mounts', volume);
        mkdirSync(join(work, node, 'plugins', 'mounts'), { recursive: true });

        // The controller: attach, retried while another node holds the volume.
        const giveUp = Date.now() + 120_000;
        for (;;) {
          const reply = await driver(node, ['attach', json, node]);
          if (reply.status === 'Success') break;
          assert.match(reply.message ?? '', /cannot be attached to node .* yet/, `attach on ${node}`);
          refusedAttaches++;
          assert.ok(Date.now() < giveUp, `attach of ${volume} on ${node} never succeeded: ${reply.message}`);
          await sleep(100 + Math.random() * 100);
        }
        active.set(node, { volume, since: Date.now() });

        // kubelet on the node.
        const { device } = await ok(node, ['waitforattach', '', json]);
        const from = Date.now();
        assert.ok(device, `waitforattach on ${node} names the device`);
        assert.match(device, /^\/dev\/loop\d+$/);
        await ok(node, ['mountdevice', global, device, json]);
        const log = join(global, 'cycles.log');
        const before = existsSync(log) ? (await readFile(log, 'utf8')).split('\n').filter(Boolean) : [];
        assert.deepEqual(before, lines.get(volume), `${volume} on ${node}: the log holds other lines than the cycles wrote`);
        const line = `${node} cycle ${k}`;
        await appendFile(log, `${line}\n`);
        lines.get(volume)!.push(line);
        await sleep(Math.random() * 150);
        const to = Date.now();
        await ok(node, ['unmountdevice', global]);
        windows.push({ node, volume, from, to });

        // The controller again.
        active.delete(node);
        await ok(node, ['detach', volume, node]);
      }
    };

    try {
      await Promise.all(NODES.map((node, n) => lifecycle(node, n)));
    } finally {
      running = false;
      await watcher;
    }

    // Certain-hold windows of different nodes on one volume never overlap.
    for (const a of windows) {
      for (const b of windows) {
        if (a === b || a.volume !== b.volume || a.node === b.node) continue;
        if (a.from < b.to && b.from < a.to) violations.push(`${a.volume}: ${a.node} and ${b.node} held it at the same time`);
      }
    }
    // At the end: detached, no ticket, no holder; every cycle's line on the volume it wrote to.
    const ledger = new Ledger(new EtcdStore({ endpoints: etcd.endpoints, prefix: '/nodes/' }));
    for (const volume of VOLUMES) {
      const doc = await ledger.get(volume);
      assert.ok(doc, `${volume} is in the ledger`);
      assert.deepEqual(doc.spec.tickets, {}, `${volume}: tickets left`);
      assert.deepEqual(doc.status.nodes, {}, `${volume}: holders left`);
      assert.equal(doc.status.state, 'detached');
      assert.equal(doc.status.filesystem, 'ext4');
    }
    await ledger.store.close();
    const mount = join(work, 'check');
    mkdirSync(mount);
    for (const volume of VOLUMES) {
      execFileSync('mount', ['-o', 'loop,ro', join(work, 'pool', `${volume}.img`), mount]);
      try {
        assert.deepEqual(readFileSync(join(mount, 'cycles.log'), 'utf8').split('\n').filter(Boolean), lines.get(volume));
      } finally {
        execFileSync('umount', [mount]);
      }
    }
    console.log(
      `three nodes: ${windows.length} pod cycles on ${VOLUMES.length} volumes, ${refusedAttaches} attaches refused while ` +
        `another node held the volume, ${snapshots} ledger snapshots checked, violations=${violations.length}`,
    );
    assert.deepEqual(violations, []);
    assert.equal(windows.length, NODES.length * CYCLES_PER_NODE);
    assert.ok(refusedAttaches > 0, 'no attach was ever refused: the nodes did not contend');
  });
});

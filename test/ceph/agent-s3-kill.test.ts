// The node agent SIGKILLed in the middle of a backup job and of a restore job whose target is S3 (Ceph's RADOS
// Gateway on the one-host test cluster: cluster.ts, rgw.ts). Real `latch agent` processes on two simulated nodes
// (node-a and node-b: two configuration files sharing the file-store ledger and the loop pool, each with its own
// copies of the credentials and key files), jobs asked through the ledger as the commands ask them. After each kill:
// nothing half-made is listed (no backup in the target; a restored volume that keeps its ticket, so no pod gets it),
// the lock the dead agent held does not block the next run, and the restarted agent finishes the job; the restored
// bytes are the volume's. The engine-level kills (a process running createBackup or restoreBackup) are in
// backup-s3.test.ts; the same kills on a directory target in test/integration/agent-jobs.test.ts and jobs-restore.test.ts.
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import {
  closeSync,
  copyFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { after, before, describe, it } from 'node:test';
import { CreateBucketCommand, S3Client } from '@aws-sdk/client-s3';
import { LoopBackend } from '../../src/backend/loop.js';
import { collectGarbage } from '../../src/backup/delete.js';
import type { S3Target } from '../../src/backup/layout.js';
import { listBackups } from '../../src/backup/manifest.js';
import { storeOf } from '../../src/backup/store.js';
import { verifyBackup } from '../../src/backup/verify.js';
import type { CommandIO } from '../../src/cli/io.js';
import { volumeRestore } from '../../src/cli/volume/restore.js';
import { parseConfig, type Config } from '../../src/config.js';
import { createContext, type Context } from '../../src/context.js';
import { jobRequest } from '../../src/jobs/request.js';
import { finishedJob, isSatisfied } from '../../src/ledger/arbitrate.js';
import { jobTicketId } from '../../src/ledger/ids.js';
import type { VolumeDoc } from '../../src/ledger/types.js';
import { bundleForNode } from '../fixtures/bundle.js';
import { checkInvariants } from '../fixtures/ledger-invariants.js';
import { trackChild } from '../fixtures/tracked-children.js';
import { cephSkipReason, startCephCluster, type CephCluster } from './cluster.js';
import { rgwSkipReason, startRgw } from './rgw.js';

const MiB = 1024 * 1024;
/** A safety net for waiting on the agents (not an assertion about speed): a stuck job fails the test here. */
const PATIENCE_MS = 90_000;
const SIZE = 192 * MiB;
const skip = process.getuid?.() !== 0 ? 'needs root: loop devices' : (cephSkipReason() ?? rgwSkipReason());

type Node = 'node-a' | 'node-b';

describe('the agent SIGKILLed during an S3 backup job and an S3 restore job', { skip }, () => {
  let root = '';
  let latchJs = '';
  let ceph: CephCluster | undefined;
  let target: S3Target;
  const files = new Map<Node, string>();
  const configs = new Map<Node, Config>();
  const agents = new Map<Node, ChildProcess>();
  let stderr = '';

  const ctx = (node: Node = 'node-a'): Context => createContext(configs.get(node) as Config);
  const io = (node: Node): CommandIO => ({
    out: () => undefined,
    env: { LATCH_CONFIG: files.get(node) },
    context: (c) => createContext(c),
  });
  const image = (volume: string) => join(root, 'pool', `${volume}.img`);
  const sha256 = (path: string) => createHash('sha256').update(readFileSync(path)).digest('hex');

  function startAgent(node: Node): ChildProcess {
    const child = spawn(process.execPath, [latchJs, 'agent'], {
      env: { ...process.env, LATCH_CONFIG: files.get(node) },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    trackChild(child);
    child.stderr?.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    agents.set(node, child);
    return child;
  }

  async function killAgent(node: Node, signal: NodeJS.Signals = 'SIGKILL'): Promise<void> {
    const child = agents.get(node);
    agents.delete(node);
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((resolve) => child.once('exit', resolve));
    child.kill(signal);
    await exited;
  }

  async function until<T>(what: string, probe: () => Promise<T | undefined | false>, intervalMs = 50): Promise<T> {
    const deadline = Date.now() + PATIENCE_MS;
    for (;;) {
      const value = await probe();
      if (value !== undefined && value !== false) return value;
      assert.ok(Date.now() < deadline, `waited too long for ${what}; agent stderr: ${stderr}`);
      await sleep(intervalMs);
    }
  }

  const doc = async (volume: string): Promise<VolumeDoc> => {
    const d = await ctx().ledger.get(volume);
    assert.ok(d, `volume ${volume} exists`);
    return d;
  };
  const objectKeys = async (prefix: string) => (await (await storeOf(target)).list(prefix)).map((o) => o.key);

  before(async () => {
    if (skip) return;
    root = mkdtempSync(join(tmpdir(), 'latch-agent-s3-kill-'));
    latchJs = await bundleForNode('src/bin.ts', join(root, 'latch.js'));
    ceph = await startCephCluster();
    const rgw = await startRgw(ceph);
    const s3 = new S3Client({
      endpoint: rgw.endpoint,
      region: 'us-east-1',
      forcePathStyle: true,
      credentials: { accessKeyId: rgw.accessKeyId, secretAccessKey: rgw.secretAccessKey },
    });
    await s3.send(new CreateBucketCommand({ Bucket: 'latch-kill' }));
    s3.destroy();
    mkdirSync(join(root, 'pool'));
    const key = `${randomBytes(48).toString('base64')}\n`;
    for (const node of ['node-a', 'node-b'] as const) {
      // Each node its own copies of the secrets, as two hosts would have.
      const own = join(root, node);
      mkdirSync(own, { mode: 0o700 });
      writeFileSync(join(own, 'backup.key'), key, { mode: 0o600 });
      copyFileSync(rgw.credentialsFile, join(own, 'credentials.json'));
      const nodeTarget: S3Target = {
        type: 's3',
        endpoint: rgw.endpoint,
        bucket: 'latch-kill',
        prefix: 'cluster-a/',
        credentialsFile: join(own, 'credentials.json'),
        keyFile: join(own, 'backup.key'),
      };
      if (node === 'node-a') target = nodeTarget;
      const raw = {
        nodeName: node,
        oneHost: true, // simulated nodes on one host: they share the pool and the ledger
        poolDir: join(root, 'pool'),
        stateDir: join(root, 'state'),
        logFile: join(root, `${node}.log`),
        backupTarget: nodeTarget,
        agent: { listen: '127.0.0.1:0', intervalSeconds: 1 },
      };
      const file = join(own, 'config.json');
      writeFileSync(file, JSON.stringify(raw));
      files.set(node, file);
      configs.set(node, parseConfig(raw, file));
    }
  });

  after(async () => {
    for (const node of [...agents.keys()]) await killAgent(node);
    if (root && existsSync(join(root, 'pool'))) {
      const backend = new LoopBackend({ poolDir: join(root, 'pool'), maxSize: 1024 ** 4 });
      for (const file of readdirSync(join(root, 'pool')).filter((f) => f.endsWith('.img'))) {
        await backend.release(file.slice(0, -'.img'.length)).catch(() => undefined);
      }
    }
    await ceph?.stop();
    if (root) rmSync(root, { recursive: true, force: true });
  });

  it('a backup job: killed once chunks are in the bucket, nothing is listed; restarted, it completes once, reusing them', async (t) => {
    // An idle volume holding 128 MiB of random bytes in four runs (incompressible: the upload takes a while).
    const a = ctx('node-a');
    await a.ledger.createVolume('vol', { sizeBytes: SIZE, fsType: 'ext4' });
    await a.backend.create('vol', SIZE);
    const fd = openSync(image('vol'), 'r+');
    for (let run = 0; run < 4; run++) writeSync(fd, randomBytes(32 * MiB), 0, 32 * MiB, (8 + run * 48) * MiB);
    closeSync(fd);

    const request = jobRequest(a, 'vol', { kind: 'backup', backup: 'b1' }, 'node-a');
    await a.ledger.requestJob('vol', request);
    const agent = startAgent('node-a');
    const exited = new Promise((resolve) => agent.once('exit', resolve));
    const stored = await Promise.race([
      exited.then(() => assert.fail(`the agent exited: ${stderr}`)),
      until('the first chunks in the bucket', async () => {
        const chunks = await objectKeys('chunks/');
        return chunks.length > 0 && chunks.length;
      }),
    ]);
    await killAgent('node-a');
    const killed = await doc('vol');
    t.diagnostic(`killed with ${(await objectKeys('chunks/')).length} chunk(s) stored (${stored} at the first look)`);
    assert.equal(killed.status.tickets[request.id]?.job?.state, 'running', 'killed while the job ran');
    assert.deepEqual(checkInvariants(killed, 'vol'), [], 'the ledger keeps its invariants');
    assert.deepEqual(await listBackups(target), [], 'nothing listed');
    assert.deepEqual(await objectKeys('backups/'), [], 'no manifest in the bucket');

    // Restarted: the dead agent's lock (a process of this host that is gone) is taken over, the job redone.
    startAgent('node-a');
    await until('the backup to finish', async () => (await doc('vol')).spec.tickets[request.id] === undefined);
    await killAgent('node-a', 'SIGTERM');
    const done = await doc('vol');
    const finished = finishedJob(done, request.id);
    assert.equal(finished?.status.state, 'succeeded', finished?.status.message);
    assert.equal(finished?.status.attempts, 2, 'redone by the restarted agent');
    assert.ok(
      Number(finished?.status.result?.presentChunks) > 0,
      `the killed run's chunks are reused: ${JSON.stringify(finished?.status.result)}`,
    );
    assert.deepEqual([Object.keys(done.spec.tickets), done.status.nodes], [[], {}], 'no ticket or hold left');
    assert.equal(await a.backend.findDevice('vol'), undefined, 'no loop device left');
    assert.deepEqual(
      (await listBackups(target)).map((b) => [b.name, b.authenticated]),
      [['b1', true]],
    );
    assert.equal((await verifyBackup({ target, name: 'b1' })).ok, true);
    assert.equal((await collectGarbage({ target, lock: { waitMs: 5_000 } })).removedChunks, 0, 'no chunk is left unreferenced');
  });

  it('a restore job on node-b: killed midway, the volume keeps its ticket and no pod gets it; restarted, the bytes are the volume’s', async (t) => {
    const a = ctx('node-a');
    const restoreId = jobTicketId('restore', 'copy', 'b1');
    await volumeRestore({ name: 'copy', fromBackup: 'b1', node: 'node-b', wait: false }, io('node-a'));
    const agent = startAgent('node-b');
    const exited = new Promise((resolve) => agent.once('exit', resolve));
    await Promise.race([
      exited.then(() => assert.fail(`the agent exited: ${stderr}`)),
      // Looked at often: a restore from the gateway on this host writes tens of MiB in 50 ms.
      until('the restore to write 4 MiB', async () => existsSync(image('copy')) && statSync(image('copy')).blocks * 512 > 4 * MiB, 2),
    ]);
    await killAgent('node-b');
    t.diagnostic(`killed with ${Math.round((statSync(image('copy')).blocks * 512) / MiB)} MiB of 128 MiB written`);
    const killed = await doc('copy');
    assert.equal(killed.status.tickets[restoreId]?.job?.state, 'running', 'killed while the job ran');
    assert.equal(killed.status.filesystem, undefined, 'no filesystem recorded');
    assert.deepEqual(checkInvariants(killed, 'copy'), []);
    assert.notEqual(sha256(image('copy')), sha256(image('vol')), 'the copy is incomplete');
    // A pod's ticket waits: a half-restored volume is never handed to a workload.
    const workload = 'workload-test-node-a';
    await a.ledger.addTicket('copy', {
      id: workload,
      type: 'workload',
      nodeID: 'node-a',
      parameters: { readOnly: false },
      requestedBy: { pvName: 'copy' },
    });
    assert.equal(isSatisfied(await doc('copy'), workload), false, 'the workload waits');

    startAgent('node-b');
    const done = await until('the restore to finish', async () => {
      const d = await doc('copy');
      if (d.spec.tickets[restoreId]) assert.equal(isSatisfied(d, workload), false, 'never granted before the restore is done');
      return finishedJob(d, restoreId) !== undefined && d;
    });
    const finished = finishedJob(done, restoreId);
    assert.equal(finished?.status.state, 'succeeded', finished?.status.message);
    assert.equal(finished?.status.attempts, 2, 'redone from the start by the restarted agent');
    assert.equal(finished?.node, 'node-b');
    await until('the workload to be granted', async () => isSatisfied(await doc('copy'), workload));
    await a.ledger.removeTicket('copy', workload);
    await killAgent('node-b', 'SIGTERM');
    assert.equal(sha256(image('copy')), sha256(image('vol')), 'byte for byte');
    if (stderr) t.diagnostic(`the agents' stderr: ${stderr.slice(0, 500)}`);
  });
});

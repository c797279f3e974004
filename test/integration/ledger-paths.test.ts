// The ledger is untrusted input wherever it names a path (docs/ledger.md, "Who may write the ledger"): any node's
// certificate can write any document, and the agent acts as root. On a real loop device with ext4 (root): a manual
// attach mounts only at this node's <manualAttach.mountRoot>/<volume>, nosuid,nodev,noexec (read back from
// /proc/self/mountinfo); a ticket that names another path (/etc/cron.d, a `..` path), a symlink planted at the mount
// point, or a mount root others may write is refused with nothing mounted; and the other names a job carries into a
// path (snapshot, backup, clone and restore names) are refused when they would leave their directory; a device the
// ledger names is never used (the node finds its own in the kernel).
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { chmodSync, existsSync, lstatSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { parseConfig, type Config } from '../../src/config.js';
import { createContext, type Context } from '../../src/context.js';
import type { JobSpec, Ticket } from '../../src/ledger/types.js';
import { setUpDevice } from '../../src/node/device.js';
import { attachJob, manualMountPath } from '../../src/node/jobs/attach.js';
import { backupJob } from '../../src/node/jobs/backup.js';
import { cloneJob } from '../../src/node/jobs/clone.js';
import { restoreJob } from '../../src/node/jobs/restore.js';
import { snapshotJob } from '../../src/node/jobs/snapshot.js';
import type { JobOf, JobRun } from '../../src/node/jobs/types.js';
import { parseMountInfo } from '../../src/sys/mounts.js';
import { MemoryStore } from '../fixtures/memory-store.js';

const MiB = 1024 * 1024;
const notRoot = process.getuid?.() !== 0 ? 'needs root: loop devices, mkfs.ext4 and mount' : false;

/** The mounts whose source is `device`, from the kernel's table. */
function mountsOf(device: string) {
  return parseMountInfo(readFileSync('/proc/self/mountinfo', 'utf8')).filter((m) => m.source === device);
}

describe('paths a node reads from the ledger', { skip: notRoot }, () => {
  let root = '';
  let config: Config;
  let ctx: Context;
  let device = '';
  const store = new MemoryStore();

  const configWith = (extra: Record<string, unknown> = {}) =>
    parseConfig(
      {
        nodeName: 'node-a',
        poolDir: join(root, 'pool'),
        stateDir: join(root, 'state'),
        logFile: join(root, 'latch.log'),
        backupTarget: { type: 'dir', path: join(root, 'target') },
        manualAttach: { mountRoot: join(root, 'manual') },
        ...extra,
      },
      'test',
    );

  function ticketFor(job: JobSpec): Ticket {
    return {
      id: 'manual-test',
      type: 'manual',
      nodeID: 'node-a',
      parameters: { readOnly: false, disableFrontend: true },
      job,
      generation: 1,
      createdAt: new Date().toISOString(),
      requestedBy: { admin: true },
    };
  }

  async function runOf(job: JobSpec, c: Context = ctx): Promise<JobRun> {
    const doc = await c.ledger.get('vol');
    assert.ok(doc);
    return { ctx: c, volume: 'vol', ticket: ticketFor(job), doc, device, signal: new AbortController().signal };
  }

  const attach = async (job: JobOf<'attach'>, c: Context = ctx) => attachJob.run(job, await runOf(job, c));

  before(async () => {
    root = mkdtempSync('/tmp/latch-ledger-paths-');
    mkdirSync(join(root, 'target'));
    config = configWith();
    ctx = createContext(config, { store });
    await ctx.ledger.createVolume('vol', { sizeBytes: 32 * MiB, fsType: 'ext4' });
    await ctx.backend.create('vol', 32 * MiB);
    device = await ctx.backend.attach('vol');
    execFileSync('mkfs.ext4', ['-q', device]);
  });
  after(async () => {
    for (const m of device ? mountsOf(device) : []) execFileSync('umount', ['-l', m.mountPoint]);
    await ctx?.backend.release('vol').catch(() => undefined);
    if (root) rmSync(root, { recursive: true, force: true });
  });

  it('a manual attach whose ticket names a path outside the mount root (/etc/cron.d, a .. path) is refused; nothing is mounted', async () => {
    const own = manualMountPath(config, 'vol');
    for (const mountPath of ['/etc/cron.d', '/root/.ssh', `${join(root, 'manual')}/../../etc`, join(root, 'manual', 'other'), '/']) {
      await assert.rejects(
        attach({ kind: 'attach', mountPath }),
        new RegExp(
          `asks node node-a to mount volume vol at .*; a manual attach mounts only at ${own} \\(manualAttach.mountRoot\\): refused`,
        ),
        mountPath,
      );
      assert.deepEqual(mountsOf(device), [], `nothing mounted for ${mountPath}`);
    }
  });

  it('a symlink planted at the mount point, or a mount root others may write, is refused; nothing is mounted', async () => {
    const own = manualMountPath(config, 'vol');
    const outside = join(root, 'outside');
    mkdirSync(outside);
    mkdirSync(join(root, 'manual'), { recursive: true, mode: 0o700 });
    symlinkSync(outside, own);
    await assert.rejects(
      attach({ kind: 'attach', mount: true }),
      /the mount point .*\/manual\/vol is a symbolic link: refused, nothing mounted/,
    );
    assert.deepEqual(mountsOf(device), []);
    rmSync(own);

    chmodSync(join(root, 'manual'), 0o777);
    await assert.rejects(
      attach({ kind: 'attach', mount: true }),
      /manualAttach.mountRoot .*\/manual is owned by uid 0 with mode 777; it must be owned by uid 0 and writable by it alone: refused, nothing mounted/,
    );
    assert.deepEqual(mountsOf(device), []);
    chmodSync(join(root, 'manual'), 0o700);

    // The mount root itself a symlink to a directory others control: refused too.
    const elsewhere = join(root, 'manual-link');
    symlinkSync(outside, elsewhere);
    const linked = createContext(configWith({ manualAttach: { mountRoot: elsewhere } }), { store });
    await assert.rejects(attach({ kind: 'attach', mount: true }, linked), /manualAttach.mountRoot .*manual-link is a symbolic link/);
    assert.deepEqual(mountsOf(device), []);
  });

  it('an accepted manual attach mounts at <mountRoot>/<volume>, nosuid,nodev,noexec, in a root-only directory; cleanUp undoes it', async () => {
    const own = manualMountPath(config, 'vol');
    const job: JobOf<'attach'> = { kind: 'attach', mount: true };
    const outcome = await attach(job);
    assert.match(outcome.message, new RegExp(`volume vol \\(${device}, ext4\\) is mounted at ${own}`));
    assert.equal(outcome.result?.mountPath, own);
    const [m] = mountsOf(device);
    assert.equal(m?.mountPoint, own);
    for (const flag of ['nosuid', 'nodev', 'noexec']) assert.ok(m?.options.includes(flag), `${flag} in ${m?.options.join(',')}`);
    assert.equal(lstatSync(join(root, 'manual')).mode & 0o077, 0, 'the mount root is root-only');
    // Again: found mounted, nothing more.
    assert.match((await attach(job)).message, /is mounted at/);
    assert.equal(mountsOf(device).length, 1);
    await attachJob.cleanUp?.(job, await runOf(job));
    assert.deepEqual(mountsOf(device), []);
    assert.equal(existsSync(own), false, 'its directory removed');

    // manualAttach.exec: programs may run, still nosuid and nodev. A legacy mountPath that is this very path is fine.
    const exec = createContext(configWith({ manualAttach: { mountRoot: join(root, 'manual'), exec: true } }), { store });
    const legacy: JobOf<'attach'> = { kind: 'attach', mountPath: own };
    await attach(legacy, exec);
    const [e] = mountsOf(device);
    assert.ok(e?.options.includes('nosuid') && e.options.includes('nodev') && !e.options.includes('noexec'), e?.options.join(','));
    await attachJob.cleanUp?.(legacy, await runOf(legacy, exec));
    assert.deepEqual(mountsOf(device), []);
  });

  it("a device the ledger names is never used: a node sets up and records its kernel's own", async () => {
    // A forged hold: node-a attaching with /dev/sda as its device.
    await ctx.ledger.update(
      'vol',
      (doc) =>
        doc && {
          ...doc,
          status: {
            ...doc.status,
            state: 'attaching',
            currentNodes: ['node-a'],
            nodes: { 'node-a': { phase: 'attaching', readOnly: false, since: new Date().toISOString(), device: '/dev/sda' } },
          },
        },
    );
    const forged = await ctx.ledger.get('vol');
    assert.ok(forged);
    const { device: used, doc } = await setUpDevice(ctx, 'vol', forged);
    assert.equal(used, device, "the loop device over the volume's image, found in the kernel");
    assert.match(used, /^\/dev\/loop\d+$/);
    assert.equal(doc.status.nodes['node-a']?.device, device, 'and that is what the ledger now says');
    assert.equal(await ctx.backend.findDevice('vol'), device);
    await ctx.ledger.update('vol', (d) => d && { ...d, status: { ...d.status, state: 'detached', currentNodes: [], nodes: {} } });
  });

  it('names a job carries into a path (snapshot, backup, restore, clone) are refused when they would leave their directory', async () => {
    for (const evil of ['../../etc/cron.d/x', '..', 'a/../../b', '/etc/passwd']) {
      const snap: JobOf<'snapshot'> = { kind: 'snapshot', snapshot: evil };
      await assert.rejects(snapshotJob.run(snap, await runOf(snap)), /snapshot name .* is not allowed|snapshot name .* is empty/, evil);
      const backup: JobOf<'backup'> = { kind: 'backup', backup: evil };
      await assert.rejects(backupJob.run(backup, await runOf(backup)), /backup name .* is not allowed/, evil);
      const restore: JobOf<'restore'> = { kind: 'restore', backup: evil };
      await assert.rejects(restoreJob.run(restore, await runOf(restore)), /backup name .* is not allowed/, evil);
      const fromSnapshot: JobOf<'backup'> = { kind: 'backup', backup: 'fine', fromSnapshot: evil };
      await assert.rejects(backupJob.run(fromSnapshot, await runOf(fromSnapshot)), /snapshot name .* is not allowed/, evil);
      const clone: JobOf<'clone'> = { kind: 'clone', role: 'target', source: evil, target: 'vol', fromSnapshot: 's' };
      await assert.rejects(cloneJob.run(clone, await runOf(clone)), /is not allowed|not a valid|invalid/, evil);
    }
    assert.deepEqual(mountsOf(device), []);
  });
});

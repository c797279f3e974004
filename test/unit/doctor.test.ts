// latch doctor's checks on planted ledgers and configurations, without loop devices (install.bats plants real
// ones): stale holds, volumes stuck detaching on this node and on others, an overcommitted pool, a broken config,
// missing tools, the exit status, and the shell quoting of fixes.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { doctorExitCode } from '../../src/cli/doctor.js';
import { sh, type DoctorReport, type Finding } from '../../src/doctor/findings.js';
import { runDoctor } from '../../src/doctor/run.js';
import { parseConfig } from '../../src/config.js';
import { addTicket, newVolume } from '../../src/ledger/arbitrate.js';
import { ticketId } from '../../src/ledger/ids.js';
import { Ledger } from '../../src/ledger/ledger.js';
import type { NodePhase, VolumeDoc } from '../../src/ledger/types.js';
import { openStore } from '../../src/store/index.js';
import { findTool, toolSearchPath } from '../../src/sys/run.js';
import { defined } from '../fixtures/defined.js';

const NOW = Date.parse('2030-01-01T12:00:00Z');
let base: string;
let n = 0;

before(() => {
  base = mkdtempSync(join(tmpdir(), 'latch-doctor-'));
});
after(() => {
  rmSync(base, { recursive: true, force: true });
});

interface Env {
  dir: string;
  env: NodeJS.ProcessEnv;
  /** Undefined for an invalid configuration. */
  ledger: Ledger | undefined;
}

/** A config in a fresh directory, an installed "driver" that is this test's self, and every tool on the path. */
async function environment(overrides: Record<string, unknown> = {}): Promise<Env> {
  const dir = join(base, `env-${++n}`);
  const tools = join(dir, 'tools');
  mkdirSync(tools, { recursive: true });
  for (const tool of [
    'losetup',
    'blkid',
    'mount',
    'umount',
    'findmnt',
    'setpriv',
    'getfattr',
    'setfattr',
    'mkfs.ext4',
    'resize2fs',
    'mkfs.xfs',
    'xfs_growfs',
  ]) {
    writeFileSync(join(tools, tool), '#!/bin/sh\n', { mode: 0o755 });
  }
  const self = join(dir, 'self');
  writeFileSync(self, 'a self-contained build\n', { mode: 0o755 });
  const plugins = join(dir, 'plugins');
  mkdirSync(join(plugins, 'latch~loop'), { recursive: true });
  writeFileSync(join(plugins, 'latch~loop/loop'), 'a self-contained build\n', { mode: 0o755 });
  const raw = {
    nodeName: 'node-a',
    stateDir: join(dir, 'state'),
    poolDir: join(dir, 'pool'),
    logFile: join(dir, 'log/latch.log'),
    allowedFsTypes: ['ext4', 'xfs'],
    ...overrides,
  };
  writeFileSync(join(dir, 'config.json'), JSON.stringify(raw));
  const env = { LATCH_CONFIG: join(dir, 'config.json'), LATCH_TOOL_PATH: tools, LATCH_VOLUME_PLUGIN_DIR: plugins, PATH: '/nowhere' };
  let ledger: Ledger | undefined;
  try {
    ledger = new Ledger(await openStore(parseConfig(raw, 'test')), () => new Date(NOW).toISOString());
  } catch {
    ledger = undefined; // a test of an invalid configuration
  }
  return { dir, env, ledger };
}

function doctor(e: Env): Promise<DoctorReport> {
  return runDoctor({ env: e.env, self: join(e.dir, 'self'), now: () => NOW, stuckAfterSeconds: 300 });
}

/** Puts a volume in the ledger with `node` in `phase` since `since`, with a workload ticket of that node. */
async function plant(e: Env, name: string, node: string, phase: NodePhase, since: string): Promise<void> {
  await defined(e.ledger, 'the ledger').update(name, () => {
    let doc: VolumeDoc = newVolume(name, 64 * 1024 ** 2, 'ext4', since);
    if (phase !== 'detaching') {
      const id = ticketId('workload', name, 'latch/loop', node);
      doc = addTicket(doc, { id, type: 'workload', nodeID: node, parameters: { readOnly: false }, requestedBy: { pvName: name } }, since);
    }
    doc.status.nodes[node] = { phase, readOnly: false, since, device: '/dev/loop99' };
    doc.status.currentNodes = [node];
    doc.status.state = phase === 'granted' ? 'attaching' : phase;
    return doc;
  });
}

function findings(report: DoctorReport, check: string, severity?: string): Finding[] {
  return report.findings.filter((f) => f.check === check && (severity === undefined || f.severity === severity));
}

describe('doctor', () => {
  test('a healthy node: every check ok, exit 0', async () => {
    const e = await environment();
    const report = await doctor(e);
    assert.deepEqual(
      report.findings.filter((f) => f.severity !== 'ok'),
      [],
    );
    assert.equal(report.healthy, true);
    assert.equal(doctorExitCode(report), 0);
    assert.match(findings(report, 'driver')[0]!.message, /identical/);
  });

  test('a hold of this node without a device: error when attached, warning while attaching, with the release command', async () => {
    const e = await environment();
    await plant(e, 'vol-attached', 'node-a', 'attached', '2030-01-01T11:00:00.000Z');
    await plant(e, 'vol-attaching', 'node-a', 'attaching', '2030-01-01T11:59:00.000Z');
    await plant(e, 'vol-elsewhere', 'node-b', 'attached', '2030-01-01T11:00:00.000Z');
    const report = await doctor(e);
    const [attached] = findings(report, 'ledger', 'error');
    assert.match(
      attached!.message,
      /^stale ticket: volume vol-attached is attached on node node-a in the ledger \(device \/dev\/loop99, since 2030-01-01T11:00:00.000Z; ticket\(s\) workload-[0-9a-f]{12}\.\.\.\), but no loop device/,
    );
    assert.equal(attached!.fix, 'latch volume release vol-attached --node node-a --node-is-down');
    const [attaching] = findings(report, 'ledger', 'warning');
    assert.match(attaching!.message, /volume vol-attaching is attaching .* run latch doctor again/);
    assert.equal(
      report.findings.some((f) => f.message.includes('vol-elsewhere')),
      false,
      "another node's holds are its own doctor's business",
    );
    assert.equal(doctorExitCode(report), 1);
  });

  test('volumes stuck detaching: on this node with a safe release, on another node with advice only; recent ones are fine', async () => {
    const e = await environment();
    await plant(e, 'vol-stuck-here', 'node-a', 'detaching', '2030-01-01T11:40:00.000Z');
    await plant(e, 'vol-stuck-there', 'node-b', 'detaching', '2030-01-01T09:00:00.000Z');
    await plant(e, 'vol-just-now', 'node-a', 'detaching', '2030-01-01T11:59:00.000Z');
    const report = await doctor(e);
    const stuck = findings(report, 'detaching');
    assert.equal(stuck.length, 2, JSON.stringify(stuck));
    const here = defined(stuck.find((f) => f.message.includes('vol-stuck-here')));
    assert.equal(here.severity, 'warning');
    assert.match(
      here.message,
      /has been detaching from node node-a for 20m \(since 2030-01-01T11:40:00.000Z\): no device of it is set up here any more/,
    );
    assert.equal(here.fix, 'latch volume release vol-stuck-here --node node-a --node-is-down');
    const there = defined(stuck.find((f) => f.message.includes('vol-stuck-there')));
    assert.match(there.message, /for 3h .*node node-b has not confirmed/);
    assert.equal(there.fix, undefined, 'whether node-b is down is for a person to decide');
    assert.match(
      defined(there.note),
      /run latch doctor on node-b; if node-b is down for good: latch volume release vol-stuck-there --node node-b --node-is-down/,
    );
    assert.equal(doctorExitCode(report), 2, 'warnings only');
  });

  test('an overcommitted pool is a warning', async () => {
    const e = await environment();
    mkdirSync(join(e.dir, 'pool'));
    await defined(e.ledger, 'the ledger').update('huge', () => newVolume('huge', 2 ** 52, 'ext4', '2030-01-01T00:00:00.000Z'));
    const report = await doctor(e);
    const [pool] = findings(report, 'pool', 'warning');
    assert.match(pool!.message, /^pool overcommitted: 4.0Pi provisioned/);
    assert.match(defined(pool?.note), /free space on the filesystem of/);
  });

  test('missing tools: required ones are errors, those of other allowed filesystems and growing are warnings', async () => {
    const e = await environment({ allowedFsTypes: ['ext4', 'xfs', 'btrfs'] });
    rmSync(join(defined(e.env.LATCH_TOOL_PATH), 'blkid'));
    const report = await doctor(e);
    const errors = findings(report, 'tools', 'error');
    assert.deepEqual(
      errors.map((f) => f.message.split(' ')[0]),
      ['blkid'],
    );
    assert.equal(errors[0]!.fix, 'apt-get install -y util-linux');
    const warnings = findings(report, 'tools', 'warning');
    assert.deepEqual(
      warnings.map((f) => f.message.split(' ')[0]),
      ['mkfs.btrfs', 'btrfs'],
    );
    assert.equal(warnings[0]!.fix, 'apt-get install -y btrfs-progs');
    assert.match(defined(warnings[0]?.note), /or remove "btrfs" from allowedFsTypes in /);
  });

  test('an invalid configuration is an error naming the file and field; the rest is still checked', async () => {
    const e = await environment({ waitForAttachTimeout: 9999 });
    const report = await doctor(e);
    const [config] = findings(report, 'config', 'error');
    assert.match(config!.message, /field "waitForAttachTimeout"/);
    assert.match(defined(config?.fix), /config\.json$/);
    assert.ok(findings(report, 'tools', 'ok').length === 1 && findings(report, 'loop').length === 1);
    assert.equal(report.node, undefined);
  });

  test('a missing driver, a different one, and leftovers in its directory', async () => {
    const e = await environment();
    const plugins = defined(e.env.LATCH_VOLUME_PLUGIN_DIR);
    writeFileSync(join(plugins, 'latch~loop/loop'), '#!/bin/sh\n# another vendor\n', { mode: 0o755 });
    const foreign = findings(await doctor(e), 'driver', 'error');
    assert.match(foreign[0]!.message, /is not a latch driver: another vendor's driver has the name latch\/loop/);
    assert.match(defined(foreign[0]?.fix), /latch install --driver/);
    writeFileSync(join(plugins, 'latch~loop/loop'), 'another build of latch/v1\n', { mode: 0o755 });
    writeFileSync(join(plugins, 'latch~loop/.loop.1.deadbeef.tmp'), 'half');
    let report = await doctor(e);
    const driver = findings(report, 'driver');
    assert.match(driver[0]!.message, /differs from .*self/);
    assert.equal(driver[0]!.fix, `latch install --plugin-dir ${plugins}`);
    assert.match(driver[1]!.message, /temporary file of an install that was interrupted/);
    assert.equal(driver[1]!.fix, `rm ${join(plugins, 'latch~loop/.loop.1.deadbeef.tmp')}`);

    rmSync(join(plugins, 'latch~loop'), { recursive: true });
    report = await doctor(e);
    assert.equal(findings(report, 'driver', 'error')[0]!.fix, `latch install --plugin-dir ${plugins}`);
  });

  test('the Node.js bundle installed where no node is found is an error', async () => {
    const e = await environment();
    writeFileSync(join(e.dir, 'self'), '#!/usr/bin/env node\n"bundle";\n');
    writeFileSync(join(defined(e.env.LATCH_VOLUME_PLUGIN_DIR), 'latch~loop/loop'), '#!/usr/bin/env node\n"bundle";\n', { mode: 0o755 });
    let report = await doctor(e);
    assert.match(findings(report, 'driver', 'error')[0]!.message, /is the Node.js bundle .* but node is not found/);
    symlinkSync(process.execPath, join(defined(e.env.LATCH_TOOL_PATH), 'node'));
    report = await doctor(e);
    assert.equal(findings(report, 'driver', 'error').length, 0);
  });
});

describe('doctor helpers', () => {
  test('toolSearchPath: PATH plus the sbin directories, or exactly $LATCH_TOOL_PATH', () => {
    assert.deepEqual(toolSearchPath({ PATH: '/bin:/usr/sbin' }), ['/bin', '/usr/sbin', '/usr/local/sbin', '/sbin']);
    assert.deepEqual(toolSearchPath({ PATH: '/bin', LATCH_TOOL_PATH: '/t1:/t2' }), ['/t1', '/t2']);
    assert.ok(toolSearchPath({}).includes('/usr/bin'));
  });

  test('findTool finds executables only', async () => {
    const dir = join(base, `tools-${++n}`);
    mkdirSync(dir);
    writeFileSync(join(dir, 'exe'), '', { mode: 0o755 });
    writeFileSync(join(dir, 'plain'), '', { mode: 0o644 });
    mkdirSync(join(dir, 'adir'));
    assert.equal(findTool('exe', ['/nonexistent', dir]), join(dir, 'exe'));
    assert.equal(findTool('plain', [dir]), undefined);
    assert.equal(findTool('adir', [dir]), undefined);
  });

  test('sh quotes what the shell would split or expand', () => {
    assert.equal(sh('/dev/loop3'), '/dev/loop3');
    assert.equal(sh('/var/lib/kubelet/pods/x/volumes/latch~loop/pv'), '/var/lib/kubelet/pods/x/volumes/latch~loop/pv');
    assert.equal(sh('~root/x'), "'~root/x'");
    assert.equal(sh('/a/$(reboot)'), "'/a/$(reboot)'");
    assert.equal(sh("/a b/it's"), `'/a b/it'\\''s'`);
  });
});

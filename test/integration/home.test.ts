// Where a volume lives, and the configurations that cannot keep it safe, through the built executable (bin/latch) as
// kubelet, the controller and people run it (root: real loop devices, ext4 and mounts).
//
// The lost-data scenario: node-a and node-b share one ledger but each has a pool of its own. A volume written on
// node-a must never come up on node-b as a fresh, empty image: mount (non-attach mode), attach and waitforattach
// (attach mode) on node-b fail naming node-a, and change nothing. Configurations under which that cannot be promised
// (each node a ledger of its own in non-attach mode, rbd on the file store, a singleNode configuration on another
// node) are refused by driver calls, the agent, doctor and install alike. Every refusal leaves the ledger, the pools
// and the kernel as they were.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { loadConfig } from '../../src/config.js';
import { createContext } from '../../src/context.js';

const LATCH = join(__dirname, '..', '..', 'bin', 'latch');
const skip =
  process.getuid?.() !== 0 ? 'needs root: loop devices, mkfs and mount' : !existsSync(LATCH) ? 'needs bin/latch: npm run build' : false;

interface Run {
  status: number | null;
  stdout: string;
  stderr: string;
}

function run(config: string, args: string[]): Run {
  const r = spawnSync(process.execPath, [LATCH, ...args], {
    env: { ...process.env, LATCH_CONFIG: config },
    encoding: 'utf8',
    timeout: 120_000,
  });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** A driver call: exactly one JSON object on stdout, nothing on stderr. */
function driver(config: string, args: string[]): { status: string; message?: string; device?: string } {
  const r = run(config, args);
  assert.equal(r.stderr, '', `driver ${args[0]} wrote to stderr`);
  const reply = JSON.parse(r.stdout) as { status: string; message?: string; device?: string };
  assert.equal(r.stdout.trim(), JSON.stringify(reply), 'one JSON object on stdout');
  return reply;
}

function ok(config: string, args: string[]): { status: string; device?: string } {
  const reply = driver(config, args);
  assert.equal(reply.status, 'Success', `${args[0]}: ${JSON.stringify(reply)}`);
  return reply;
}

/** An admin command that must fail with one line on stderr. */
function refusedCommand(config: string, args: string[], pattern: RegExp): string {
  const r = run(config, args);
  assert.notEqual(r.status, 0, `latch ${args.join(' ')} must fail: ${r.stdout}`);
  const lines = r.stderr.trimEnd().split('\n');
  assert.equal(lines.length, 1, `one line on stderr: ${r.stderr}`);
  assert.match(lines[0] ?? '', pattern);
  return lines[0] ?? '';
}

const options = (pv: string, extra: Record<string, string> = {}) =>
  JSON.stringify({
    'kubernetes.io/fsType': 'ext4',
    'kubernetes.io/pvOrVolumeName': pv,
    'kubernetes.io/readwrite': 'rw',
    size: '64Mi',
    ...extra,
  });

describe('where a volume lives, and configurations that cannot keep it safe', { skip }, () => {
  let root = '';
  let state = '';
  const pools = { 'node-a': '', 'node-b': '' };

  /** Writes a configuration for `node` (its own pool, the shared ledger unless overridden) and returns its path. */
  function config(name: string, node: 'node-a' | 'node-b', fields: Record<string, unknown> = {}): string {
    const path = join(root, 'configs', `${name}.json`);
    const raw = {
      nodeName: node,
      poolDir: pools[node],
      stateDir: state,
      logFile: join(root, 'log', `${node}.log`),
      defaultSize: '64Mi',
      maxSize: '1Gi',
      waitForAttachTimeout: 30,
      ...fields,
    };
    writeFileSync(path, JSON.stringify(raw));
    return path;
  }

  /** The ledger's files, the pools' images, the loop devices over them and the mounts below root, as one text. */
  function snapshot(): string {
    const files: string[] = [];
    const walk = (dir: string) => {
      if (!existsSync(dir)) return;
      for (const entry of readdirSync(dir, { withFileTypes: true }).sort((a, b) => a.name.localeCompare(b.name))) {
        const path = join(dir, entry.name);
        if (entry.isDirectory()) walk(path);
        else files.push(`${path} ${statSync(path).size} ${createHash('sha256').update(readFileSync(path)).digest('hex')}`);
      }
    };
    walk(state);
    walk(pools['node-a']);
    walk(pools['node-b']);
    const loops = readdirSync('/sys/block')
      .filter((d) => d.startsWith('loop'))
      .map((d) => {
        try {
          return `${d} ${readFileSync(`/sys/block/${d}/loop/backing_file`, 'utf8').trim()}`;
        } catch {
          return '';
        }
      })
      .filter((l) => l.includes(root));
    const mounts = readFileSync('/proc/self/mountinfo', 'utf8')
      .split('\n')
      .filter((l) => l.includes(root))
      .map((l) => l.split(' ').slice(3, 5).join(' '));
    return [...files, ...loops, ...mounts].join('\n');
  }

  /** `refusal` must change nothing that the snapshot sees. */
  function unchangedBy<T>(refusal: () => T): T {
    const before = snapshot();
    const result = refusal();
    assert.equal(snapshot(), before, 'the refusal left the ledger, the pools and the kernel as they were');
    return result;
  }

  const podDir = (node: string, uid: string, pv: string) => {
    const dir = join(root, `kubelet-${node}`, 'pods', uid, 'volumes', 'latch~loop', pv);
    mkdirSync(dir, { recursive: true });
    return dir;
  };

  before(() => {
    root = mkdtempSync('/tmp/latch-home-');
    state = join(root, 'state');
    pools['node-a'] = join(root, 'pool-a');
    pools['node-b'] = join(root, 'pool-b');
    mkdirSync(join(root, 'configs'));
  });

  after(() => {
    // Whatever a failed test left: mounts below root, then loop devices over its images.
    const mounts = readFileSync('/proc/self/mountinfo', 'utf8')
      .split('\n')
      .map((l) => l.split(' ')[4] ?? '')
      .filter((m) => m.startsWith(root))
      .reverse();
    for (const m of mounts) spawnSync('umount', ['-l', m]);
    for (const d of readdirSync('/sys/block').filter((n) => n.startsWith('loop'))) {
      try {
        if (readFileSync(`/sys/block/${d}/loop/backing_file`, 'utf8').includes(root)) spawnSync('losetup', ['-d', `/dev/${d}`]);
      } catch {
        /* not set up */
      }
    }
    rmSync(root, { recursive: true, force: true });
  });

  describe('configurations that cannot be safe are refused', () => {
    it('a driver call in non-attach mode on a file store of its own: Failure, every time (also from the remembered validation)', () => {
      const own = config('nonattach-own', 'node-b', { attach: false, stateDir: join(root, 'state-b') });
      for (let i = 0; i < 2; i++) {
        for (const args of [['init'], ['mount', podDir('node-b', 'uid-own', 'pv-own'), options('pv-own')]]) {
          const reply = unchangedBy(() => driver(own, args));
          assert.equal(reply.status, 'Failure');
          assert.match(reply.message ?? '', /non-attach mode \("attach": false\) with the file store .* a new, empty volume there/);
          assert.match(reply.message ?? '', /use the etcd store .*"singleNode": "node-b"/);
        }
      }
      assert.ok(existsSync(join(root, 'configs', '.nonattach-own.json.validated')), 'the second round ran from the remembered validation');
      assert.ok(!existsSync(join(root, 'state-b')), 'no ledger was made');
    });

    it('the rbd backend on the file store: Failure, before anything touches Ceph', () => {
      const rbd = config('rbd-file', 'node-a', { backend: { type: 'rbd', pool: 'latch' } });
      const reply = unchangedBy(() => driver(rbd, ['init']));
      assert.equal(reply.status, 'Failure');
      assert.match(
        reply.message ?? '',
        /the rbd backend .* the file store is this node's own ledger, so two nodes could each map one image/,
      );
    });

    it('a singleNode configuration on another node: Failure naming both', () => {
      const other = config('single-elsewhere', 'node-b', { attach: false, singleNode: 'node-a' });
      const reply = unchangedBy(() => driver(other, ['mount', podDir('node-b', 'uid-s', 'pv-s'), options('pv-s')]));
      assert.equal(reply.status, 'Failure');
      assert.match(reply.message ?? '', /it is for node node-a alone \("singleNode"\), but this is node node-b/);
    });

    it('the agent, doctor and the other commands refuse it with one line and a non-zero exit', () => {
      const own = config('nonattach-own-2', 'node-b', { attach: false, stateDir: join(root, 'state-b') });
      unchangedBy(() => refusedCommand(own, ['agent', '--once'], /^latch: invalid configuration .* non-attach mode/));
      unchangedBy(() => refusedCommand(own, ['volume', 'list'], /^latch: invalid configuration .* non-attach mode/));
      const doctor = unchangedBy(() => run(own, ['doctor', '-o', 'json', '--plugin-dir', join(root, 'plugins')]));
      assert.equal(doctor.status, 1, doctor.stderr);
      const report = JSON.parse(doctor.stdout) as { findings: { check: string; severity: string; message: string }[] };
      const finding = report.findings.find((f) => f.check === 'config');
      assert.equal(finding?.severity, 'error');
      assert.match(finding?.message ?? '', /non-attach mode .* "singleNode": "node-b"/);
    });

    it('install refuses to print manifests for a cluster configuration that cannot be safe', () => {
      const base = config('base', 'node-a');
      for (const [cluster, pattern] of [
        [{ attach: false, store: { type: 'file' } }, /non-attach mode/],
        [{ backend: { type: 'rbd' } }, /the rbd backend/],
      ] as const) {
        const file = join(root, 'configs', 'cluster.json');
        writeFileSync(file, JSON.stringify(cluster));
        refusedCommand(base, ['install', '--print-manifests', '--cluster-config', file], pattern);
      }
      // One node, declared: accepted.
      const file = join(root, 'configs', 'cluster-single.json');
      writeFileSync(file, JSON.stringify({ attach: false, singleNode: 'node-a' }));
      const printed = run(base, ['install', '--print-manifests', '--cluster-config', file]);
      assert.equal(printed.status, 0, printed.stderr);
      assert.match(printed.stdout, /"singleNode": "node-a"/);
    });

    it('accepts them once the one node is declared (singleNode) or the nodes are simulated on one host (oneHost)', () => {
      const single = config('single', 'node-a', { attach: false, singleNode: 'node-a', stateDir: join(root, 'state-single') });
      assert.equal(driver(single, ['init']).status, 'Success');
      const oneHost = config('one-host-rbd', 'node-a', { oneHost: true, backend: { type: 'rbd', pool: 'latch' } });
      assert.equal(driver(oneHost, ['init']).status, 'Success');
      rmSync(join(root, 'state-single'), { recursive: true, force: true });
    });
  });

  describe('a volume written on node-a never comes up empty on node-b', () => {
    it('non-attach mode: mount on node-b fails naming node-a and the nodeAffinity; node-a still has the data', () => {
      // Shared ledger (simulated nodes of one host), a pool each.
      const a = config('na-a', 'node-a', { attach: false, oneHost: true });
      const b = config('na-b', 'node-b', { attach: false, oneHost: true });
      const podA = podDir('node-a', 'uid-a1', 'pv-na');
      ok(a, ['mount', podA, options('pv-na')]);
      writeFileSync(join(podA, 'data.txt'), 'written on node-a\n');
      ok(a, ['unmount', podA]);
      assert.ok(existsSync(join(pools['node-a'], 'pv-na.img')));

      const reply = unchangedBy(() => driver(b, ['mount', podDir('node-b', 'uid-b1', 'pv-na'), options('pv-na')]));
      assert.equal(reply.status, 'Failure');
      assert.match(reply.message ?? '', /volume pv-na lives on node node-a .* not on node node-b/);
      assert.match(reply.message ?? '', /nodeAffinity .* kubernetes\.io\/hostname In \[node-a\]/);
      assert.ok(!existsSync(join(pools['node-b'], 'pv-na.img')), 'no empty image on node-b');

      const podA2 = podDir('node-a', 'uid-a2', 'pv-na');
      ok(a, ['mount', podA2, options('pv-na')]);
      assert.equal(readFileSync(join(podA2, 'data.txt'), 'utf8'), 'written on node-a\n');
      ok(a, ['unmount', podA2]);
    });

    it('attach mode: attach and waitforattach for node-b fail naming node-a at once, and change nothing', () => {
      const a = config('at-a', 'node-a', { oneHost: true });
      const b = config('at-b', 'node-b', { oneHost: true });
      const pv = 'pv-at';
      const mount = join(root, 'kubelet-node-a', 'plugins', pv);
      mkdirSync(mount, { recursive: true });
      ok(a, ['attach', options(pv), 'node-a']);
      const { device } = ok(a, ['waitforattach', '', options(pv)]);
      ok(a, ['mountdevice', mount, String(device), options(pv)]);
      writeFileSync(join(mount, 'data.txt'), 'written on node-a\n');
      ok(a, ['unmountdevice', mount]);
      ok(a, ['detach', pv, 'node-a']);

      for (const args of [
        ['attach', options(pv), 'node-b'],
        ['waitforattach', '', options(pv)],
      ]) {
        const started = Date.now();
        const reply = unchangedBy(() => driver(b, args));
        assert.equal(reply.status, 'Failure', args[0]);
        assert.match(
          reply.message ?? '',
          /volume pv-at lives on node node-a .* not on node node-b.*kubernetes\.io\/hostname In \[node-a\]/,
        );
        assert.ok(Date.now() - started < 20_000, `${args[0]} did not wait for a grant that cannot come`);
      }
      assert.ok(!existsSync(join(pools['node-b'], `${pv}.img`)));
    });

    it('a document older than homes: another node makes no image for it; the node whose pool has it adopts it', async () => {
      const a = config('old-a', 'node-a', { oneHost: true });
      const b = config('old-b', 'node-b', { oneHost: true });
      const pv = 'pv-old';
      // As an earlier latch left it: no home, the image in node-a's pool, a filesystem recorded.
      const ctxA = createContext(loadConfig({ LATCH_CONFIG: a }));
      await ctxA.ledger.createVolume(pv, { sizeBytes: 64 * 1024 * 1024, fsType: 'ext4' });
      await ctxA.backend.create(pv, 64 * 1024 * 1024);
      await ctxA.ledger.recordFilesystem(pv, 'ext4');
      assert.equal((await ctxA.ledger.get(pv))?.status.home, undefined);

      ok(b, ['attach', options(pv), 'node-b']);
      const refused = driver(b, ['waitforattach', '', options(pv)]);
      assert.equal(refused.status, 'Failure');
      assert.match(refused.message ?? '', /missing from the pool .*pool-b.* held a ext4 filesystem; refusing to create an empty one/);
      assert.ok(!existsSync(join(pools['node-b'], `${pv}.img`)), 'no empty image on node-b');
      assert.equal((await ctxA.ledger.get(pv))?.status.home, undefined, 'node-b did not become its home');
      ok(b, ['detach', pv, 'node-b']);

      ok(a, ['attach', options(pv), 'node-a']);
      ok(a, ['waitforattach', '', options(pv)]);
      assert.equal((await ctxA.ledger.get(pv))?.status.home?.node, 'node-a', 'node-a found the image and adopted it');
      const mount = join(root, 'kubelet-node-a', 'plugins', pv);
      mkdirSync(mount, { recursive: true });
      ok(a, ['unmountdevice', mount]);
      ok(a, ['detach', pv, 'node-a']);
      const away = unchangedBy(() => driver(b, ['attach', options(pv), 'node-b']));
      assert.match(away.message ?? '', /volume pv-old lives on node node-a/);
    });

    it('with a ledger each, the same pod move is refused by the configuration before anything happens', () => {
      const b = config('own-b', 'node-b', { attach: false, stateDir: join(root, 'state-own-b') });
      const reply = unchangedBy(() => driver(b, ['mount', podDir('node-b', 'uid-b2', 'pv-na'), options('pv-na')]));
      assert.equal(reply.status, 'Failure');
      assert.match(reply.message ?? '', /non-attach mode/);
      assert.ok(!existsSync(join(pools['node-b'], 'pv-na.img')));
    });
  });

  describe('volume delete and doctor', () => {
    it('delete from a node that does not reach the image refuses, naming the node to run it on; there it deletes both', () => {
      const a = config('del-a', 'node-a', { oneHost: true });
      const b = config('del-b', 'node-b', { oneHost: true });
      const created = run(a, ['volume', 'create', 'vol-del', '--size', '64Mi']);
      assert.equal(created.status, 0, created.stderr);
      unchangedBy(() => refusedCommand(b, ['volume', 'create', 'vol-del', '--size', '64Mi'], /lives on node node-a/));
      unchangedBy(() =>
        refusedCommand(
          b,
          ['volume', 'delete', 'vol-del'],
          /^latch: volume vol-del lives on node node-a .* run `latch volume delete vol-del` on node node-a; nothing was deleted$/,
        ),
      );
      const deleted = run(a, ['volume', 'delete', 'vol-del']);
      assert.equal(deleted.status, 0, deleted.stderr);
      assert.match(deleted.stdout, /^volume vol-del deleted, with its image in the pool/);
      assert.ok(!existsSync(join(pools['node-a'], 'vol-del.img')));
    });

    it('a job on an idle volume goes to its home node; --node naming a node that does not reach the image is refused', () => {
      // Attach mode on the shared file store (no oneHost: node-b's pool is not node-a's, as on two hosts).
      const a = config('job-a', 'node-a');
      const b = config('job-b', 'node-b');
      assert.equal(run(a, ['volume', 'create', 'vol-job', '--size', '64Mi']).status, 0);
      unchangedBy(() =>
        refusedCommand(
          a,
          ['snapshot', 'create', 'vol-job', 'snap-1', '--node', 'node-b', '--no-wait'],
          /^latch: volume vol-job lives on node node-a .*: a job on it runs there, not on node node-b$/,
        ),
      );
      const asked = run(b, ['snapshot', 'create', 'vol-job', 'snap-1', '--no-wait']);
      assert.equal(asked.status, 0, asked.stderr);
      assert.match(asked.stdout, /asked node node-a for it/);
    });

    it('doctor reports an image without a document, and a volume whose image is missing from its home pool', () => {
      const a = config('doc-a', 'node-a', { oneHost: true });
      assert.equal(run(a, ['volume', 'create', 'vol-gone', '--size', '64Mi']).status, 0);
      rmSync(join(pools['node-a'], 'vol-gone.img'));
      writeFileSync(join(pools['node-a'], 'ghost.img'), '');
      const doctor = run(a, ['doctor', '-o', 'json', '--plugin-dir', join(root, 'plugins')]);
      const report = JSON.parse(doctor.stdout) as { findings: { check: string; severity: string; message: string }[] };
      const images = report.findings.filter((f) => f.check === 'images');
      assert.deepEqual(
        images.map((f) => f.severity),
        ['warning', 'error'],
        JSON.stringify(images),
      );
      assert.match(images[0]?.message ?? '', /ghost\.img has no volume in the ledger/);
      assert.match(images[1]?.message ?? '', /volume vol-gone lives on this node .* its image is missing/);
      assert.equal(doctor.status, 1);
      rmSync(join(pools['node-a'], 'ghost.img'));
      const deleted = run(a, ['volume', 'delete', 'vol-gone']);
      assert.match(deleted.stdout, /^volume vol-gone deleted; it had no image in the pool/);
    });
  });
});

// doctor's kcm check on a fake /proc: which kube-controller-manager, the plugin dir it reads (flag or default), what
// it finds there as its container sees it (/proc/<pid>/root), the configuration it would read, and the trial init
// in an empty root. The trial with the real self-contained build needs root and bin/latch-sea (skips otherwise).
import assert from 'node:assert/strict';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { checkControllerManager } from '../../src/doctor/kcm.js';
import type { Finding } from '../../src/doctor/findings.js';
import { installDriver } from '../../src/cli/install.js';
import { parseConfig, type Config } from '../../src/config.js';
import { DEFAULT_PLUGIN_DIR } from '../../src/host/plugin-dir.js';

const SEA = resolve(__dirname, '..', '..', 'bin/latch-sea');
let base: string;
let n = 0;

before(() => {
  base = mkdtempSync(join(tmpdir(), 'latch-doctor-kcm-'));
});
after(() => rmSync(base, { recursive: true, force: true }));

interface Host {
  procRoot: string;
  /** KCM's root file system (its container), as /proc/<pid>/root shows it. */
  kcmRoot: string;
  config: Config;
}

/** A fake /proc with kubelet and, unless `kcm` is undefined, kube-controller-manager (pid 300) with that argv. */
function host(kcm: string[] | undefined, raw: Record<string, unknown> = {}): Host {
  const dir = join(base, `host-${++n}`);
  const procRoot = join(dir, 'proc');
  const processes: Record<number, string[]> = { 100: ['/usr/bin/kubelet', '--config=/var/lib/kubelet/config.yaml'] };
  if (kcm) processes[300] = kcm;
  for (const [pid, argv] of Object.entries(processes)) {
    mkdirSync(join(procRoot, pid), { recursive: true });
    writeFileSync(join(procRoot, pid, 'cmdline'), `${argv.join('\0')}\0`);
    writeFileSync(join(procRoot, pid, 'comm'), `${(argv[0] ?? '').split('/').pop()?.slice(0, 15)}\n`);
  }
  const kcmRoot = join(procRoot, '300/root');
  mkdirSync(kcmRoot, { recursive: true });
  const configFile = join(dir, 'config.json');
  const doc = { nodeName: 'cp-1', store: { type: 'etcd', endpoints: ['http://127.0.0.1:2379'] }, ...raw };
  writeFileSync(configFile, JSON.stringify(doc));
  return { procRoot, kcmRoot, config: parseConfig(doc, configFile) };
}

async function check(h: Host, trial = false): Promise<Finding[]> {
  const findings: Finding[] = [];
  await checkControllerManager(h.config, { LATCH_PROC_ROOT: h.procRoot }, (f) => findings.push(f), { trial });
  return findings;
}

const KCM = ['/usr/local/bin/kube-controller-manager', '--flex-volume-plugin-dir=/kcm/exec', '--leader-elect=true'];

describe('doctor: kube-controller-manager', () => {
  test('no kube-controller-manager (a worker node), or non-attach mode: nothing to say', async () => {
    assert.deepEqual(await check(host(undefined)), []);
    assert.deepEqual(await check(host(KCM, { attach: false })), []);
  });

  test('without its attach/detach controller, kubelet attaches: ok, and nothing else is checked', async () => {
    const findings = await check(host([...KCM, '--controllers=*,-attachdetach']));
    assert.equal(findings.length, 1);
    assert.equal(findings[0]?.severity, 'ok');
    assert.match(findings[0]?.message ?? '', /without its attach\/detach controller.*kubelet attaches/);
  });

  test('its --flex-volume-plugin-dir without the driver in its container: an error with the install that fixes it', async () => {
    const [finding, ...rest] = await check(host(KCM));
    assert.deepEqual(rest, []);
    assert.equal(finding?.severity, 'error');
    assert.match(finding?.message ?? '', /pid 300\) looks for FlexVolume drivers in \/kcm\/exec \(its --flex-volume-plugin-dir\)/);
    assert.match(finding?.message ?? '', /finds no \/kcm\/exec\/latch~loop\/loop in KCM's container/);
    assert.equal(finding?.fix, 'latch install --plugin-dir /kcm/exec --config-beside-driver');
  });

  test('no flag: the default plugin dir; a KCM on the host (its root is /) is told so', async () => {
    const h = host(['kube-controller-manager', '--v=2']);
    rmSync(h.kcmRoot, { recursive: true });
    symlinkSync('/', h.kcmRoot);
    const [finding] = await check(h);
    assert.match(
      finding?.message ?? '',
      new RegExp(`drivers in ${DEFAULT_PLUGIN_DIR} \\(its default; it has no --flex-volume-plugin-dir\\)`),
    );
    if (!existsSync(join(DEFAULT_PLUGIN_DIR, 'latch~loop/loop'))) {
      assert.match(finding?.message ?? '', /on this host/);
      assert.equal(finding?.fix, `latch install --plugin-dir ${DEFAULT_PLUGIN_DIR}`);
    }
  });

  test('the Node.js bundle in its plugin dir: an error, its container has no node', async () => {
    const h = host(KCM);
    mkdirSync(join(h.kcmRoot, 'kcm/exec/latch~loop'), { recursive: true });
    writeFileSync(join(h.kcmRoot, 'kcm/exec/latch~loop/loop'), '#!/usr/bin/env node\n"bundle";\n', { mode: 0o755 });
    const [finding] = await check(h);
    assert.equal(finding?.severity, 'error');
    assert.match(finding?.message ?? '', /is the Node.js bundle: KCM has no node in its container/);
  });

  test('a configuration beside the driver readable by others while it names a key: KCM would fail every call', async () => {
    const h = host(KCM);
    const driverDir = join(h.kcmRoot, 'kcm/exec/latch~loop');
    mkdirSync(join(driverDir, '.latch'), { recursive: true });
    writeFileSync(join(driverDir, 'loop'), '\x7fELF not really\n', { mode: 0o755 });
    const doc = { store: { type: 'etcd', endpoints: ['https://127.0.0.1:2379'], tls: { key: 'etcd-key.pem', cert: 'etcd-cert.pem' } } };
    writeFileSync(join(driverDir, '.latch/config.json'), JSON.stringify(doc));
    chmodSync(join(driverDir, '.latch/config.json'), 0o644);
    const findings = await check(h);
    assert.equal(findings[0]?.severity, 'ok');
    assert.match(findings[1]?.message ?? '', /KCM would fail every call: .*run chmod 600 .*config\.json/);
    assert.equal(findings[1]?.severity, 'error');
  });

  // LATCH_REQUIRE_SEA=1 (npm test): a missing bin/latch-sea fails the test instead of skipping it.
  const trialSkip =
    process.getuid?.() !== 0
      ? 'needs root (chroot)'
      : existsSync(SEA) || process.env.LATCH_REQUIRE_SEA === '1'
        ? undefined
        : `${SEA} is missing: run 'npm run build:sea'`;

  test(
    'the self-contained build installed for KCM: without the configuration beside it, then with it; trial init',
    { skip: trialSkip },
    async () => {
      const h = host(KCM);
      // Installed from the host's side into the directory KCM sees as /kcm/exec.
      const install = (configBeside?: Config) =>
        installDriver({
          pluginDir: join(h.kcmRoot, 'kcm/exec'),
          pluginDirSeenAs: '/kcm/exec',
          driverName: 'latch/loop',
          source: SEA,
          runtime: `${SEA}.runtime`,
          ...(configBeside && { configBeside }),
        });
      await install();
      let findings = await check(h, true);
      assert.match(
        findings[0]?.message ?? '',
        /finds the driver \/kcm\/exec\/latch~loop\/loop \(its --flex-volume-plugin-dir\) in KCM's container/,
      );
      assert.equal(findings[1]?.severity, 'error');
      assert.match(findings[1]?.message ?? '', /KCM sees no configuration in KCM's container/);
      assert.equal(findings[1]?.fix, 'latch install --plugin-dir /kcm/exec --config-beside-driver');
      assert.equal(findings[2]?.severity, 'ok', JSON.stringify(findings[2]));
      assert.match(findings[2]?.message ?? '', /trial init in an empty root holding only \/kcm\/exec\/latch~loop .* answered Success/);

      await install(h.config);
      findings = await check(h, true);
      assert.deepEqual(
        findings.map((f) => f.severity),
        ['ok', 'ok', 'ok'],
        JSON.stringify(findings),
      );
      assert.match(findings[1]?.message ?? '', /KCM reads its configuration from \/kcm\/exec\/latch~loop\/\.latch\/config\.json/);

      // A driver KCM cannot start (no runtime beside it): the trial says so.
      rmSync(join(h.kcmRoot, 'kcm/exec/latch~loop/.latch'), { recursive: true });
      findings = await check(h, true);
      const trial = findings.find((f) => /trial init/.test(f.message));
      assert.equal(trial?.severity, 'error');
      assert.match(trial?.message ?? '', /failed/);
    },
  );
});

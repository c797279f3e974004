import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { loadConfig, parseConfig } from '../../src/config.js';
import { redactArgs, writeLog } from '../../src/log.js';
import { checkPvName, checkVolumeName } from '../../src/names.js';
import { volumeOptions } from '../../src/contract/args.js';
import { misspelledOptionOf, parseOptions } from '../../src/contract/options.js';
import { encodeReply, exitCodeOf, failure, notSupported, success } from '../../src/contract/reply.js';
import { CONTROL_PLANE_OPS, isControlPlaneOp } from '../../src/protocol/control-plane-ops.js';
import { armDeadline } from '../../src/protocol/driver.js';
import { CONTROL_PLANE_OP_TABLE, OPS } from '../../src/protocol/ops.js';
import { formatSize, parseSize } from '../../src/size.js';

const config = parseConfig({}, 'test');

describe('options JSON', () => {
  it('parses what kubelet sends after a restart: only the kubernetes.io keys', () => {
    const o = parseOptions('{"kubernetes.io/fsType":"","kubernetes.io/pvOrVolumeName":"pv-1","kubernetes.io/readwrite":"rw"}', config);
    assert.equal(o.name, 'pv-1');
    assert.equal(o.volume, undefined);
    assert.equal(o.fsType, undefined);
    assert.equal(o.readOnly, false);
  });

  it("parses Go's escapes and unicode", () => {
    const json = '{"kubernetes.io/pod.name":"a\\u003cb\\u003e\\u0026c-\\u00e9","kubernetes.io/pvOrVolumeName":"pv-1"}';
    assert.equal(parseOptions(json, config).pod?.name, 'a<b>&c-é');
  });

  it('the user volume option wins over the PV name; size, fsType, readOnly, mountOptions are read', () => {
    const o = parseOptions(
      JSON.stringify({
        'kubernetes.io/pvOrVolumeName': 'pv-1',
        volume: 'data',
        size: '2Gi',
        fsType: 'xfs',
        readOnly: 'true',
        mountOptions: 'noatime, nodev',
      }),
      config,
    );
    assert.deepEqual([o.name, o.size, o.fsType, o.readOnly, o.mountOptions], ['data', 2 * 1024 ** 3, 'xfs', true, ['noatime', 'nodev']]);
  });

  it('kubernetes.io/readwrite ro means read-only', () => {
    assert.equal(parseOptions('{"kubernetes.io/pvOrVolumeName":"a","kubernetes.io/readwrite":"ro"}', config).readOnly, true);
  });

  it('decodes secrets and never echoes them in errors', () => {
    const o = parseOptions('{"kubernetes.io/pvOrVolumeName":"a","kubernetes.io/secret/password":"aHVudGVyMg=="}', config);
    assert.equal(o.secrets.password, 'hunter2');
    assert.throws(
      () => parseOptions('{"kubernetes.io/pvOrVolumeName":"a","kubernetes.io/secret/password":"not base64!!"}', config),
      (err: Error) => err.message.includes('kubernetes.io/secret/password') && !err.message.includes('not base64!!'),
    );
  });

  const bad: Array<[string, RegExp]> = [
    ['', /empty/],
    ['{not json', /not valid JSON/],
    ['[]', /must be a JSON object, not an array/],
    ['null', /must be a JSON object/],
    ['{}', /name no volume/],
    ['{"kubernetes.io/pvOrVolumeName":"a","size":5}', /option "size" must be a string/],
    ['{"kubernetes.io/pvOrVolumeName":"a","size":"abc"}', /option "size" "abc" is not a size/],
    ['{"kubernetes.io/pvOrVolumeName":"a","size":"-1"}', /not a size/],
    ['{"kubernetes.io/pvOrVolumeName":"a","size":"100Ti"}', /above the configured maxSize/],
    ['{"kubernetes.io/pvOrVolumeName":"a","readOnly":"yes"}', /option "readOnly" must be "true" or "false"/],
    ['{"kubernetes.io/pvOrVolumeName":"a","fsType":"ext4; rm -rf /"}', /option "fsType" is "ext4; rm -rf \/"; allowed/],
    ['{"kubernetes.io/pvOrVolumeName":"a","mountOptions":"noatime,exec=/bin/sh"}', /mountOptions.*not allowed/],
    ['{"kubernetes.io/pvOrVolumeName":"a","sise":"1Gi"}', /unknown option "sise": did you mean "size"\?$/],
    ['{"kubernetes.io/pvOrVolumeName":"a","fstype":"xfs"}', /unknown option "fstype": did you mean "fsType"\?/],
    ['{"kubernetes.io/pvOrVolumeName":"a","fooServer":5}', /option "fooServer" must be a string/],
    ['{"kubernetes.io/pvOrVolumeName":"../etc"}', /kubernetes.io\/pvOrVolumeName.*not allowed/],
    ['{"volume":"a/b"}', /option "volume" "a\/b" is not allowed/],
    ['{"volume":"$(touch /tmp/x)"}', /not allowed/],
    [`{"volume":"${'a'.repeat(300)}"}`, /300 characters long/],
    ['{"kubernetes.io/pvOrVolumeName":"a","kubernetes.io/mounterArgs.FsGroup":"x"}', /FsGroup.*decimal/],
  ];
  for (const [json, message] of bad) {
    it(`refuses ${json.slice(0, 60) || '(empty)'}`, () => {
      assert.throws(() => parseOptions(json, config), message);
    });
  }

  it("accepts other tools' options (the spec's fooServer example) and lists only their names", () => {
    const json = '{"fooServer":"192.168.0.1:1234","fooVolumeName":"bar","kubernetes.io/pvOrVolumeName":"pv-1","size":"1Gi"}';
    const o = parseOptions(json, config);
    assert.deepEqual([o.name, o.size, o.unknownKeys], ['pv-1', 1024 ** 3, ['fooServer', 'fooVolumeName']]);
    assert.doesNotMatch(JSON.stringify(o), /192\.168|"bar"/);
    assert.deepEqual(parseOptions('{"kubernetes.io/pvOrVolumeName":"a","kubernetes.io/somethingNew":"x"}', config).unknownKeys, []);
  });

  it('the volumeOptions argument puts the unknown option names, not their values, in the call log', () => {
    const log: Record<string, unknown> = {};
    const json = '{"fooServer":"s3cret-host","kubernetes.io/pvOrVolumeName":"pv-1"}';
    volumeOptions.parse(json, { op: 'getvolumename', name: 'json', config, log });
    assert.deepEqual(log, { volume: 'pv-1', unknownOptions: ['fooServer'] });
    const quiet: Record<string, unknown> = {};
    volumeOptions.parse('{"kubernetes.io/pvOrVolumeName":"pv-1"}', { op: 'getvolumename', name: 'json', config, log: quiet });
    assert.deepEqual(quiet, { volume: 'pv-1' }, 'no unknownOptions field when there is none');
  });

  const misspellings: Array<[string, string | undefined]> = [
    // case-insensitive equality, any length
    ['Size', 'size'],
    ['fstype', 'fsType'],
    ['FSTYPE', 'fsType'],
    ['readonly', 'readOnly'],
    ['Volume', 'volume'],
    ['mountoptions', 'mountOptions'],
    // edit distance <= 2 for keys of 4 or more characters
    ['sise', 'size'],
    ['szie', 'size'],
    ['sizes', 'size'],
    ['fsTyp', 'fsType'],
    ['read_only', 'readOnly'],
    ['volumes', 'volume'],
    ['mountOption', 'mountOptions'],
    ['mountOpts', undefined],
    // other tools' options, and short keys
    ['fooServer', undefined],
    ['fooVolumeName', undefined],
    ['volumeName', undefined],
    ['pool', undefined],
    ['image', undefined],
    ['server', undefined],
    ['vol', undefined],
    ['siz', undefined],
    ['', undefined],
  ];
  for (const [key, meant] of misspellings) {
    it(`misspelledOptionOf(${JSON.stringify(key)}) is ${meant ?? 'undefined'}`, () => {
      assert.equal(misspelledOptionOf(key), meant);
    });
  }

  it('ignores unknown kubernetes.io keys from newer kubelets', () => {
    assert.equal(parseOptions('{"kubernetes.io/pvOrVolumeName":"a","kubernetes.io/somethingNew":"x"}', config).name, 'a');
  });
});

describe("a call's deadline", () => {
  const timers = () => process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length;

  it('sets no timer until the event loop turns, then one for what is left of the deadline', async () => {
    // The call started 2 s ago and has 2.1 s: 100 ms are left. Armed for the whole 2.1 s, it would not expire below.
    const started = process.hrtime.bigint() - 2_000_000_000n;
    let expiredAfterMs: number | undefined;
    const before = timers();
    armDeadline(started, 2_100, () => (expiredAfterMs = Number((process.hrtime.bigint() - started) / 1_000_000n)));
    assert.equal(timers(), before, 'a timer was set before the event loop turned');
    await new Promise((resolve) => setImmediate(resolve));
    assert.equal(timers(), before + 1, 'no timer after the event loop turned');
    const waitUntil = Date.now() + 1_500;
    while (expiredAfterMs === undefined && Date.now() < waitUntil) await new Promise((resolve) => setTimeout(resolve, 10));
    assert.ok(expiredAfterMs !== undefined, 'the deadline did not expire within 1.5 s of its last 100 ms');
    // Node's timers count whole milliseconds from the event loop's clock, which it reads once per turn: a timer may
    // fire a millisecond or so before the process's own clock says its time is up (seen: 2,099 ms).
    assert.ok(expiredAfterMs >= 2_098, `expired ${expiredAfterMs} ms after the start, before its 2,100 ms`);
  });
});

describe('the op tables', () => {
  it("bin/latch-sea's control-plane bundle answers its ops as the whole table does, and no other op", () => {
    // src/sea/main.ts picks the bundle by CONTROL_PLANE_OPS; src/sea/control.ts's bundle has CONTROL_PLANE_OP_TABLE.
    assert.deepEqual(Object.keys(CONTROL_PLANE_OP_TABLE), [...CONTROL_PLANE_OPS]);
    for (const op of CONTROL_PLANE_OPS) assert.equal(OPS[op], CONTROL_PLANE_OP_TABLE[op], op);
    const nodeOps = Object.keys(OPS).filter((op) => !isControlPlaneOp(op));
    assert.deepEqual(nodeOps, ['waitforattach', 'mountdevice', 'unmountdevice', 'mount', 'unmount', 'expandfs', 'expandvolume']);
    assert.equal(isControlPlaneOp('unknownop'), false, 'an unknown op goes to the whole bundle, which answers Not supported');
  });
});

describe('replies', () => {
  it('encodes one line of JSON with only known fields', () => {
    const line = encodeReply({ ...success({ attached: false }), ...({ extra: 1 } as object) });
    assert.equal(line, '{"status":"Success","attached":false}\n');
  });
  it('maps statuses to exit codes', () => {
    assert.equal(exitCodeOf(success()), 0);
    assert.equal(exitCodeOf(notSupported()), 0);
    assert.equal(exitCodeOf(failure('x')), 1);
  });
  it('cuts very long messages', () => {
    assert.ok(encodeReply(failure('x'.repeat(100_000))).length < 5000);
  });
});

describe('configuration', () => {
  it('has the documented defaults', () => {
    assert.equal(config.driverName, 'latch/loop');
    assert.equal(config.attach, true);
    assert.equal(config.poolDir, '/var/lib/latch/pool');
    assert.equal(config.stateDir, '/var/lib/latch/state');
    assert.equal(config.logFile, '/var/log/latch/latch.log');
    assert.equal(config.defaultFsType, 'ext4');
    assert.deepEqual(config.store, { type: 'file' });
    assert.deepEqual(config.backend, { type: 'loop' });
    assert.match(config.nodeName, /^[a-z0-9.-]+$/);
  });
  it('fills in the rbd backend: one cephx identity per node, its keyring where Ceph keeps them', () => {
    const c = parseConfig({ nodeName: 'node-7', backend: { type: 'rbd' } }, 'test');
    assert.deepEqual(c.backend, {
      type: 'rbd',
      pool: 'latch',
      cephConf: '/etc/ceph/ceph.conf',
      clientId: 'latch-node-7',
      keyring: '/etc/ceph/ceph.client.latch-node-7.keyring',
      mountDir: '/var/lib/latch/rbd',
      client: 'auto',
    });
    const own = parseConfig({ backend: { type: 'rbd', pool: 'k8s', clientId: 'node-a', mountDir: '/run/latch/./rbd' } }, 'test');
    assert.deepEqual(own.backend.type === 'rbd' && [own.backend.pool, own.backend.keyring, own.backend.mountDir], [
      'k8s',
      '/etc/ceph/ceph.client.node-a.keyring',
      '/run/latch/rbd',
    ]);
  });
  const bad: Array<[unknown, RegExp]> = [
    [{ maxSize: 'abc' }, /field "maxSize"/],
    [{ attach: 'yes' }, /field "attach"/],
    [{ poolDir: 'relative' }, /field "poolDir": must be an absolute path/],
    [
      { logFile: '/usr/libexec/kubernetes/kubelet-plugins/volume/exec/latch~loop/log' },
      /field "logFile": must not be inside the kubelet plugin directory/,
    ],
    [{ sizeLimit: 1 }, /unknown field\(s\) "sizeLimit"/],
    [{ store: { type: 'redis' } }, /field "store/],
    [{ defaultSize: '2Ti', maxSize: '1Ti' }, /field "defaultSize"/],
    [{ waitForAttachTimeout: 900 }, /field "waitForAttachTimeout"/],
    [{ backend: { type: 'nbd' } }, /field "backend/],
    [{ backend: { type: 'rbd', clientId: 'client.node-a' } }, /field "backend.clientId": is the cephx id without the "client." prefix/],
    [{ backend: { type: 'rbd', keyring: 'ceph.keyring' } }, /field "backend.keyring": must be an absolute path/],
    [{ backend: { type: 'rbd', pool: 'a b' } }, /field "backend.pool"/],
    [{ backend: { type: 'rbd', key: 'AQB...' } }, /unknown field\(s\) "key"/],
    [{ backend: { type: 'rbd', client: 'nbd' } }, /field "backend.client"/],
    [{ backend: { type: 'loop', pool: 'latch' } }, /unknown field\(s\) "pool"/],
  ];
  for (const [raw, message] of bad) {
    it(`refuses ${JSON.stringify(raw)} naming the field and the file`, () => {
      assert.throws(
        () => parseConfig(raw, '/etc/latch/config.json'),
        (err: Error) => message.test(err.message) && err.message.includes('/etc/latch/config.json'),
      );
    });
  }
  it('reads $LATCH_CONFIG and names it when it is broken or missing', () => {
    const dir = mkdtempSync(join(tmpdir(), 'latch-config-'));
    try {
      const path = join(dir, 'config.json');
      writeFileSync(path, '{"nodeName":"node-x","defaultSize":"2Gi"}');
      const c = loadConfig({ LATCH_CONFIG: path });
      assert.equal(c.nodeName, 'node-x');
      assert.equal(c.defaultSize, 2 * 1024 ** 3);
      writeFileSync(path, '{nope');
      assert.throws(() => loadConfig({ LATCH_CONFIG: path }), new RegExp(`${path} is not valid JSON`));
      assert.throws(() => loadConfig({ LATCH_CONFIG: join(dir, 'missing.json') }), /missing.json \(from LATCH_CONFIG\) does not exist/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('logging', () => {
  it('redacts secrets and unparsable JSON from the logged arguments', () => {
    const [json, broken, path] = redactArgs([
      '{"kubernetes.io/secret/password":"aHVudGVyMg==","kubernetes.io/pvOrVolumeName":"a"}',
      '{"kubernetes.io/secret/password":"aHVudGVyMg=="',
      '/var/lib/kubelet/x',
    ]);
    assert.deepEqual(json, { 'kubernetes.io/secret/password': '<redacted>', 'kubernetes.io/pvOrVolumeName': 'a' });
    const [foreign] = redactArgs(['{"fooPassword":"hunter2","kubernetes.io/fsType":"ext4","size":"1Gi"}']);
    assert.deepEqual(foreign, { fooPassword: '<redacted>', 'kubernetes.io/fsType': 'ext4', size: '1Gi' });
    assert.doesNotMatch(String(broken), /aHVudGVyMg/);
    assert.equal(path, '/var/lib/kubelet/x');
  });

  it('appends JSON lines, rotates by size, and never throws', () => {
    const dir = mkdtempSync(join(tmpdir(), 'latch-log-'));
    try {
      const target = { logFile: join(dir, 'sub', 'latch.log'), logMaxBytes: 4096 };
      assert.equal(writeLog(target, { op: 'init' }, false), false, 'init must not create the log directory');
      for (let i = 0; i < 200; i++) assert.equal(writeLog(target, { op: 'attach', i }), true);
      const lines = readFileSync(target.logFile, 'utf8').trim().split('\n');
      assert.ok(lines.every((l) => JSON.parse(l).op === 'attach'));
      assert.ok(readFileSync(`${target.logFile}.1`, 'utf8').length > 0, 'rotated file exists');
      assert.equal(writeLog({ logFile: join(dir, 'sub', 'latch.log', 'x'), logMaxBytes: 4096 }, { op: 'x' }), false);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('sizes and names', () => {
  it('parses Kubernetes quantities', () => {
    assert.equal(parseSize('1Gi'), 1024 ** 3);
    assert.equal(parseSize('500M'), 500e6);
    assert.equal(parseSize('1.5Gi'), 1.5 * 1024 ** 3);
    assert.equal(parseSize('4096'), 4096);
    for (const bad of ['', 'abc', '-1', '1 Gi', '1GB', '0', '1e9', '99999Pi']) assert.throws(() => parseSize(bad), /size/);
    assert.equal(formatSize(1024 ** 3), '1Gi');
  });
  it('checks volume names', () => {
    for (const good of ['pv-1', 'pvc-0f1e2d3c-aaaa-bbbb-cccc-1234567890ab', 'a', 'a.b_c']) assert.equal(checkVolumeName(good), good);
    for (const bad of ['', 'a/b', '..', 'a..b', '-a', 'A', 'a b', 'x;rm', 'a'.repeat(251)]) assert.throws(() => checkVolumeName(bad));
    assert.equal(checkPvName('a'.repeat(253)), 'a'.repeat(253));
    assert.throws(() => checkPvName('a'.repeat(254)), /limit is 253/);
  });
});

describe('long Kubernetes names', () => {
  it('accepts a 253-character PV name with a shorter volume option, and says what to do without one', () => {
    const pv = 'p'.repeat(253);
    assert.equal(parseOptions(JSON.stringify({ 'kubernetes.io/pvOrVolumeName': pv, volume: 'short' }), config).name, 'short');
    assert.throws(() => parseOptions(JSON.stringify({ 'kubernetes.io/pvOrVolumeName': pv }), config), /set the "volume" option/);
  });
});

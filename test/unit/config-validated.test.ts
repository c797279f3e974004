// loadDriverConfig: a driver call reuses the configuration this build validated before, and only then.
import assert from 'node:assert/strict';
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, it } from 'node:test';
import { loadDriverConfig, parseConfig, unsafeConfigReason } from '../../src/config.js';
import { ConfigError } from '../../src/errors.js';

describe('the validated copy of a configuration', () => {
  let dir: string;
  let path: string;
  let copy: string;
  let env: NodeJS.ProcessEnv;
  const write = (doc: object) => writeFileSync(path, `${JSON.stringify(doc)}\n`);
  /** Rewrites the copy's configuration, as only the copy (not a validation) could return it. */
  const tamperWithCopy = (logFile: string) => {
    const remembered = JSON.parse(readFileSync(copy, 'utf8')) as { config: { logFile: string } };
    remembered.config.logFile = logFile;
    writeFileSync(copy, JSON.stringify(remembered), { mode: 0o600 });
  };

  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'latch-config-validated-'));
    path = join(dir, 'config.json');
    copy = join(dir, '.config.json.validated');
    env = { LATCH_CONFIG: path };
    write({ nodeName: 'node-a', logFile: '/var/log/latch/a.log' });
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it('is written by the call that validated, 0600, and taken by the next call of the same build', () => {
    assert.equal(loadDriverConfig(env, true, 'build-1').logFile, '/var/log/latch/a.log');
    assert.equal(statSync(copy).mode & 0o777, 0o600);
    tamperWithCopy('/from/the/copy.log');
    assert.equal(loadDriverConfig(env, true, 'build-1').logFile, '/from/the/copy.log');
  });

  it('is validated again when the text, the build or the host name differ', () => {
    loadDriverConfig(env, true, 'build-1');
    tamperWithCopy('/from/the/copy.log');
    // Another build (its schema or defaults may differ).
    assert.equal(loadDriverConfig(env, false, 'build-2').logFile, '/var/log/latch/a.log');
    // Another host: the node's name defaults to it.
    const remembered = JSON.parse(readFileSync(copy, 'utf8')) as { hostname: string };
    assert.equal(remembered.hostname, hostname());
    writeFileSync(copy, JSON.stringify({ ...remembered, hostname: `not-${hostname()}` }), { mode: 0o600 });
    assert.equal(loadDriverConfig(env, false, 'build-1').logFile, '/var/log/latch/a.log');
    // Another text, even one that means the same.
    loadDriverConfig(env, true, 'build-1');
    tamperWithCopy('/from/the/copy.log');
    writeFileSync(path, JSON.stringify({ logFile: '/var/log/latch/a.log', nodeName: 'node-a' }));
    assert.equal(loadDriverConfig(env, true, 'build-1').logFile, '/var/log/latch/a.log');
  });

  it('never hides an invalid configuration, and a copy others may write is not trusted', () => {
    loadDriverConfig(env, true, 'build-1');
    write({ nodeName: 'node-a', waitForAttachTimeout: 900 });
    assert.throws(
      () => loadDriverConfig(env, true, 'build-1'),
      (err: Error) => err instanceof ConfigError && /waitForAttachTimeout/.test(err.message),
    );
    write({ nodeName: 'node-a', logFile: '/var/log/latch/a.log' });
    loadDriverConfig(env, true, 'build-1');
    tamperWithCopy('/from/the/copy.log');
    chmodSync(copy, 0o622);
    assert.equal(loadDriverConfig(env, false, 'build-1').logFile, '/var/log/latch/a.log');
  });

  it('never vouches for safety: the rule is applied to the remembered configuration too, on every call', () => {
    write({ nodeName: 'node-a', attach: false });
    for (let i = 0; i < 2; i++) {
      assert.throws(
        () => loadDriverConfig(env, true, 'build-1'),
        (err: Error) => err instanceof ConfigError && /non-attach mode \("attach": false\) with the file store/.test(err.message),
      );
      assert.ok(existsSync(copy), 'the validation is remembered, the refusal is not skipped for it');
    }
    // A copy that says something safer than the file is not what counts either: here the copy is made unsafe.
    write({ nodeName: 'node-a', logFile: '/var/log/latch/a.log' });
    loadDriverConfig(env, true, 'build-1');
    const remembered = JSON.parse(readFileSync(copy, 'utf8')) as { config: Record<string, unknown> };
    remembered.config.backend = { type: 'rbd', pool: 'latch' };
    writeFileSync(copy, JSON.stringify(remembered), { mode: 0o600 });
    assert.throws(() => loadDriverConfig(env, true, 'build-1'), /the rbd backend .* the file store/);
  });

  it('is not written by init (remember false), nor when run from source (no build)', () => {
    loadDriverConfig(env, false, 'build-1');
    assert.equal(existsSync(copy), false);
    loadDriverConfig(env, true, undefined);
    assert.equal(existsSync(copy), false);
  });

  it('a garbled copy is validated again and replaced', () => {
    writeFileSync(copy, '{"build":"build-1","hostn', { mode: 0o600 });
    assert.equal(loadDriverConfig(env, true, 'build-1').logFile, '/var/log/latch/a.log');
    assert.equal((JSON.parse(readFileSync(copy, 'utf8')) as { build: string }).build, 'build-1');
  });
});

describe('unsafeConfigReason: the configurations that cannot keep volumes safe', () => {
  const reason = (raw: Record<string, unknown>) => unsafeConfigReason(parseConfig({ nodeName: 'node-a', ...raw }, 'c.json'));
  it('refuses non-attach mode and the rbd backend on the file store, and singleNode on another node', () => {
    assert.match(reason({ attach: false }) ?? '', /^invalid configuration in c\.json: non-attach mode .*"singleNode": "node-a"$/);
    assert.match(
      reason({ backend: { type: 'rbd' } }) ?? '',
      /^invalid configuration in c\.json: the rbd backend .*"singleNode": "node-a"$/,
    );
    assert.match(reason({ singleNode: 'node-b' }) ?? '', /it is for node node-b alone \("singleNode"\), but this is node node-a/);
    assert.match(reason({ attach: false, singleNode: 'node-b' }) ?? '', /for node node-b alone/);
  });
  it('accepts a shared store, a declared single node, simulated nodes of one host, and attach mode on the file store', () => {
    const etcd = { type: 'etcd', endpoints: ['https://etcd.example:2379'] };
    for (const raw of [
      {},
      { attach: false, store: etcd },
      { backend: { type: 'rbd' }, store: etcd },
      { attach: false, singleNode: 'node-a' },
      { backend: { type: 'rbd' }, singleNode: 'node-a' },
      { attach: false, oneHost: true },
    ]) {
      assert.equal(reason(raw), undefined, JSON.stringify(raw));
    }
  });
});

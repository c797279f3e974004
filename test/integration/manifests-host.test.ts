// install/ on the host: `latch install` into a read-only plugin dir (root: a read-only bind mount), and the
// installer image's entrypoint checked by sh -n. The manifests themselves are checked in test/unit/manifests.test.ts.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { describe, test } from 'node:test';
import type { CommandIO } from '../../src/cli/io.js';
import { installOrPrintManifests } from '../../src/cli/manifests.js';

const ROOT = resolve(__dirname, '../..');

/** A CommandIO that keeps what the command prints. */
function captureIO(env: NodeJS.ProcessEnv = {}): CommandIO & { printed: () => string } {
  let text = '';
  return {
    out: (t) => {
      text += t;
    },
    env,
    context: () => assert.fail('--print-manifests needs no context'),
    printed: () => text,
  };
}

describe('a read-only plugin dir', () => {
  const notRoot = process.getuid?.() !== 0 ? 'needs root for a read-only bind mount' : false;

  test('install says so and what to do, and leaves nothing behind', { skip: notRoot }, async () => {
    const dir = mkdtempSync(join(tmpdir(), 'latch-ro-'));
    const plugins = join(dir, 'exec');
    mkdirSync(join(plugins, 'latch~loop'), { recursive: true });
    execFileSync('mount', ['--bind', plugins, plugins]);
    try {
      execFileSync('mount', ['-o', 'remount,bind,ro', plugins]);
      const io = captureIO({ LATCH_CONFIG: join(dir, 'none.json') });
      await assert.rejects(installOrPrintManifests({ pluginDir: plugins, output: 'table' }, io), {
        name: 'LatchError',
        message: /^the plugin dir is on a read-only file system \(EROFS.*\): kubelet cannot use it either\. .*--preset flatcar/,
      });
      assert.deepEqual(readdirSync(join(plugins, 'latch~loop')), []);
    } finally {
      execFileSync('umount', [plugins]);
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

test('entrypoint.sh is valid POSIX sh', () => {
  execFileSync('sh', ['-n', join(ROOT, 'install/entrypoint.sh')]);
});

// The node-local volume lock is freed by the kernel when its holder (a child process) is killed with SIGKILL. Its
// other rules are in test/unit/node-services.test.ts.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { describe, it } from 'node:test';
import { resolve } from 'node:path';
import { withVolumeLock } from '../../src/node/lock.js';
import { LatchError } from '../../src/errors.js';

describe('the node-local volume lock', () => {
  const config = { stateDir: `/tmp/latch-lock-test-${process.pid}`, nodeName: 'node-a' };

  it('is freed by the kernel when its holder is killed with SIGKILL', async () => {
    const script = `
      const { withVolumeLock } = require(${JSON.stringify(resolve(__dirname, '../../src/node/lock.ts'))});
      setInterval(() => {}, 1000);
      withVolumeLock(${JSON.stringify(config)}, 'k', () => { process.stdout.write('held\\n'); return new Promise(() => {}); });
    `;
    const child = spawn(process.execPath, ['--import', 'tsx', '-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
    try {
      await new Promise<void>((resolve, reject) => {
        child.stdout.on('data', (d: Buffer) => d.toString().includes('held') && resolve());
        child.once('exit', () => reject(new Error('the lock holder exited early')));
      });
      await assert.rejects(
        withVolumeLock(config, 'k', async () => 1, 100),
        LatchError,
      );
      child.kill('SIGKILL');
      await new Promise((r) => child.once('exit', r));
      assert.equal(await withVolumeLock(config, 'k', async () => 'free', 2000), 'free');
    } finally {
      child.kill('SIGKILL');
    }
  });
});

// The rbd fencer fails closed (docs/ledger.md, "Fences"), run against fake `rbd` and `ceph` tools on PATH (child
// processes): it blocklists the recorded client and every other watcher and lock holder but the spared ones, and an
// address that does not parse or a failing listing fails the fence. The fence rules and flows are in
// test/unit/fence.test.ts.
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, afterEach, before, beforeEach, describe, it } from 'node:test';
import { RbdFencer } from '../../src/backend/rbd-fencer.js';
import { fakeToolsOnPath, type FakeTools } from '../fixtures/fake-tools.js';

// A fake `rbd` and `ceph` on PATH for the rbd fencer: `rbd status` and `rbd lock ls` answer from files (or fail when
// told to), `ceph osd blocklist add|ls` keep the blocklist in a file. Every call is recorded.
const FAKE_CEPH_TOOLS = `#!/usr/bin/env node
const fs = require('fs');
const path = require('path');
const state = process.env.FAKE_CEPH_STATE;
const argv = process.argv.slice(2);
const tool = path.basename(process.argv[1]);
fs.appendFileSync(path.join(state, 'calls'), JSON.stringify([tool, ...argv]) + '\\n');
const args = [];
for (let i = 0; i < argv.length; i++) {
  if (['--conf', '--id', '--keyring', '--format'].includes(argv[i])) i++;
  else args.push(argv[i]);
}
const read = (name, fallback) => { try { return fs.readFileSync(path.join(state, name), 'utf8'); } catch { return fallback; } };
const fail = (what) => { process.stderr.write(what + ': (110) Connection timed out\\n'); process.exit(110); };
if (tool === 'rbd' && args[0] === 'status') {
  if (fs.existsSync(path.join(state, 'status-fails'))) fail('rbd: error getting image status');
  process.stdout.write(JSON.stringify({ watchers: JSON.parse(read('watchers', '[]')).map((address) => ({ address })) }));
} else if (tool === 'rbd' && args[0] === 'lock' && args[1] === 'ls') {
  if (fs.existsSync(path.join(state, 'locks-fail'))) fail('rbd: listing locks failed');
  process.stdout.write(read('locks', '[]'));
} else if (tool === 'ceph' && args.join(' ').startsWith('osd blocklist add')) {
  fs.appendFileSync(path.join(state, 'blocklist'), args[3] + '\\n');
} else if (tool === 'ceph' && args.join(' ').startsWith('osd blocklist ls')) {
  const entries = read('blocklist', '').split('\\n').filter(Boolean).map((addr) => ({ addr, until: 'later' }));
  process.stdout.write(JSON.stringify(entries) + '[]');
} else {
  process.stderr.write('fake ' + tool + ': unexpected ' + argv.join(' ') + '\\n');
  process.exit(22);
}
`;

describe('the rbd fencer fails closed (fake rbd and ceph tools)', () => {
  let work: string;
  let state: string;
  let tools: FakeTools;
  const fencer = new RbdFencer({ pool: 'latch', identity: { cephConf: '/etc/ceph/ceph.conf', clientId: 'fencer', keyring: '/k' } });
  const blocklisted = () => (existsSync(join(state, 'blocklist')) ? readFileSync(join(state, 'blocklist'), 'utf8').trim().split('\n') : []);

  before(() => {
    tools = fakeToolsOnPath('latch-fencer-', { rbd: FAKE_CEPH_TOOLS, ceph: FAKE_CEPH_TOOLS });
    work = tools.work;
  });
  after(() => tools.restore());
  beforeEach(() => {
    state = join(work, 'state');
    rmSync(state, { recursive: true, force: true });
    mkdirSync(state);
    process.env.FAKE_CEPH_STATE = state;
  });
  afterEach(() => {
    delete process.env.FAKE_CEPH_STATE;
  });

  it('blocklists the recorded client, every watcher and lock holder but the spared ones, and checks the OSD map', async () => {
    writeFileSync(join(state, 'watchers'), JSON.stringify(['10.0.0.1:0/111', '10.0.0.2:0/222']));
    writeFileSync(join(state, 'locks'), JSON.stringify([{ id: 'auto 1', locker: 'client.9', address: '10.0.0.3:0/333' }]));
    const fenced = await fencer.fence('pv-1', ['10.0.0.4:0/444'], ['10.0.0.2:0/222']);
    assert.deepEqual(fenced, ['10.0.0.1:0/111', '10.0.0.3:0/333', '10.0.0.4:0/444']);
    assert.deepEqual(blocklisted(), fenced);
  });

  it('an address that does not parse fails the fence, naming it, and nothing is blocklisted', async () => {
    writeFileSync(join(state, 'watchers'), JSON.stringify(['10.0.0.1:0/111', 'v2:10.0.0.7:0/0']));
    await assert.rejects(
      fencer.fence('pv-1', [], []),
      /volume pv-1: cannot fence client address\(es\) "v2:10\.0\.0\.7:0\/0" of latch\/pv-1: not a single Ceph client instance/,
    );
    await assert.rejects(fencer.fence('pv-1', ['10.0.0.1:0'], []), /"10\.0\.0\.1:0"/, 'a recorded address is held to the same');
    // A watcher listed without an address is not dropped either.
    writeFileSync(join(state, 'watchers'), JSON.stringify(['10.0.0.1:0/111', null]));
    await assert.rejects(fencer.fence('pv-1', [], []), /cannot fence client address\(es\) "null"/);
    assert.deepEqual(blocklisted(), []);
  });

  it('a failing rbd status or lock listing fails the fence rather than counting as nobody', async () => {
    writeFileSync(join(state, 'status-fails'), '');
    await assert.rejects(fencer.find('pv-1', ['10.0.0.1:0/111'], []), /Connection timed out/);
    rmSync(join(state, 'status-fails'));
    writeFileSync(join(state, 'locks-fail'), '');
    await assert.rejects(fencer.fence('pv-1', ['10.0.0.1:0/111'], []), /Connection timed out/);
    assert.deepEqual(blocklisted(), []);
  });
});

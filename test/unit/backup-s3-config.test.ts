// An S3 backup target's bad input, without an S3 server: the configuration's checks (src/config-schema.ts), and the
// credentials files (src/backup/s3-store.ts), each refused with a message that names the setting and no secret. The
// endpoint is a closed port on loopback, so a target whose credentials are fine fails as unreachable instead.
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync, chmodSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { checkTarget } from '../../src/backup/store.js';
import type { S3Target } from '../../src/backup/layout.js';
import { validateConfig } from '../../src/config-schema.js';

const work = mkdtempSync(join(tmpdir(), 'latch-s3-config-'));
after(() => rmSync(work, { recursive: true, force: true }));
let counter = 0;
const fresh = () => mkdtempSync(join(work, `d-${counter++}-`));
const SECRET = 'wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY';

function target(overrides: Partial<S3Target>): S3Target {
  return { type: 's3', endpoint: 'http://127.0.0.1:9', bucket: 'backups', prefix: '', ...overrides };
}

describe('an S3 backup target: bad configuration and credentials', () => {
  it('the configuration refuses a bad endpoint, bucket, prefix, region and credentials setting, naming the field', () => {
    const base = { type: 's3', endpoint: 'https://s3.example.com', bucket: 'backups', credentialsFile: '/etc/latch/s3.json' };
    assert.deepEqual(validateConfig({ backupTarget: base }, 'test').backupTarget, { ...base, prefix: '' });
    const cases: [Record<string, unknown>, RegExp][] = [
      [{ endpoint: 'ftp://s3.example.com' }, /"backupTarget.endpoint": must be an http:\/\/ or https:\/\/ URL/],
      [{ endpoint: 'not a url' }, /"backupTarget.endpoint"/],
      [{ endpoint: 'https://AKIA:hunter2hunter2@s3.example.com' }, /"backupTarget.endpoint": must be a plain URL: no user, password/],
      [{ endpoint: 'https://s3.example.com/?X-Amz-Credential=x' }, /must be a plain URL/],
      [{ bucket: 'Backups' }, /"backupTarget.bucket": must be an S3 bucket name/],
      [{ bucket: 'ab' }, /"backupTarget.bucket"/],
      [{ prefix: '/abs/' }, /"backupTarget.prefix": must be empty or path segments each ending in "\/"/],
      [{ prefix: 'a' }, /"backupTarget.prefix"/],
      [{ prefix: 'a/../' }, /"backupTarget.prefix": must not have "." or ".." segments/],
      [{ region: 'US East' }, /"backupTarget.region": must be a region name/],
      [{ credentialsFile: undefined }, /needs exactly one of credentialsFile .* and credentialsDir/],
      [{ credentialsDir: '/etc/latch/s3' }, /needs exactly one of credentialsFile/],
      [{ credentialsFile: 's3.json' }, /"backupTarget.credentialsFile": must be an absolute path/],
      [{ secretAccessKey: SECRET }, /unknown field\(s\) "secretAccessKey"/],
      [{ encrypt: 'yes' }, /"backupTarget.encrypt"/],
    ];
    for (const [change, message] of cases) {
      const refusal = (() => {
        try {
          validateConfig({ backupTarget: { ...base, ...change } }, 'test');
        } catch (err) {
          return (err as Error).message;
        }
        return assert.fail(`accepted ${JSON.stringify(change)}`);
      })();
      assert.match(refusal, message, JSON.stringify(change));
      assert.ok(!refusal.includes(SECRET), 'the secret is not repeated');
    }
  });

  it('a credentials file that others can read, a link, not JSON or without keys is refused; the secret is in no message', async () => {
    const write = (text: string, mode = 0o600) => {
      const path = join(fresh(), 's3.json');
      writeFileSync(path, text, { mode });
      chmodSync(path, mode);
      return path;
    };
    const good = JSON.stringify({ accessKeyId: 'AKIAEXAMPLE', secretAccessKey: SECRET });
    const link = join(fresh(), 'link.json');
    symlinkSync(write(good), link);
    const cases: [string, RegExp][] = [
      [write(good, 0o644), /credentials file .* \(backupTarget.credentialsFile\) is readable or writable by others \(mode 644\)/],
      [link, /is a symbolic link/],
      [join(work, 'missing.json'), /does not exist/],
      [write(`{"accessKeyId": "AKIA", "secretAccessKey": "${SECRET}"`), /is not JSON/],
      [write(JSON.stringify({ accessKeyId: 'AKIA' })), /has no valid "secretAccessKey"/],
      [write(JSON.stringify({ accessKeyId: 'has space', secretAccessKey: SECRET })), /has no valid "accessKeyId"/],
    ];
    for (const [credentialsFile, message] of cases) {
      const refusal = await checkTarget(target({ credentialsFile })).then(
        () => assert.fail('accepted'),
        (err: Error) => err.message,
      );
      assert.match(refusal, message, credentialsFile);
      assert.ok(!refusal.includes(SECRET), 'the secret is not in the message');
    }
    // Good credentials: the closed port is what fails.
    await assert.rejects(
      checkTarget(target({ credentialsFile: write(good) })),
      /did not answer while checking the bucket \(ECONNREFUSED\)/,
    );
  });

  it('a Kubernetes secret volume: links into its own ..data are followed, a link out of it is refused, and so are loose modes', async () => {
    const volume = (secret: string, mode: number) => {
      const dir = fresh();
      const data = join(dir, '..2026_11_27');
      mkdirSync(data);
      writeFileSync(join(data, 'accessKeyId'), 'AKIAEXAMPLE', { mode });
      writeFileSync(join(data, 'secretAccessKey'), secret, { mode });
      chmodSync(join(data, 'secretAccessKey'), mode);
      symlinkSync('..2026_11_27', join(dir, '..data'));
      symlinkSync('..data/accessKeyId', join(dir, 'accessKeyId'));
      symlinkSync('..data/secretAccessKey', join(dir, 'secretAccessKey'));
      return dir;
    };
    await assert.rejects(checkTarget(target({ credentialsDir: volume(SECRET, 0o400) })), /did not answer .*ECONNREFUSED/);
    const loose = await checkTarget(target({ credentialsDir: volume(SECRET, 0o644) })).then(
      () => assert.fail('accepted'),
      (err: Error) => err.message,
    );
    assert.match(loose, /accessKeyId \(backupTarget.credentialsDir\) is readable or writable by others .* defaultMode 0400/);
    const outside = fresh();
    writeFileSync(join(outside, 'accessKeyId'), 'AKIAEXAMPLE', { mode: 0o600 });
    writeFileSync(join(outside, 'secretAccessKey'), SECRET, { mode: 0o600 });
    const dir = fresh();
    symlinkSync(join(outside, 'accessKeyId'), join(dir, 'accessKeyId'));
    symlinkSync(join(outside, 'secretAccessKey'), join(dir, 'secretAccessKey'));
    await assert.rejects(
      checkTarget(target({ credentialsDir: dir })),
      /accessKeyId \(backupTarget.credentialsDir\) is a link to outside its directory/,
    );
    await assert.rejects(checkTarget(target({ credentialsDir: join(work, 'none') })), /accessKeyId .* does not exist/);
  });
});

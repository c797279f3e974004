// The filesystem table (src/filesystems.ts) is the one source of which tools latch runs and which packages provide
// them: doctor's tool list is derived from it, and scripts/setup.sh (a test machine) and install/Dockerfile (the
// installer image, where doctor runs) must install every one of them.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { describe, test } from 'node:test';
import { requiredTools } from '../../src/doctor/tools.js';
import { FILESYSTEMS, FS_TYPES } from '../../src/filesystems.js';
import { defined } from '../fixtures/defined.js';

const ROOT = resolve(__dirname, '../..');
const SETUP = readFileSync(join(ROOT, 'scripts/setup.sh'), 'utf8');
const DOCKERFILE = readFileSync(join(ROOT, 'install/Dockerfile'), 'utf8');

/** Every tool latch may run, with its Debian package: the table's mkfs and grow tools and doctor's base tools. */
function toolsAndPackages(): Map<string, string> {
  const wanted = new Map<string, string>();
  for (const fs of FS_TYPES) {
    const { mkfs, grow, packages } = FILESYSTEMS[fs];
    wanted.set(mkfs[0], packages.deb);
    wanted.set(grow.tool, packages.deb);
  }
  for (const spec of requiredTools(FS_TYPES, 'ext4')) wanted.set(spec.tool, spec.deb);
  return wanted;
}

/** setup.sh's `declare -A PACKAGES=( [tool]=package ... )`. */
function setupPackages(text: string): Map<string, string> {
  const block = /declare -A PACKAGES=\(([^)]*)\)/.exec(text)?.[1];
  assert.ok(block, 'no PACKAGES table in scripts/setup.sh');
  const lines = block.split('\n').filter((l) => !l.trim().startsWith('#'));
  return new Map([...lines.join(' ').matchAll(/\[([^\]]+)\]=(\S+)/g)].map((m) => [defined(m[1]), defined(m[2])]));
}

/** The packages of the Dockerfile's last `apt-get install`, the final image's (continuation lines joined). */
function dockerPackages(text: string): Set<string> {
  const install = text
    .replace(/\\\n/g, ' ')
    .split('\n')
    .filter((l) => /apt-get install/.test(l) && !l.trim().startsWith('#'))
    .at(-1);
  assert.ok(install, 'no apt-get install in install/Dockerfile');
  const words = install
    .slice(install.indexOf('apt-get install') + 'apt-get install'.length)
    .split('&&')[0]!
    .trim()
    .split(/\s+/);
  return new Set(words.filter((w) => !w.startsWith('-')));
}

/** What setup.sh and the Dockerfile lack, in words; empty when both are complete. */
function missing(setup: string, dockerfile: string): string[] {
  const inSetup = setupPackages(setup);
  const inImage = dockerPackages(dockerfile);
  const problems: string[] = [];
  for (const [tool, pkg] of toolsAndPackages()) {
    if (inSetup.get(tool) !== pkg) problems.push(`setup.sh: [${tool}]=${pkg} (has ${inSetup.get(tool) ?? 'nothing'})`);
    if (!inImage.has(pkg)) problems.push(`Dockerfile: ${pkg} (for ${tool})`);
  }
  return problems;
}

describe('the filesystem table against what installs the tools', () => {
  test('every tool and package of the table and of doctor is in scripts/setup.sh and install/Dockerfile', () => {
    assert.deepEqual(missing(SETUP, DOCKERFILE), []);
  });

  test('the check catches a tool or a package left out', () => {
    assert.deepEqual(missing(SETUP.replace(' [btrfs]=btrfs-progs', ''), DOCKERFILE), ['setup.sh: [btrfs]=btrfs-progs (has nothing)']);
    assert.deepEqual(missing(SETUP, DOCKERFILE.replace(' xfsprogs ', ' ')), [
      'Dockerfile: xfsprogs (for mkfs.xfs)',
      'Dockerfile: xfsprogs (for xfs_growfs)',
    ]);
  });

  test("doctor's tool list is the table's: each allowed filesystem's mkfs tool, and each grow tool once", () => {
    const tools = requiredTools(['ext4', 'ext3', 'xfs'], 'xfs');
    const mkfs = tools.filter((t) => t.fsType !== undefined);
    assert.deepEqual(
      mkfs.map((t) => [t.tool, t.deb, t.rpm, t.severity]),
      [
        ['mkfs.ext4', 'e2fsprogs', 'e2fsprogs', 'warning'],
        ['mkfs.ext3', 'e2fsprogs', 'e2fsprogs', 'warning'],
        ['mkfs.xfs', 'xfsprogs', 'xfsprogs', 'error'],
      ],
    );
    assert.deepEqual(
      tools.filter((t) => /^grows /.test(t.why)).map((t) => t.tool),
      ['resize2fs', 'xfs_growfs'],
    );
  });
});

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { tempName, tempTag } from '../../src/hash.js';

test('temp tags are eight hex digits, and different from one call to the next', () => {
  const tags = Array.from({ length: 200 }, () => tempTag());
  for (const tag of tags) assert.match(tag, /^[0-9a-f]{8}$/);
  // 200 draws from 2^32: a repeat would mean the tag is not random.
  assert.equal(new Set(tags).size, tags.length);
  // Every digit position varies (a tag that is not padded or is cut short would fix some).
  for (let i = 0; i < 8; i++) assert.ok(new Set(tags.map((t) => t[i])).size > 4, `digit ${i} hardly varies`);
});

test("temp names have the shape the clean-ups of dead writers' temps match", () => {
  const name = tempName('vol-a.img');
  assert.match(name, new RegExp(`^\\.vol-a\\.img\\.${process.pid}\\.[0-9a-f]{8}\\.tmp$`));
  // The pattern the loop pool's clean-up reads a writer's pid with (src/backend/loop.ts).
  assert.equal(/^\..*\.(\d+)\.[0-9a-f]+\.tmp$/.exec(name)?.[1], String(process.pid));
  assert.notEqual(tempName('vol-a.img'), name);
});

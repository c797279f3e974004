import assert from 'node:assert/strict';
import { test } from 'node:test';
import { isoTime } from '../../src/time.js';

test('isoTime writes what toISOString writes, without the local time zone', () => {
  const instants = [
    0,
    Date.UTC(2026, 10, 23, 23, 59, 59, 999),
    Date.UTC(2026, 11, 31, 23, 59, 59, 7),
    Date.UTC(2027, 0, 1, 0, 0, 0, 0),
    Date.UTC(2028, 1, 29, 12, 5, 9, 40),
    Date.UTC(9999, 11, 31, 23, 59, 59, 999),
    Date.now(),
  ];
  for (const ms of instants) assert.equal(isoTime(new Date(ms)), new Date(ms).toISOString(), `at ${ms}`);
});

// The native helper's list of the ops that take a turn (TURN_OPS in src/native/turns.c) against the op table
// (src/protocol/ops.ts): the helper runs before Node starts and cannot read the table, so the two are kept in step
// here. Every op the driver answers either takes a turn or is named below with the reason it does not.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { describe, it } from 'node:test';
import { OPS } from '../../src/protocol/ops.js';

const TURNS_C = join(resolve(__dirname, '../..'), 'src/native/turns.c');

/** The ops that take no turn, each with why: they do none of a volume's work. */
const WITHOUT_TURN: Record<string, string> = {
  init: 'answers from the configuration',
  getvolumename: 'names the volume from its options',
  isattached: 'only reads the ledger',
  expandvolume: 'answers Not supported (docs/operations.md)',
};

/** The strings of `static const char *const TURN_OPS[] = {...}`, in order, without its closing NULL. */
function turnOps(source: string): string[] {
  const list = /static const char \*const TURN_OPS\[\] = \{([^}]*)\};/.exec(source);
  assert.ok(list?.[1], `${TURNS_C} has no TURN_OPS list`);
  const entries = list[1].split(',').map((e) => e.trim());
  assert.equal(entries.at(-1), 'NULL', 'TURN_OPS ends with NULL');
  return entries.slice(0, -1).map((e) => {
    const name = /^"([a-z]+)"$/.exec(e)?.[1];
    assert.ok(name, `TURN_OPS holds ${e}, not an op name`);
    return name;
  });
}

describe('the ops that take a turn', () => {
  const turnTaking = turnOps(readFileSync(TURNS_C, 'utf8'));

  it('are ops of the table, each listed once', () => {
    assert.deepEqual(
      turnTaking.filter((op) => !Object.hasOwn(OPS, op)),
      [],
      'TURN_OPS names ops the driver does not answer',
    );
    assert.equal(new Set(turnTaking).size, turnTaking.length, 'TURN_OPS names an op twice');
  });

  it('with the ops that take none, are every op of the table', () => {
    const decided = new Set([...turnTaking, ...Object.keys(WITHOUT_TURN)]);
    assert.deepEqual(
      Object.keys(OPS).filter((op) => !decided.has(op)),
      [],
      'an op that neither takes a turn (TURN_OPS in src/native/turns.c) nor is listed in WITHOUT_TURN here',
    );
    assert.deepEqual(
      turnTaking.filter((op) => Object.hasOwn(WITHOUT_TURN, op)),
      [],
      'an op both in TURN_OPS and in WITHOUT_TURN',
    );
    assert.deepEqual(
      Object.keys(WITHOUT_TURN).filter((op) => !Object.hasOwn(OPS, op)),
      [],
      'WITHOUT_TURN names ops the driver does not answer',
    );
  });
});

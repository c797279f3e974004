// What admin commands print: tables, JSON, and no control character from the ledger or a target reaching a terminal.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { formatJson, formatTable, printable } from '../../src/cli/output.js';

describe('printable', () => {
  it('shows escape sequences, carriage returns, DEL, C1 and bidirectional controls as escapes', () => {
    assert.equal(printable('ok\x1b]0;owned\x07 done'), 'ok\\u001b]0;owned\\u0007 done');
    assert.equal(printable('progress\rfaked'), 'progress\\u000dfaked');
    assert.equal(printable('a\x7fb\x9b2Jc'), 'a\\u007fb\\u009b2Jc');
    assert.equal(printable('file\u202egpj.exe'), 'file\\u202egpj.exe');
    assert.equal(printable('x\u2066y\u2069\u200f'), 'x\\u2066y\\u2069\\u200f');
  });

  it('keeps newlines, tabs and ordinary text of any script', () => {
    const text = 'NAME\tSIZE\nvol-é  1 GiB  日本語 ✓\n';
    assert.equal(printable(text), text);
  });

  it('keeps JSON output valid and decoding to the same strings', () => {
    const data = { message: 'bad\x1b[2J\x9b\u202e\r\x7fend', list: ['\u2067'] };
    for (const text of [formatJson(data), JSON.stringify(data)]) {
      const shown = printable(text);
      // eslint-disable-next-line no-control-regex -- what must not be left
      assert.doesNotMatch(shown, /[\x00-\x08\x0b-\x1f\x7f-\x9f\u202e\u2067]/);
      assert.deepEqual(JSON.parse(shown), data);
    }
  });

  it('leaves a table of hostile cells one line a row', () => {
    const table = printable(formatTable(['volume', 'message'], [['v', 'failed\rsucceeded\x1b[1A']]));
    assert.equal(table.split('\n').length, 3);
    assert.match(table, /failed\\u000dsucceeded\\u001b\[1A/);
  });
});

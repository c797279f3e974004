// npm run bench:report: renders test/bench/results/latest.json (from `npm run bench`) into docs/performance.md's
// generated block, with the date and the machine. bench runs it itself after each run.
import { join } from 'node:path';
import { writeReport } from './figures.js';

const ROOT = join(__dirname, '..', '..');
writeReport(join(ROOT, 'test/bench/results/latest.json'), join(ROOT, 'docs/performance.md'));
console.log('Regenerated the figures in docs/performance.md from test/bench/results/latest.json');

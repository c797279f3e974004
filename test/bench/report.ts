// npm run bench:report: renders test/bench/results/latest.json (from `npm run bench`) into the generated blocks of
// docs/performance.md and the README, with the date and the machine. bench runs it itself after each run.
import { join } from 'node:path';
import { writeReports } from './figures.js';

const ROOT = join(__dirname, '..', '..');
const files = writeReports(join(ROOT, 'test/bench/results/latest.json'), ROOT);
console.log(`Regenerated the figures in ${files.join(' and ')} from test/bench/results/latest.json`);

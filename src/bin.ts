// Entry point of bin/latch, the bundle run by node.
import { main } from './main.js';

main(process.argv);

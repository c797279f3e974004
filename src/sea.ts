// Entry point of bin/latch-sea, the single-executable build with a V8 startup snapshot: this script runs once, at
// build time, and the heap it leaves (modules evaluated, zod loaded, the config schema built) is what every call
// starts from. Nothing here may depend on the build host (paths found, environment): that is all read at run time.
import { startupSnapshot } from 'node:v8';
import { warmConfigSchema } from './config.js';
import { main } from './main.js';
import { OPS } from './protocol/ops.js';
import { warmOptionsSchema } from './contract/options.js';

warmConfigSchema();
warmOptionsSchema();
// Evaluate the op modules too; their imports of the stores stay lazy.
void Promise.all(Object.values(OPS).map((load) => load())).then(() => {
  startupSnapshot.setDeserializeMainFunction(() => main(process.argv));
});

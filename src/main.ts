// One executable, two audiences: kubelet and the controller call FlexVolume ops (one JSON reply, exit 0/1);
// people call the admin commands. The first argument decides which; the CLI is loaded only for people.
import { isAdminCall } from './cli/command-names.js';
import { runDriverCall } from './protocol/driver.js';
import { OPS } from './protocol/ops.js';

export function main(argv: string[]): void {
  const first = argv[2];
  if (first !== undefined && !isAdminCall(first)) {
    void runDriverCall(first, argv.slice(3), OPS);
    return;
  }
  void import('./cli/main.js').then(async (cli) => {
    process.exitCode = await cli.runCli(argv.slice(2));
  });
}

// One executable, two audiences: kubelet and the controller call FlexVolume ops (one JSON reply, exit 0/1);
// people call the admin commands. The first argument decides which.
import { runDriverCall } from './protocol/driver.js';

const ADMIN_COMMANDS = new Set(['volume', 'ticket', 'doctor', 'install', 'uninstall', 'demo', 'version', 'ledger', 'help']);

export function main(argv: string[]): void {
  const first = argv[2];
  if (first === undefined || first.startsWith('-') || ADMIN_COMMANDS.has(first)) {
    void import('./cli/main.js').then((cli) => cli.runCli(argv.slice(2)));
  } else {
    void runDriverCall(first, argv.slice(3));
  }
}

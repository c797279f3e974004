// The names of the admin commands, in a file that imports nothing: main.ts reads it on every call to tell an admin
// command from a FlexVolume op without loading the CLI. surface.ts declares exactly these, in this order (its
// declaration table is typed by this list, and test/unit/cli-surface.test.ts compares the two).
export const ADMIN_COMMANDS = [
  'version',
  'demo',
  'volume',
  'ticket',
  'ledger',
  'node',
  'snapshot',
  'backup',
  'install',
  'uninstall',
  'doctor',
  'agent',
  'metrics',
] as const;

export type AdminCommandName = (typeof ADMIN_COMMANDS)[number];

/** Whether argv's first word is for the CLI: an admin command, commander's `help`, or an option such as --help. */
export function isAdminCall(first: string): boolean {
  return first.startsWith('-') || first === 'help' || (ADMIN_COMMANDS as readonly string[]).includes(first);
}

// The admin CLI: commander, told never to exit or print by itself so that exit codes and output stay ours.
import { Command, CommanderError } from 'commander';
import { LatchError, errorMessage } from '../errors.js';
import { VERSION } from '../version.js';
import { registerDoctorCommands } from './doctor.js';
import { registerInstallCommands } from './install.js';
import { registerLedgerCommands } from './ledger.js';
import { registerTicketCommands } from './ticket.js';
import { registerVolumeCommands } from './volume.js';

export function buildProgram(): Command {
  const program = new Command('latch')
    .description(
      'latch: a FlexVolume driver with an attachment ledger.\n' +
        'kubelet and kube-controller-manager call it with a FlexVolume op (init, attach, mountdevice, ...);\n' +
        'people use the commands below.',
    )
    .version(VERSION, '-V, --version')
    .exitOverride()
    .configureOutput({
      writeOut: (text) => process.stdout.write(text),
      writeErr: (text) => process.stderr.write(text),
    });

  program
    .command('version')
    .description('print the latch version')
    .action(() => {
      process.stdout.write(`${VERSION}\n`);
    });

  program
    .command('demo')
    .description('as root: play a pod start, stop and move between two nodes on a throwaway pool, and clean up')
    .action(async () => {
      const { runDemo } = await import('./demo.js');
      process.exitCode = (await runDemo()) ? 0 : 1;
    });

  registerVolumeCommands(program);
  registerTicketCommands(program);
  registerLedgerCommands(program);
  registerInstallCommands(program);
  registerDoctorCommands(program);
  return program;
}

export async function runCli(argv: string[]): Promise<void> {
  const program = buildProgram();
  try {
    await program.parseAsync(argv, { from: 'user' });
  } catch (err) {
    if (err instanceof CommanderError) {
      // Help and version are "errors" to commander; their text has already been written.
      process.exitCode = err.exitCode;
      return;
    }
    process.stderr.write(`latch: ${err instanceof LatchError ? err.message : `internal error: ${errorMessage(err)}`}\n`);
    process.exitCode = 1;
  }
}

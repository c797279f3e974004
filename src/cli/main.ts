// The admin CLI's one try/catch: parses argv through the surface, runs the command, and turns what happened into
// an exit code. A user's mistake (a LatchError, a bad option) is said plainly; anything else is an internal error.
import { LatchError, errorMessage } from '../errors.js';
import { processIO, type CliIO } from './io.js';
import { buildProgram, commanderExitCode } from './surface.js';

/** Runs one admin command line (argv without node and the script); returns the exit code. */
export async function runCli(argv: string[], io: CliIO = processIO()): Promise<number> {
  let code = 0;
  const program = buildProgram(io, (c) => {
    code = c;
  });
  try {
    await program.parseAsync(argv, { from: 'user' });
    return code;
  } catch (err) {
    // Help, version and usage errors are "errors" to commander; their text has already been written.
    const commanderCode = commanderExitCode(err);
    if (commanderCode !== undefined) return commanderCode;
    io.err(`latch: ${err instanceof LatchError ? err.message : `internal error: ${errorMessage(err)}`}\n`);
    return 1;
  } finally {
    await io.close?.();
  }
}

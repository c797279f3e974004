// What an admin command works with besides its options: where it prints, the environment it reads its
// configuration from, and how it gets a context. A command is `(options, io) => Promise<exit code | void>` and
// throws a LatchError for a user's mistake; taking its I/O as an argument, it is tested by calling it.
import { loadConfig, type Config } from '../config.js';
import { createContext, type Context } from '../context.js';
import { printable } from './output.js';

export interface CommandIO {
  /** Where the command prints for people (stdout). */
  out(text: string): void;
  /** The environment: $LATCH_CONFIG, the plugin dir and tool path overrides. */
  readonly env: NodeJS.ProcessEnv;
  /** The context for a configuration. */
  context(config: Config): Context;
}

/** The configuration from the command's environment. */
export function configOf(io: CommandIO): Config {
  return loadConfig(io.env);
}

/** What the CLI's runner has besides: where usage and errors go (stderr), and what to close when it is done. */
export interface CliIO extends CommandIO {
  err(text: string): void;
  close?(): Promise<void>;
}

/**
 * The real process: stdout, stderr (both through `printable`: no control character from the ledger or a target
 * reaches the terminal), process.env, and contexts whose stores are closed once the command is done.
 */
export function processIO(): CliIO {
  const opened: Context[] = [];
  return {
    out: (text) => {
      process.stdout.write(printable(text));
    },
    err: (text) => {
      process.stderr.write(printable(text));
    },
    env: process.env,
    context: (config) => {
      const ctx = createContext(config);
      opened.push(ctx);
      return ctx;
    },
    close: async () => {
      await Promise.all(opened.map((ctx) => ctx.ledger.store.close().catch(() => undefined)));
    },
  };
}

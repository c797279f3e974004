// What an admin command works with besides its options: where it prints, the environment it reads its
// configuration from, and how it gets a context. Commands take it as an argument, so a test calls a command with
// its own sink, environment and in-memory store instead of running the executable.
import { loadConfig, type Config } from '../config.js';
import { createContext, type Context } from '../context.js';

export interface CommandIO {
  /** Where the command prints for people (stdout). */
  out(text: string): void;
  /** The environment: $LATCH_CONFIG, the plugin dir and tool path overrides. */
  readonly env: NodeJS.ProcessEnv;
  /** The context for a configuration. */
  context(config: Config): Context;
}

/** A command: typed options in, an exit code out (nothing means 0). A user's mistake is thrown as a LatchError. */
export type AdminCommand<Options> = (options: Options, io: CommandIO) => Promise<number | void>;

/** The configuration from the command's environment. */
export function configOf(io: CommandIO): Config {
  return loadConfig(io.env);
}

/** The real process: stdout, process.env, and contexts whose stores are closed once the command is done. */
export function processIO(): CommandIO & { err(text: string): void; close(): Promise<void> } {
  const opened: Context[] = [];
  return {
    out: (text) => {
      process.stdout.write(text);
    },
    err: (text) => {
      process.stderr.write(text);
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

// latch demo: plays the quick start's story (src/demo/) and prints it.
import type { DemoOptions } from '../demo/script.js';
import type { CommandIO } from './io.js';

/** Exit status 0 when every call answered as expected and nothing was left behind, else 1. */
export async function demo(options: DemoOptions, io: CommandIO): Promise<number> {
  const { runDemo } = await import('../demo/demo.js');
  return runDemo(options, (text) => io.out(text));
}

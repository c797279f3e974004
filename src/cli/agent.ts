// latch agent: runs this node's agent (agent/agent.ts) with the command's configuration, until it is stopped.
import { runAgent, type AgentOptions } from '../agent/agent.js';
import { configOf, type CommandIO } from './io.js';

export async function agent(options: AgentOptions, io: CommandIO): Promise<void> {
  return runAgent(configOf(io), options, (config) => io.context(config));
}

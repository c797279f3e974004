// How a command that asks an agent for a job (snapshot create, backup create) reports it: the request and the wait
// are the job protocol's (jobs/request.ts); this prints the outcome for people or as JSON.
import type { Context } from '../context.js';
import type { JobRequest } from '../ledger/arbitrate.js';
import { describeOutcome, requestAndWait } from '../jobs/request.js';
import type { CommandIO } from './io.js';
import { formatJson, type OutputFormat } from './output.js';

/**
 * What `snapshot create` and `backup create` do once they go through a ticket: ask, wait as told (default an hour),
 * print the outcome in words or as JSON. A failed job fails the command (after its JSON, when that was asked for).
 */
export async function requestAndReport(
  ctx: Context,
  io: CommandIO,
  volume: string,
  request: JobRequest,
  options: { wait?: boolean | undefined; timeout?: number | undefined; output: OutputFormat },
): Promise<void> {
  const result = await requestAndWait(ctx, volume, request, {
    wait: options.wait ?? true,
    timeoutMs: (options.timeout ?? 3600) * 1000,
  });
  if (options.output === 'json') {
    io.out(formatJson(result));
    describeOutcome(result);
    return;
  }
  io.out(`${describeOutcome(result)}\n`);
}

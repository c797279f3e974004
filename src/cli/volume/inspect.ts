// latch volume inspect: a volume's ledger document: tickets, holders, conditions.
import { shortTicketId } from '../../ledger/ids.js';
import { formatSize } from '../../size.js';
import { configOf, type CommandIO } from '../io.js';
import { formatJson, type OutputFormat } from '../output.js';
import { describeAccess } from './allow.js';
import { describeNodes, getVolume } from '../volume-doc.js';

export async function volumeInspect(options: { name: string; output: OutputFormat }, io: CommandIO): Promise<void> {
  const doc = await getVolume(io.context(configOf(io)).ledger, options.name);
  if (options.output === 'json') {
    io.out(formatJson(doc));
    return;
  }
  const by = doc.status.lastAttachedBy;
  const lines = [
    `Name:        ${doc.name}`,
    `Size:        ${formatSize(doc.spec.sizeBytes)}`,
    `Filesystem:  ${doc.status.filesystem ?? `none yet (${doc.spec.fsType} on first mount)`}`,
    `State:       ${doc.status.state}`,
    `Nodes:       ${describeNodes(doc) || '-'}`,
    `Created:     ${doc.createdAt}`,
    `Used by:     ${describeAccess(doc)}`,
    `Last attach: ${by ? `node ${by.node} for ${by.type} ticket ${shortTicketId(by.ticket)} at ${by.at}` : '-'}`,
    'Tickets:',
  ];
  for (const t of Object.values(doc.spec.tickets)) {
    const s = doc.status.tickets[t.id];
    lines.push(
      `  ${t.id}`,
      `    type ${t.type}, node ${t.nodeID}, ${t.parameters.readOnly ? 'read-only' : 'read-write'}, generation ${t.generation}`,
    );
    lines.push(`    ${s?.satisfied ? 'satisfied' : 'unsatisfied'} (${s?.reason ?? 'unknown'}): ${s?.message ?? ''}`);
    if (t.job)
      lines.push(
        `    job ${t.job.kind}: ${s?.job ? `${s.job.state} on ${s.job.node}, attempt ${s.job.attempts}: ${s.job.message}` : 'not started'}`,
      );
  }
  if (Object.keys(doc.spec.tickets).length === 0) lines.push('  (none)');
  const fences = Object.entries(doc.status.fences ?? {});
  if (fences.length > 0) lines.push('Fences:');
  for (const [node, f] of fences) {
    const clients = f.clients.length > 0 ? f.clients.join(', ') : 'no client';
    const where = f.clearedAt ? `cleared by the node ${f.clearedAt}; lift with: latch node unfence ${node}` : 'not cleared by the node yet';
    lines.push(`  ${node}: ${f.state} since ${f.since} (${f.reason}); refuses ${clients}; ${where}`);
  }
  io.out(`${lines.join('\n')}\n`);
}

// latch volume list: every volume with its state and holders.
import { formatSize } from '../../size.js';
import { configOf, type CommandIO } from '../io.js';
import { formatJson, formatTable, type OutputFormat } from '../output.js';
import { describeNodes } from './volume-doc.js';

export async function volumeList(options: { output: OutputFormat }, io: CommandIO): Promise<void> {
  const docs = await io.context(configOf(io)).ledger.list();
  if (options.output === 'json') {
    io.out(formatJson(docs));
    return;
  }
  io.out(
    formatTable(
      ['name', 'size', 'fs', 'state', 'nodes', 'tickets'],
      docs.map((d) => [
        d.name,
        formatSize(d.spec.sizeBytes),
        d.status.filesystem ?? `(${d.spec.fsType})`,
        d.status.state,
        describeNodes(d) || '-',
        String(Object.keys(d.spec.tickets).length),
      ]),
    ),
  );
}

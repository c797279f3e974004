// latch volume list: every volume with its state and holders (or only those a node holds or has tickets for).
import { checkNodeName } from '../../names.js';
import { formatSize } from '../../size.js';
import { configOf, type CommandIO } from '../io.js';
import { formatJson, formatTable, type OutputFormat } from '../output.js';
import { concernsNode, describeNodes } from './volume-doc.js';

export interface VolumeListOptions {
  /** Only the volumes this node holds (any phase) or has tickets for. */
  node?: string;
  output: OutputFormat;
}

export async function volumeList(options: VolumeListOptions, io: CommandIO): Promise<void> {
  const { node } = options;
  if (node !== undefined) checkNodeName(node);
  const all = await io.context(configOf(io)).ledger.list();
  const docs = node === undefined ? all : all.filter((d) => concernsNode(d, node));
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

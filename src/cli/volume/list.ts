// latch volume list: every volume with its state and holders (or only those a node holds or has tickets for).
import { checkNodeName } from '../../names.js';
import { formatSize } from '../../size.js';
import { configOf, type CommandIO } from '../io.js';
import { formatJson, formatTable, type OutputFormat } from '../output.js';
import type { VolumeDoc } from '../../ledger/types.js';
import { concernsNode, describeNodes } from '../volume-doc.js';

export interface VolumeListOptions {
  /** Only the volumes this node holds (any phase) or has tickets for. */
  node?: string;
  output: OutputFormat;
}

/**
 * Exit 1 when a volume's document cannot be read: it is listed by name with state "damaged" (in JSON, as
 * `{ name, damaged: reason }`), whatever --node says, since it cannot tell which nodes it names.
 */
export async function volumeList(options: VolumeListOptions, io: CommandIO): Promise<number> {
  const { node } = options;
  if (node !== undefined) checkNodeName(node);
  const { docs: all, damaged } = await io.context(configOf(io)).ledger.list();
  const docs = node === undefined ? all : all.filter((d) => concernsNode(d, node));
  const status = damaged.length > 0 ? 1 : 0;
  if (options.output === 'json') {
    io.out(formatJson([...docs, ...damaged.map((d) => ({ name: d.name, damaged: d.reason }))]));
    return status;
  }
  io.out(
    formatTable(
      ['name', 'pv', 'size', 'fs', 'state', 'nodes', 'tickets'],
      [
        ...docs.map((d) => [
          d.name,
          describeOwner(d),
          formatSize(d.spec.sizeBytes),
          d.status.filesystem ?? `(${d.spec.fsType})`,
          d.status.state,
          describeNodes(d) || '-',
          String(Object.keys(d.spec.tickets).length),
        ]),
        ...damaged.map((d) => [d.name, '?', '-', '-', 'damaged', '?', '?']),
      ],
    ),
  );
  for (const d of damaged) io.out(`volume ${d.name}: damaged: ${d.reason}\n`);
  return status;
}

/** The volume's PV (namespace/PV when created for a pod of a namespace), "+N" for its allow entries; "-" when none. */
function describeOwner(doc: VolumeDoc): string {
  const { pv, allowed } = doc.spec;
  const own = pv ? `${pv.namespace ? `${pv.namespace}/` : ''}${pv.name}` : '-';
  const more = (allowed?.pvs?.length ?? 0) + (allowed?.namespaces?.length ?? 0);
  return more > 0 ? `${own} +${more}` : own;
}

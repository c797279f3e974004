// latch volume create|list|inspect|delete|expand|release: the admin's view of volumes, through the same ledger and backend.
import type { Command } from 'commander';
import { loadConfig } from '../config.js';
import { FS_TYPES, type FsType } from '../filesystems.js';
import { LatchError } from '../errors.js';
import type { VolumeDoc } from '../ledger/types.js';
import { checkNodeName, checkVolumeName } from '../names.js';
import { createContext } from '../context.js';
import type { Ledger } from '../ledger/ledger.js';
import { formatSize, parseSize } from '../size.js';
import { parseFormat, printJson, printTable, type OutputFormat } from './output.js';

export function registerVolumeCommands(program: Command): void {
  const volume = program.command('volume').description('create, list, inspect, delete and release volumes');

  volume
    .command('create <name>')
    .description('create a volume: its ledger document and its image in the pool')
    .requiredOption('--size <size>', 'size, as bytes or a quantity such as 1Gi or 500M')
    .option('--fs-type <type>', `filesystem made on first mount (${FS_TYPES.join(', ')})`)
    .option('-o, --output <format>', 'table or json', parseFormat, 'table')
    .action(async (name: string, opts: { size: string; fsType?: string; output: OutputFormat }) => {
      const config = loadConfig();
      checkVolumeName(name);
      const size = parseSize(opts.size, '--size');
      if (size > config.maxSize) throw new LatchError(`--size ${opts.size} is above maxSize (${formatSize(config.maxSize)})`);
      const fsType = (opts.fsType ?? config.defaultFsType) as FsType;
      if (!config.allowedFsTypes.includes(fsType)) {
        throw new LatchError(`--fs-type ${opts.fsType} is not allowed; allowed: ${config.allowedFsTypes.join(', ')}`);
      }
      const ctx = createContext(config);
      const { doc, existed } = await ctx.ledger.createVolume(name, { sizeBytes: size, fsType });
      await ctx.backend.create(name, size);
      if (opts.output === 'json') printJson(doc);
      else
        process.stdout.write(`volume ${name} ${existed ? 'already exists' : 'created'} (${formatSize(size)}, ${fsType} on first mount)\n`);
    });

  volume
    .command('list')
    .description('list volumes with their state and holders')
    .option('-o, --output <format>', 'table or json', parseFormat, 'table')
    .action(async (opts: { output: OutputFormat }) => {
      const docs = await createContext(loadConfig()).ledger.list();
      if (opts.output === 'json') return printJson(docs);
      printTable(
        ['name', 'size', 'fs', 'state', 'nodes', 'tickets'],
        docs.map((d) => [
          d.name,
          formatSize(d.spec.sizeBytes),
          d.status.filesystem ?? `(${d.spec.fsType})`,
          d.status.state,
          describeNodes(d) || '-',
          String(Object.keys(d.spec.tickets).length),
        ]),
      );
    });

  volume
    .command('inspect <name>')
    .description("show a volume's ledger document: tickets, holders, conditions")
    .option('-o, --output <format>', 'table or json', parseFormat, 'table')
    .action(async (name: string, opts: { output: OutputFormat }) => {
      const config = loadConfig();
      const doc = await getVolume(createContext(config).ledger, name);
      if (opts.output === 'json') return printJson(doc);
      const lines = [
        `Name:        ${doc.name}`,
        `Size:        ${formatSize(doc.spec.sizeBytes)}`,
        `Filesystem:  ${doc.status.filesystem ?? `none yet (${doc.spec.fsType} on first mount)`}`,
        `State:       ${doc.status.state}`,
        `Nodes:       ${describeNodes(doc) || '-'}`,
        `Created:     ${doc.createdAt}`,
        'Tickets:',
      ];
      for (const t of Object.values(doc.spec.tickets)) {
        const s = doc.status.tickets[t.id];
        lines.push(
          `  ${t.id}`,
          `    type ${t.type}, node ${t.nodeID}, ${t.parameters.readOnly ? 'read-only' : 'read-write'}, generation ${t.generation}`,
        );
        lines.push(`    ${s?.satisfied ? 'satisfied' : 'unsatisfied'} (${s?.reason ?? 'unknown'}): ${s?.message ?? ''}`);
      }
      if (Object.keys(doc.spec.tickets).length === 0) lines.push('  (none)');
      process.stdout.write(`${lines.join('\n')}\n`);
    });

  volume
    .command('delete <name>')
    .description('delete a volume and its data; refused while it has tickets or a node holds it')
    .action(async (name: string) => {
      const config = loadConfig();
      const { ledger, backend } = createContext(config);
      const doc = await getVolume(ledger, name);
      refuseIfInUse(doc);
      // The image goes first: a half-done delete then leaves a document without data (which latch refuses to
      // reuse if it ever held a filesystem), never an old image that a new volume of the same name would adopt.
      await backend.delete(name);
      await ledger.deleteVolume(name, refuseIfInUse);
      process.stdout.write(`volume ${name} deleted\n`);
    });

  volume
    .command('expand <name>')
    .description(
      'grow a volume: its image always; its filesystem too (online) when run on the node that has it mounted. ' +
        "Refuses to shrink or to pass maxSize or the pool's free space; repeating it is harmless",
    )
    .requiredOption('--size <size>', 'the new size, as bytes or a quantity such as 2Gi')
    .action(async (name: string, opts: { size: string }) => {
      const config = loadConfig();
      checkVolumeName(name);
      const size = parseSize(opts.size, '--size');
      const { expandVolume } = await import('../node/resize.js');
      process.stdout.write(`${await expandVolume(createContext(config), name, size)}\n`);
    });

  volume
    .command('release <name>')
    .description('the admin fence: declare a node down so the volume can attach elsewhere')
    .requiredOption('--node <node>', 'the node that is down')
    .option('--node-is-down', 'confirm the node is really down (powered off, or fenced): its device may still be set up')
    .action(async (name: string, opts: { node: string; nodeIsDown?: boolean }) => {
      checkNodeName(opts.node);
      if (!opts.nodeIsDown) {
        throw new LatchError(
          `releasing volume ${name} from node ${opts.node} lets another node mount it while ${opts.node} may still write to it; ` +
            'make sure the node is down, then repeat with --node-is-down',
        );
      }
      const config = loadConfig();
      const { ledger } = createContext(config);
      await getVolume(ledger, name);
      const doc = await ledger.releaseDeadNode(name, opts.node);
      process.stdout.write(`volume ${name} released from node ${opts.node}; state now ${doc?.status.state}\n`);
    });
}

export async function getVolume(ledger: Ledger, name: string): Promise<VolumeDoc> {
  checkVolumeName(name);
  const doc = await ledger.get(name);
  if (!doc) throw new LatchError(`volume ${name} does not exist (latch volume list shows the volumes)`);
  return doc;
}

function refuseIfInUse(doc: VolumeDoc): void {
  const tickets = Object.keys(doc.spec.tickets).length;
  const nodes = Object.keys(doc.status.nodes);
  if (tickets > 0 || nodes.length > 0) {
    throw new LatchError(
      `volume ${doc.name} is in use: ${tickets} ticket(s)` +
        (nodes.length > 0 ? `, held by ${nodes.join(', ')}` : '') +
        '; detach it first (latch ticket list shows who asked for it)',
    );
  }
}

function describeNodes(doc: VolumeDoc): string {
  return Object.entries(doc.status.nodes)
    .map(([n, e]) => `${n}(${e.phase}${e.readOnly ? ',ro' : ''})`)
    .join(' ');
}

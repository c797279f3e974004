// Every admin command and option, in one place, and the only file that knows commander. commander parses argv and
// calls the command's function with typed options; it is told never to exit or print by itself, so that exit codes
// and output stay ours (a FlexVolume driver must not let a library write to stdout).
import { Command, CommanderError, InvalidArgumentError, Option } from '@commander-js/extra-typings';
import { DEFAULT_DRIVER_NAME } from '../names.js';
import { LatchError } from '../errors.js';
import { FS_TYPES } from '../filesystems.js';
import { DEFAULT_PLUGIN_DIR, OPENSHIFT_PLUGIN_DIR } from '../host/plugin-dir.js';
import { PRESET_NAMES, PRESETS, presetNamed } from '../host/presets.js';
import { VERSION } from '../version.js';
import { agent } from './agent.js';
import { ADMIN_COMMANDS, type AdminCommandName } from './command-names.js';
import { demo } from './demo.js';
import { doctor, parseSeconds } from './doctor.js';
import { DEFAULT_STUCK_AFTER_SECONDS } from '../doctor/detaching.js';
import { DEFAULT_IMAGE, installOrPrintManifests } from './manifests.js';
import type { CliIO, CommandIO } from './io.js';
import { ledgerMigrate, parseStoreName } from './ledger/migrate.js';
import { metrics } from './metrics.js';
import { nodeCheck } from './node/check.js';
import { nodeClearFences, nodeFence, nodeUnfence } from './node/fence.js';
import { parseFormat } from './output.js';
import { ADDABLE_TICKET_TYPES, parseOwner, parseTicketType, parseTtl, ticketAdd } from './ticket/add.js';
import { ticketList } from './ticket/list.js';
import { ticketRemove } from './ticket/remove.js';
import { uninstall } from './uninstall.js';
import { version } from './version.js';
import { backupAuthenticate } from './backup/authenticate.js';
import { backupCreate, type BackupCreateOptions } from './backup/create.js';
import { backupDelete } from './backup/delete.js';
import { backupList } from './backup/list.js';
import { backupVerify } from './backup/verify.js';
import { snapshotCreate } from './snapshot/create.js';
import { snapshotDelete } from './snapshot/delete.js';
import { snapshotList } from './snapshot/list.js';
import { volumeAllow } from './volume/allow.js';
import { volumeAttach, volumeDetach } from './volume/attach.js';
import { volumeClone } from './volume/clone.js';
import { volumeCreate } from './volume/create.js';
import { volumeDelete } from './volume/delete.js';
import { volumeExpand } from './volume/expand.js';
import { volumeInspect } from './volume/inspect.js';
import { volumeList } from './volume/list.js';
import { volumeRelease } from './volume/release.js';
import { volumeRestore } from './volume/restore.js';
import { volumeUnlink } from './volume/unlink.js';

/** The exit code commander chose for help, --version or a usage error (its text is already written); else undefined. */
export function commanderExitCode(err: unknown): number | undefined {
  return err instanceof CommanderError ? err.exitCode : undefined;
}

/** The program; `exit` receives the exit code a command returned. */
export function buildProgram(io: CliIO, exit: (code: number) => void): Command {
  const program = new Command('latch')
    .description(
      'latch: a FlexVolume driver with an attachment ledger.\n' +
        'kubelet and kube-controller-manager call it with a FlexVolume op (init, attach, mountdevice, ...);\n' +
        'people use the commands below.',
    )
    .version(VERSION, '-V, --version')
    .exitOverride()
    .configureOutput({ writeOut: (text) => io.out(text), writeErr: (text) => io.err(text) });
  const done = (code: number | void) => exit(code ?? 0);

  // Typed by the list main.ts reads: a command missing here, or one not in the list, does not compile.
  const declare: Record<AdminCommandName, (command: Command) => void> = {
    version: (c) => c.description('print the latch version').action(async () => done(await version({}, io))),

    demo: (c) =>
      c
        .description('as root: play a pod start, stop and move between two nodes on a throwaway pool, and clean up')
        .option(
          '--backend <backend>',
          'loop (a throwaway pool directory) or rbd (a Ceph cluster: the move and the fence)',
          valueOf(parseDemoBackend),
          'loop',
        )
        .option('--ceph-conf <file>', 'rbd: the cluster conf', '/etc/ceph/ceph.conf')
        .option(
          '--ceph-keyring <file>',
          'rbd: a keyring of client.admin, to make and remove the demo identities',
          '/etc/ceph/ceph.client.admin.keyring',
        )
        .option('--pool <pool>', 'rbd: an existing pool initialised for rbd', 'latch')
        .action(async (opts) => done(await demo(opts, io))),

    volume: (c) =>
      declareVolume(
        c.description('create, list, inspect, delete, allow, unlink, release, restore, clone, attach and detach volumes'),
        io,
        done,
      ),

    ticket: (c) => declareTicket(c.description('list, add and remove attachment tickets'), io, done),

    ledger: (c) => declareLedger(c.description('move the ledger between stores'), io, done),

    node: (c) => declareNode(c.description('what the ledger holds on a node: may it be drained or deleted now?'), io, done),

    snapshot: (c) => declareSnapshot(c.description("create, list and delete a volume's snapshots, on the node the volume is on"), io, done),

    backup: (c) =>
      declareBackup(c.description('create, list, verify and delete backups in the backup target (config: backupTarget)'), io, done),

    install: (c) =>
      c
        .description('install this executable as the FlexVolume driver <plugin dir>/<vendor~driver>/<driver>, atomically')
        .addHelpText(
          'after',
          [
            '',
            'The plugin dir: --plugin-dir or --preset, else $LATCH_VOLUME_PLUGIN_DIR, else what kubelet on this host uses:',
            '  1. its --volume-plugin-dir flag (from the command line of the running kubelet, or k3s --kubelet-arg)',
            '  2. volumePluginDir in its --config-dir drop-ins (*.conf), else in its --config file',
            `  3. ${OPENSHIFT_PLUGIN_DIR}, if it exists (OpenShift 4)`,
            `  4. ${DEFAULT_PLUGIN_DIR} (kubelet's default)`,
            'Installing the same build again changes nothing, so kubelet does not re-probe.',
            '',
            'With --print-manifests it installs nothing and prints the cluster install for kubectl apply -f -, as',
            "YAML (-o json: one List). Without a preset the DaemonSet detects each node's plugin dir; a preset pins it:",
            ...PRESETS.map((p) => `  ${p.name.padEnd(10)} ${p.title}: ${p.pluginDir}`),
          ].join('\n'),
        )
        .option('--plugin-dir <dir>', "kubelet's FlexVolume plugin directory (default: detected)")
        .option('--preset <name>', `a distribution's plugin dir: ${PRESET_NAMES.join(', ')}`, valueOf(presetNamed))
        .option(...DRIVER)
        .option('--host-root <dir>', "the host's / is mounted here (the DaemonSet's pod): detect and install the host's plugin dir")
        .option('--print-manifests', 'print the Kubernetes manifests of the cluster install instead of installing')
        .option('--image <ref>', `with --print-manifests: the image of every pod, latch's etcd's too (default ${DEFAULT_IMAGE})`)
        .option(
          '--cluster-config <file>',
          "with --print-manifests: the config.json every node gets, without nodeName (default: latch's own etcd as the shared ledger)",
        )
        .option('--single-node <node>', 'with --print-manifests: a one-node installation on this node (its file store as the ledger)')
        .option('--etcd-nodes <a,b,c>', "with --print-manifests: the three nodes latch's own etcd members are pinned to")
        .addOption(new Option('--make-etcd-certs', "the cluster install's Job: make latch's etcd's certificates (in a pod)").hideHelp())
        .option(
          '--config-beside-driver',
          "also write the configuration and the etcd client's files beside the driver (0600), for a kube-controller-manager in a container",
        )
        .option('--plugin-dir-seen-as <dir>', 'the plugin dir as kubelet and kube-controller-manager see it, if not --plugin-dir')
        .option(...OUTPUT)
        .action(async (opts) => done(await installOrPrintManifests(opts, io))),

    uninstall: (c) =>
      c
        .description("remove the driver from kubelet's plugin dir; refused while this node holds volumes, unless --force")
        .option('--plugin-dir <dir>', "kubelet's FlexVolume plugin directory (default: detected)")
        .option(...DRIVER)
        .option('--force', 'remove it even though this node still holds volumes (kubelet can then no longer unmount them)')
        .action(async (opts) => done(await uninstall(opts, io))),

    doctor: (c) =>
      c
        .description('check this node and say, for each finding, which command fixes it')
        .addHelpText(
          'after',
          [
            '',
            'Checks: the tools latch runs, loop device support, the configuration, the plugin dir and the installed',
            'driver, the pool space against the provisioned sizes, and the ledger against the kernel (holds without a',
            'device, loop devices and mounts the ledger does not know, volumes stuck detaching). On a control-plane',
            'node in attach mode: whether kube-controller-manager finds the driver in its plugin dir, the configuration',
            'it reads, and a trial init in an empty root, as its distroless container runs it.',
            'Exit status: 0 healthy, 1 with errors (something is broken now), 2 with warnings only.',
          ].join('\n'),
        )
        .option('--plugin-dir <dir>', "kubelet's FlexVolume plugin directory (default: detected, as for install)")
        .option(
          '--stuck-after <seconds>',
          'report a volume detaching for longer than this',
          valueOf(parseSeconds),
          DEFAULT_STUCK_AFTER_SECONDS,
        )
        .option(...OUTPUT)
        .action(async (opts) => done(await doctor(opts, io))),

    agent: (c) =>
      c
        .description(
          "run on every node: reap expired and abandoned tickets, release this node's holds its kernel proves stale, " +
            'and serve /metrics on agent.listen (default 127.0.0.1:9742)',
        )
        .option('--once', 'run the periodic tasks once and exit, without serving /metrics')
        .action(async (opts) => done(await agent(opts, io))),

    metrics: (c) =>
      c
        .description("print the agent's metrics once, in Prometheus's text format (for node-exporter's textfile collector)")
        .action(async () => done(await metrics({}, io))),
  };
  for (const name of ADMIN_COMMANDS) declare[name](program.command(name));
  return program;
}

type Done = (code: number | void) => void;

function declareVolume(volume: Command, io: CommandIO, done: Done): void {
  volume
    .command('create <name>')
    .description('create a volume: its ledger document and its image in the pool')
    .requiredOption('--size <size>', 'size, as bytes or a quantity such as 1Gi or 500M')
    .option('--fs-type <type>', `filesystem made on first mount (${FS_TYPES.join(', ')})`)
    .option('--shared', 'a shared (ReadWriteMany) volume: a CephFS subvolume every node may mount at once (backend.cephfs)')
    .option(...OUTPUT)
    .action(async (name: string, opts) => done(await volumeCreate({ name, ...opts }, io)));

  volume
    .command('list')
    .description('list volumes with their state and holders')
    .option('--node <node>', 'only the volumes this node holds (any phase) or has tickets for')
    .option(...OUTPUT)
    .action(async (opts) => done(await volumeList(opts, io)));

  volume
    .command('inspect <name>')
    .description("show a volume's ledger document: tickets, holders, conditions")
    .option(...OUTPUT)
    .action(async (name: string, opts) => done(await volumeInspect({ name, ...opts }, io)));

  volume
    .command('delete <name>')
    .description('delete a volume and its data; refused while it has tickets or a node holds it')
    .action(async (name: string) => done(await volumeDelete({ name }, io)));

  volume
    .command('allow <name>')
    .description(
      'let more than the PV a volume was created for use it: other PV names, or any PV from pods of a namespace ' +
        '(shown by latch volume inspect; docs/operations.md, "Tenancy")',
    )
    .option('--pv <name...>', 'a PV name (or inline volume name) that may use the volume; repeatable')
    .option('--namespace <namespace...>', 'a namespace whose pods may use the volume through any PV; repeatable')
    .option('--remove', 'take these entries off the lists instead')
    .action(async (name: string, opts) => done(await volumeAllow({ name, ...opts }, io)));

  volume
    .command('unlink <pv>')
    .description(
      "remove a PV name's alias (latch never redirects one), so that the PV may name another volume; refused while " +
        'a ticket was asked for through it',
    )
    .action(async (pv: string) => done(await volumeUnlink({ pv }, io)));

  volume
    .command('expand <name>')
    .description(
      'grow a volume: its image always; its filesystem too (online) when run on the node that has it mounted. ' +
        "Refuses to shrink or to pass maxSize or the pool's free space; repeating it is harmless",
    )
    .requiredOption('--size <size>', 'the new size, as bytes or a quantity such as 2Gi')
    .action(async (name: string, opts) => done(await volumeExpand({ name, ...opts }, io)));

  volume
    .command('release <name>')
    .description('the admin fence: declare a node down so the volume can attach elsewhere (rbd: fences the node first)')
    .requiredOption('--node <node>', 'the node that is down')
    .option('--node-is-down', 'confirm the node is really down (powered off, or fenced): its device may still be set up')
    .option(
      '--powered-off',
      'with --node-is-down, on shared storage (rbd): the node is powered off, not merely unreachable; its hold goes even ' +
        'where the storage finds no client of it to fence',
    )
    .action(async (name: string, opts) => done(await volumeRelease({ name, ...opts }, io)));
  // Jobs the node agent does (docs/jobs.md): restore, clone, and a person's attach.
  volume
    .command('restore <new>')
    .description(
      'make a new volume from a backup: the node agent fills it (restore ticket, priority 2000: no workload gets the ' +
        'volume until it is done); a failed restore keeps its ticket, so the half-made volume is never used',
    )
    .requiredOption('--from-backup <backup>', 'the backup in the backup target (latch backup list)')
    .option('--node <node>', 'the node whose agent restores it (default: this node)')
    .option('--fs-type <type>', `the filesystem recorded for the volume (default: the backup's, else defaultFsType)`)
    .option(...NO_WAIT)
    .option(...JOB_TIMEOUT)
    .action(async (name: string, opts) => done(await volumeRestore({ name, ...opts }, io)));

  volume
    .command('clone <source> <new>')
    .description(
      "make a new volume with a copy of another's bytes (consistent: its filesystem frozen while a snapshot is cut if " +
        'it is mounted), or of one of its snapshots; clone tickets on both volumes, on the node that holds the source',
    )
    .option('--from-snapshot <snapshot>', 'copy this snapshot of the source instead of its current state')
    .option('--node <node>', 'the node whose agent copies it when the source is not in use (default: this node)')
    .option(...NO_WAIT)
    .option(...JOB_TIMEOUT)
    .action(async (source: string, name: string, opts) => done(await volumeClone({ source, name, ...opts }, io)));

  volume
    .command('attach <name>')
    .description(
      "set a volume's device up on a node for a person (manual ticket, priority 1000), and mount it for inspection " +
        'or fsck if asked (an existing filesystem only: never formats); it stays until latch volume detach',
    )
    .requiredOption('--node <node>', 'the node to set it up on')
    .option('--mount', "mount it at that node's <manualAttach.mountRoot>/VOLUME (nosuid, nodev; noexec unless manualAttach.exec)")
    .option('--read-only', 'read-only: the device is shared with other readers and mounted read-only')
    .action(async (name: string, opts) => done(await volumeAttach({ name, ...opts }, io)));

  volume
    .command('detach <name>')
    .description("end a volume's manual attach: its agent unmounts it, releases the device and removes the ticket")
    .option('--node <node>', 'the node it is attached on (checked)')
    .action(async (name: string, opts) => done(await volumeDetach({ name, ...opts }, io)));
}

function declareTicket(ticket: Command, io: CommandIO, done: Done): void {
  ticket
    .command('list [volume]')
    .description('list tickets (of one volume, or of all)')
    .option('--node <node>', "only this node's tickets")
    .option(...OUTPUT)
    .action(async (volume: string | undefined, opts) => done(await ticketList({ ...(volume !== undefined && { volume }), ...opts }, io)));

  ticket
    .command('add <volume>')
    .description('add a ticket asking for the volume on a node')
    .requiredOption('--node <node>', 'the node that should have the volume')
    .option('--type <type>', `ticket type (${ADDABLE_TICKET_TYPES.join(', ')})`, valueOf(parseTicketType), 'admin')
    .option('--read-only', 'ask for read-only access')
    .option('--owner <who>', 'who asks (required for admin and maintenance tickets); shown in ticket list', valueOf(parseOwner))
    .option('--ttl <duration>', 'remove the ticket by itself after this long (90s, 30m, 2h, 1d)', valueOf(parseTtl))
    .action(async (volume: string, opts) => done(await ticketAdd({ volume, ...opts }, io)));

  ticket
    .command('remove <volume> <ticket>')
    .description('remove a ticket (by ID or a unique prefix of it); unknown tickets are fine')
    .option('--force', 'remove a workload ticket even though its node still holds the device')
    .action(async (volume: string, id: string, opts) => done(await ticketRemove({ volume, ticket: id, ...opts }, io)));
}

function declareLedger(ledger: Command, io: CommandIO, done: Done): void {
  ledger
    .command('migrate')
    .description(
      'copy every volume document and PV alias from one store to the other; idempotent; refuses to replace a ' +
        'destination document that differs unless --overwrite; never changes the source. Exit 1 if any was refused.',
    )
    .requiredOption('--from <store>', 'file or etcd', valueOf(parseStoreName('--from')))
    .requiredOption('--to <store>', 'etcd or file', valueOf(parseStoreName('--to')))
    .option('--state-dir <dir>', "the file store's directory (default: stateDir from the configuration)")
    .option('--etcd-endpoints <urls>', 'comma-separated etcd client URLs (default: store.endpoints from the configuration)')
    .option('--etcd-prefix <prefix>', 'key prefix in etcd (default: store.prefix from the configuration, else /latch/)')
    .option('--etcd-ca <file>', 'PEM CA that signed the etcd members (default: store.tls.ca)')
    .option('--etcd-cert <file>', 'PEM client certificate (default: store.tls.cert)')
    .option('--etcd-key <file>', 'PEM client key (default: store.tls.key)')
    .option('--etcd-timeout-ms <ms>', 'deadline of each etcd request (default: store.timeoutMs, else 5000)')
    .option('--overwrite', 'replace destination documents whose content differs')
    .option('--dry-run', 'report what would be done, write nothing')
    .option(...OUTPUT)
    .action(async (opts) => done(await ledgerMigrate(opts, io)));
}

function declareNode(node: Command, io: CommandIO, done: Done): void {
  node
    .command('check <node>')
    .description(
      'may this node be drained or deleted now? Yes when no volume has a ticket for it and no volume lists it as ' +
        'a holder (any phase); otherwise, per volume, its tickets and phase and what clears each. ' +
        'Exit 0 when it may go, 1 when not.',
    )
    .option(...OUTPUT)
    .action(async (name: string, opts) => done(await nodeCheck({ node: name, ...opts }, io)));

  node
    .command('fence <node>')
    .description(
      "take volumes away from a node that may still write to them: the storage refuses the node's clients first " +
        '(rbd: the Ceph blocklist, as the fencer identity), then its holds and tickets go. Exit 1 if any volume failed',
    )
    .option('--volume <volume>', 'only this volume (default: every volume that names the node)')
    .action(async (name: string, opts) => done(await nodeFence({ node: name, ...opts }, io)));

  node
    .command('clear-fences')
    .description('on a node that was fenced: release its old mappings (kernel state) and tell the ledger, so it may have the volumes again')
    .action(async () => done(await nodeClearFences({}, io)));

  node
    .command('unfence <node>')
    .description('lift the fences of a node that has cleared its old mappings: the storage stops refusing its old clients')
    .option('--volume <volume>', 'only this volume')
    .action(async (name: string, opts) => done(await nodeUnfence({ node: name, ...opts }, io)));
}

function declareSnapshot(snapshot: Command, io: CommandIO, done: Done): void {
  const where =
    'A volume in use on this node is snapshotted here at once (frozen with fsfreeze while the copy is cut when mounted); ' +
    'one in use on another node, or idle, through a snapshot ticket done by the latch agent of the node that holds it ' +
    '(frozen there), or for an idle volume of --node or this node (docs/jobs.md).';
  snapshot
    .command('create <volume> <name>')
    .description(`take a consistent snapshot of a volume (a reflink clone where the pool can, else a sparse copy; rbd: its own). ${where}`)
    .option(...JOB_NODE)
    .option(...NO_WAIT)
    .option(...JOB_TIMEOUT)
    .option(...OUTPUT)
    .action(async (volume: string, name: string, opts) => done(await snapshotCreate({ volume, name, ...opts }, io)));

  snapshot
    .command('list <volume>')
    .description("list a volume's snapshots with their real space: allocated, and exclusive (what deleting it frees)")
    .option(...OUTPUT)
    .action(async (volume: string, opts) => done(await snapshotList({ volume, ...opts }, io)));

  snapshot
    .command('delete <volume> <name>')
    .description("delete one of a volume's snapshots")
    .action(async (volume: string, name: string) => done(await snapshotDelete({ volume, name }, io)));
}

function declareBackup(backup: Command, io: CommandIO, done: Done): void {
  backup
    .command('create <volume> [name]')
    .description(
      'back a volume up: only chunks the target does not hold yet are written (compressed), then its manifest. ' +
        'In use on this node: done here; in use on another node or idle: by the latch agent of that node (or of --node) ' +
        'through a backup ticket, like latch snapshot create. An interrupted backup never shows in list',
    )
    .option('--name <name>', 'the backup name, as [name] (default: <volume>-<yyyymmdd>-<hhmmss>, UTC)')
    .option('--from-snapshot <snapshot>', 'back up this existing snapshot of the volume instead of its current state')
    .option(...JOB_NODE)
    .option(...NO_WAIT)
    .option(...JOB_TIMEOUT)
    .option(...OUTPUT)
    .action(async (volume: string, name: string | undefined, opts: Omit<BackupCreateOptions, 'volume'>) => {
      if (name !== undefined && opts.name !== undefined && name !== opts.name)
        throw new LatchError(`two backup names given: ${name} and ${opts.name}`);
      done(await backupCreate({ volume, ...opts, ...(name !== undefined && { name }) }, io));
    });

  backup
    .command('list [volume]')
    .description('list the complete backups in the target (of one volume, or all); damaged manifests are shown as such')
    .option(...OUTPUT)
    .action(async (volume: string | undefined, opts) => done(await backupList({ ...(volume !== undefined && { volume }), ...opts }, io)));

  backup
    .command('verify <name>')
    .description("read every chunk of a backup back and check its hash and the image's checksum. Exit 1 if anything is missing or damaged")
    .option(...OUTPUT)
    .action(async (name: string, opts) => done(await backupVerify({ name, ...opts }, io)));

  backup
    .command('authenticate <name>')
    .description(
      'check a backup made before backupTarget.keyFile was set, as verify does, and sign its manifest with the key (until ' +
        'then verify and restore refuse it). Only for backups you know nobody else could have written. Exit 1 if damaged',
    )
    .action(async (name: string) => done(await backupAuthenticate({ name }, io)));

  backup
    .command('delete <name>')
    .description('delete a backup, then the chunks no other backup needs')
    .action(async (name: string) => done(await backupDelete({ name }, io)));
}

/** --driver, as install and uninstall take it. */
const DRIVER = ['--driver <vendor/driver>', `driver name (default: driverName from the config, else ${DEFAULT_DRIVER_NAME})`] as const;

/** -o/--output, as every command that prints data takes it. */
const OUTPUT = ['-o, --output <format>', 'table or json', valueOf(parseFormat), 'table'] as const;
function parseTimeout(value: string): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1) throw new LatchError(`--timeout must be a whole number of seconds (1 or more), not "${value}"`);
  return n;
}
/** The options of a command that asks a node agent for a job (docs/jobs.md, "Requesting"). */
const JOB_NODE = ['--node <node>', 'for an idle volume: the node whose agent does it (default: this node)'] as const;
const NO_WAIT = ['--no-wait', 'return once the job ticket is added, printing its ID, without waiting for the agent'] as const;
const JOB_TIMEOUT = [
  '--timeout <seconds>',
  "how long to wait for the agent's outcome (the job goes on after)",
  valueOf(parseTimeout),
] as const;

/**
 * An option value parser for commander: the LatchError of a bad value becomes commander's "argument is invalid",
 * which it reports as a usage error (exit 1) rather than as an internal error.
 */
function valueOf<T>(parse: (value: string) => T): (value: string) => T {
  return (value) => {
    try {
      return parse(value);
    } catch (err) {
      if (err instanceof LatchError) throw new InvalidArgumentError(err.message);
      throw err;
    }
  };
}

function parseDemoBackend(value: string): 'loop' | 'rbd' {
  if (value === 'loop' || value === 'rbd') return value;
  throw new LatchError(`--backend must be loop or rbd, not ${JSON.stringify(value)}`);
}

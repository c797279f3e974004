// latch volume attach VOLUME --node N [--mount] [--read-only] and latch volume detach VOLUME: a person's attach,
// the seeds' longhorn-api ticket (manual, priority 1000; docs/jobs.md, "Manual attach"). The node's agent sets the
// device up (and mounts it at its own <manualAttach.mountRoot>/VOLUME, never formatting); it stays until detach asks
// the job to end, and the agent unmounts, releases the device and removes the ticket.
import { setTimeout as sleep } from 'node:timers/promises';
import { LatchError } from '../../errors.js';
import { finishedJob } from '../../ledger/arbitrate.js';
import { jobTicketId } from '../../ledger/ids.js';
import { checkNodeName } from '../../names.js';
import { configOf, type CommandIO } from '../io.js';
import { holdersOf, jobRequest } from '../../jobs/request.js';
import { runJob } from './job.js';
import { getVolume } from '../volume-doc.js';

export interface VolumeAttachOptions {
  name: string;
  node: string;
  mount?: boolean;
  readOnly?: boolean;
}

/** Setting a device up (and mounting it) takes seconds; past this the command stops waiting (the attach goes on). */
const ATTACH_WAIT_MS = 10 * 60 * 1000;

export async function volumeAttach(options: VolumeAttachOptions, io: CommandIO): Promise<void> {
  const config = configOf(io);
  const node = checkNodeName(options.node);
  const ctx = io.context(config);
  const doc = await getVolume(ctx.ledger, options.name);
  const name = doc.name;
  if (doc.spec.shared) {
    throw new LatchError(`volume ${name} is a shared (ReadWriteMany) CephFS volume: it has no block device to attach; mount it in a pod`);
  }
  const others = holdersOf(doc).filter((n) => n !== node);
  if (others.length > 0 && !(options.readOnly && Object.values(doc.status.nodes).every((e) => e.readOnly))) {
    throw new LatchError(
      `volume ${name} is in use on node ${others.join(', ')}: attach it there (--node ${others[0]}) or stop its pod first`,
    );
  }
  // Where it is mounted is the node's to say (its manualAttach.mountRoot), never the ledger's.
  const request = jobRequest(ctx, name, { kind: 'attach', ...(options.mount && { mount: true }) }, node, {
    readOnly: !!options.readOnly,
  });
  await runJob(ctx, io, name, request, { wait: true, timeoutMs: ATTACH_WAIT_MS });
}

export interface VolumeDetachOptions {
  name: string;
  node?: string;
}

/** How often detach looks at the ledger while the agent lets go. */
const DETACH_POLL_MS = 500;
const DETACH_WAIT_MS = 10 * 60 * 1000;

export async function volumeDetach(options: VolumeDetachOptions, io: CommandIO): Promise<void> {
  const config = configOf(io);
  const ctx = io.context(config);
  const doc = await getVolume(ctx.ledger, options.name);
  const name = doc.name;
  const id = jobTicketId('manual', name, 'manual');
  const ticket = doc.spec.tickets[id];
  if (!ticket) throw new LatchError(`volume ${name} has no manual attach (latch volume attach); nothing to detach`);
  if (options.node !== undefined && checkNodeName(options.node) !== ticket.nodeID) {
    throw new LatchError(`volume ${name} is attached by hand on node ${ticket.nodeID}, not ${options.node}`);
  }
  await ctx.ledger.endJob(name, id);
  const deadline = Date.now() + DETACH_WAIT_MS;
  for (;;) {
    const now = await ctx.ledger.get(name);
    if (!now?.spec.tickets[id]) {
      const how = now && finishedJob(now, id)?.status.message;
      io.out(
        `volume ${name} detached from node ${ticket.nodeID}: its device released and its manual ticket removed${how ? ` (${how})` : ''}\n`,
      );
      return;
    }
    if (Date.now() > deadline) {
      throw new LatchError(
        `the agent on node ${ticket.nodeID} did not let volume ${name} go within ${DETACH_WAIT_MS / 1000} s; ` +
          'is `latch agent` running there? (the job is marked ending: it lets go when it runs)',
      );
    }
    await sleep(DETACH_POLL_MS);
  }
}

// The ledger's documents: one per volume (Longhorn's VolumeAttachment model; docs/ledger.md).
import type { FsType } from '../filesystems.js';
import type { PodInfo } from '../contract/options.js';

/**
 * Who asks for the volume, and how much it matters (docs/ledger.md, "Ticket types"): the seeds' attacher types that
 * latch uses, with the seeds' priorities (Longhorn's AttacherPriorityLevel*), plus latch's two reservations.
 */
export const TICKET_PRIORITY = {
  restore: 2000, // volume-restore-controller: `latch volume restore` fills a new volume from a backup
  manual: 1000, // longhorn-api: `latch volume attach` sets the device up on a node for a person
  admin: 1000, // latch: a person's reservation (`latch ticket add`), no device is set up for it
  workload: 900, // csi-attacher: a pod (attach/mount calls from kubelet and the controller)
  snapshot: 800, // snapshot-controller: a snapshot taken by the node agent
  backup: 800, // backup-controller: a backup taken by the node agent
  clone: 800, // volume-clone-controller: `latch volume clone`, on the source and on the new volume
  maintenance: 800, // latch: a tool's reservation (`latch ticket add --type maintenance`), no device either
} as const;
export type TicketType = keyof typeof TICKET_PRIORITY;
export const TICKET_TYPES = Object.keys(TICKET_PRIORITY) as TicketType[];

/** The seeds' name for each ticket type (Longhorn's AttacherType), for people who know Longhorn. */
export const SEED_ATTACHER_TYPE: Record<TicketType, string> = {
  restore: 'volume-restore-controller',
  manual: 'longhorn-api',
  admin: 'longhorn-api',
  workload: 'csi-attacher',
  snapshot: 'snapshot-controller',
  backup: 'backup-controller',
  clone: 'volume-clone-controller',
  maintenance: 'longhorn-api',
};

/** Ticket types whose work the node agent does (the ticket carries a `job`). */
export const JOB_TICKET_TYPES = ['restore', 'manual', 'snapshot', 'backup', 'clone'] as const satisfies readonly TicketType[];
export type JobTicketType = (typeof JOB_TICKET_TYPES)[number];

/**
 * The work a job ticket asks the node agent on its node to do once the volume is granted there (docs/jobs.md).
 * Names are fixed when the ticket is made, so that an agent killed midway and restarted redoes (or finds done) the
 * same job.
 */
export type JobSpec =
  | { kind: 'snapshot'; snapshot: string }
  | { kind: 'backup'; backup: string; fromSnapshot?: string }
  /** Fill this (new) volume from backup `backup` in the configured target. */
  | { kind: 'restore'; backup: string }
  /** On the source volume (role source) and on the new one (role target), the same clone. */
  | { kind: 'clone'; role: 'source' | 'target'; source: string; target: string; fromSnapshot?: string }
  /**
   * A person's attach: the device is set up, and mounted when `mount` is true, until `latch volume detach`. The node
   * mounts only at its own `<manualAttach.mountRoot>/<volume>`; `mountPath` is what an older latch wrote (the path
   * a person chose): the agent refuses one that is not that path (docs/ledger.md, "Who may write the ledger").
   */
  | { kind: 'attach'; mount?: boolean; mountPath?: string };

/** A request to have the volume on a node: who asked, for what, and when. */
export interface Ticket {
  id: string;
  type: TicketType;
  nodeID: string;
  parameters: {
    readOnly: boolean;
    /** The seed's disableFrontend: the device is set up for the agent's job only; no pod and no kubelet mount it. */
    disableFrontend?: boolean;
  };
  /** What the node agent does for this ticket (job ticket types only). */
  job?: JobSpec;
  /** Taken from the volume's counter whenever the ticket is created or changed: never reused. */
  generation: number;
  createdAt: string;
  requestedBy: { pvName?: string; pod?: PodInfo; fsGroup?: number; admin?: boolean };
  // ---- owners, expiry and liveness (issue 15; rules in automatic.ts) ----
  /** Who asked for an admin or maintenance ticket (a person or a tool), shown in `ticket list`. */
  owner?: string;
  /** After this time the ticket is expired: the agent's reaper and the next ticket write on the volume remove it. */
  expiresAt?: string;
  /** Last time attach, isattached or waitforattach asked for this ticket (written at most once a touch interval). */
  lastSeen?: string;
}

/** Machine-readable reasons a ticket is or is not satisfied. */
type TicketReason =
  | 'Attached' // the ticket's node holds (or is granted) the volume
  | 'AttachedElsewhere' // read-write-once and another node holds it
  | 'Detaching' // the volume is still being released by a node
  | 'ReadOnlyAttachment' // read-write wanted, but the node holds it read-only
  | 'Waiting' // detached, and another ticket was chosen first
  | 'Fenced' // the ticket's node was fenced off the volume and has not cleared its old mapping yet
  | 'Preempted'; // a job ticket whose node is letting the volume go to a ticket of higher priority

/** The seeds' condition shape (Kubernetes' metav1.Condition without observedGeneration). */
export interface Condition {
  /** Satisfied: the ticket is granted. Job: the agent's job (present on job tickets once an agent picked it up). */
  type: 'Satisfied' | 'Job';
  status: 'True' | 'False' | 'Unknown';
  reason: string;
  message: string;
  /** When the condition was last computed. */
  lastProbeTime: string;
  /** When status last changed (kept while it stays the same). */
  lastTransitionTime: string;
}

/** How far the node agent got with a job ticket (kept across reconciles; reset when the ticket changes). */
export interface JobStatus {
  /**
   * running: an agent is at it (an agent restarted after a kill finds this and redoes or finishes the job).
   * succeeded / failed: done; the agent releases what it set up, then removes the ticket (a failed restore or clone
   * keeps its ticket so that nobody uses the half-made volume).
   * ending: someone asked for the job to end (`latch volume detach` of a manual attach): the agent lets go.
   */
  state: 'running' | 'succeeded' | 'failed' | 'ending';
  node: string;
  startedAt: string;
  finishedAt?: string;
  /** Times an agent started this job (more than one: it was interrupted and redone). */
  attempts: number;
  message: string;
  /** What the job made, for the requester (snapshot info, backup summary, ...): small, JSON. */
  result?: Record<string, unknown>;
}

export interface TicketStatus {
  /** The ticket generation this status was computed for; satisfied counts only when it equals the ticket's. */
  generation: number;
  satisfied: boolean;
  reason: TicketReason;
  message: string;
  /** The seeds' conditions: Satisfied always; Job on job tickets an agent picked up. */
  conditions?: Condition[];
  /** Job tickets: the agent's progress. */
  job?: JobStatus;
}

/** A job ticket that is gone, with how it ended: kept (bounded, newest last) so requesters and doctor can see it. */
export interface FinishedJob {
  ticket: string;
  type: JobTicketType;
  node: string;
  job: JobSpec;
  status: JobStatus;
  /**
   * Run by a command itself, beside a pod, without a ticket (`latch backup create` on the node that holds the
   * volume): `ticket` is the ID its job ticket would have had (jobTicketId), never a ticket that existed.
   */
  direct?: true;
}

/**
 * Where a node stands with the volume.
 * granted: the ledger chose this node; the node has not touched the device yet (can be withdrawn freely).
 * attaching: the node started setting up the device. attached: it has the device.
 * detaching: no ticket wants it there any more, but the node has not confirmed it released the device.
 */
export type NodePhase = 'granted' | 'attaching' | 'attached' | 'detaching';

export interface NodeAttachment {
  phase: NodePhase;
  readOnly: boolean;
  since: string;
  device?: string;
  /** The storage client instance that serves the node's device, where the backend has one (Ceph: IP:PORT/NONCE). */
  client?: string;
}

/**
 * A node cut off from the volume's storage before the volume moved away from it (docs/ledger.md, "Fences").
 * While it is not cleared the node is never granted the volume again.
 */
export interface Fence {
  /** fencing: recorded, the storage may not refuse the node yet; fenced: the storage refuses the clients below. */
  state: 'fencing' | 'fenced';
  since: string;
  /** Who fenced, and why: for people. */
  reason: string;
  /** The node's client instances the storage was told to refuse (Ceph blocklist entries). */
  clients: string[];
  /** When the node showed, from its own kernel state, that nothing of the volume is mapped there any more. */
  clearedAt?: string;
}

/** Whom a volume was created for (docs/ledger.md, "Who may use a volume"). */
export interface VolumeOwner {
  name: string;
  namespace?: string;
}

/** What an admin allowed besides the volume's own PV: PV names, and namespaces (any PV, from pods there). */
export interface VolumeAllowed {
  pvs?: string[];
  namespaces?: string[];
}

export type VolumeState = 'detached' | 'attaching' | 'attached' | 'detaching';

export interface VolumeDoc {
  apiVersion: 'latch/v1';
  name: string;
  createdAt: string;
  spec: {
    sizeBytes: number;
    fsType: FsType;
    tickets: Record<string, Ticket>;
    /** Source of ticket generations. */
    generationCounter: number;
    /**
     * The PV a driver call created the volume for, and its pod's namespace when the call carried one (a non-attach
     * mount). Absent: made by an admin command, or before latch recorded it (docs/ledger.md, "Who may use a volume").
     */
    pv?: VolumeOwner;
    /** Other PV names and namespaces an admin allowed to use the volume (`latch volume allow`). */
    allowed?: VolumeAllowed;
    /**
     * A shared (ReadWriteMany) volume: a CephFS subvolume that every node asking for it may mount read-write at once
     * (ledger/shared.ts); its fsType is not used. Absent: a block volume, held read-write by one node at a time.
     */
    shared?: true;
  };
  status: {
    state: VolumeState;
    /** Nodes that have (or may have) set the device up: attaching, attached or detaching. */
    currentNodes: string[];
    nodes: Record<string, NodeAttachment>;
    tickets: Record<string, TicketStatus>;
    /** The filesystem found or made on the volume; once set, a blank device means something is wrong: never format it. */
    filesystem?: string;
    /** Nodes fenced off the volume, until the fence is lifted (after the node cleared its mapping). */
    fences?: Record<string, Fence>;
    /** The latest things latch did here by itself (reaped tickets, releases proven by a node's kernel), newest last. */
    automatic?: AutomaticAction[];
    /** The seed's lastAttachedBy: the ticket (and its type and node) under which a node last reached attached. */
    lastAttachedBy?: { ticket: string; type: TicketType; node: string; at: string };
    /** The latest finished jobs, newest last (bounded). */
    jobs?: FinishedJob[];
    /**
     * Where the volume's image lives, for a backend whose images only one node reaches (loop): set when the image is
     * first made or first found (docs/ledger.md, "Home"). Absent for shared storage (rbd).
     */
    home?: VolumeHome;
  };
}

/** The node whose pool holds a node-local volume's image, and that pool's directory. */
export interface VolumeHome {
  node: string;
  pool: string;
  since: string;
}

// ---- automatic actions (issue 15; rules in automatic.ts) ----

export type AutomaticActionKind = 'expired' | 'abandoned' | 'released';

/** One thing latch did without a person: kept (bounded) in the volume's status so that doctor can show it. */
export interface AutomaticAction {
  at: string;
  kind: AutomaticActionKind;
  /** The node it concerned (the reaped ticket's node, or the node that released its hold). */
  node: string;
  /** The reaped ticket. */
  ticket?: string;
  /** Why, for people. */
  message: string;
}

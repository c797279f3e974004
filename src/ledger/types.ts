// The ledger's documents: one per volume (Longhorn's VolumeAttachment model; docs/ledger.md).
import type { FsType } from '../filesystems.js';
import type { PodInfo } from '../contract/options.js';

export const TICKET_PRIORITY = { restore: 2000, admin: 1000, workload: 900, maintenance: 800 } as const;
export type TicketType = keyof typeof TICKET_PRIORITY;
export const TICKET_TYPES = Object.keys(TICKET_PRIORITY) as TicketType[];

/** A request to have the volume on a node: who asked, for what, and when. */
export interface Ticket {
  id: string;
  type: TicketType;
  nodeID: string;
  parameters: { readOnly: boolean };
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
  | 'Fenced'; // the ticket's node was fenced off the volume and has not cleared its old mapping yet

export interface TicketStatus {
  /** The ticket generation this status was computed for; satisfied counts only when it equals the ticket's. */
  generation: number;
  satisfied: boolean;
  reason: TicketReason;
  message: string;
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
  };
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

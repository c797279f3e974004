// Pure arbitration: (volume document, request) -> new document. No I/O, no clock except the `now` passed in.
// The rules it implements: docs/ledger.md, "Arbitration rules" and "Node phases". Each concern has its file in
// arbitrate/; this module is the one name the rest of latch imports them by.
export { newVolume, addTicket, removeTicket, type TicketRequest } from './arbitrate/tickets.js';
export { markAttaching, markAttached, markReleased } from './arbitrate/phases.js';
export { releaseDeadNode, beginFence, completeFence, markFenceCleared, removeFence } from './arbitrate/fences.js';
export { isSatisfied, isInUse, nodeHoldsDevice, isFencedOff, ticketsOfNode } from './arbitrate/queries.js';
export { reconcile } from './arbitrate/reconcile.js';
export { isPreempted } from './arbitrate/preemption.js';
export {
  MAX_FINISHED_JOBS,
  requestJob,
  startJob,
  recordJob,
  finishJob,
  recordDirectJob,
  endJob,
  jobTicketsOfNode,
  finishedJob,
  type JobRequest,
  type JobUpdate,
} from './arbitrate/jobs.js';

// The one JSON object a driver call prints, and its exit code (docs/protocol.md, "Output").

type Status = 'Success' | 'Failure' | 'Not supported';

interface Capabilities {
  attach: boolean;
  selinuxRelabel: boolean;
  fsGroup: boolean;
  requiresFSResize: boolean;
  supportsMetrics: boolean;
}

export interface Reply {
  status: Status;
  message?: string;
  device?: string;
  volumeName?: string;
  attached?: boolean;
  capabilities?: Capabilities;
  volumeNewSize?: number;
}

// Messages end up in pod events; a few KiB is plenty, and keeps the reply well under one pipe buffer.
const MAX_MESSAGE = 4000;

export const success = (fields: Omit<Reply, 'status'> = {}): Reply => ({ status: 'Success', ...fields });
export const failure = (message: string): Reply => ({ status: 'Failure', message });
export const notSupported = (message?: string): Reply =>
  message === undefined ? { status: 'Not supported' } : { status: 'Not supported', message };

export function exitCodeOf(reply: Reply): 0 | 1 {
  return reply.status === 'Failure' ? 1 : 0;
}

/** Serialises a reply: only known fields, message cut to size, one line. */
export function encodeReply(reply: Reply): string {
  const out: Record<string, unknown> = { status: reply.status };
  if (reply.message !== undefined) {
    out.message = reply.message.length > MAX_MESSAGE ? `${reply.message.slice(0, MAX_MESSAGE)}...` : reply.message;
  }
  if (reply.device !== undefined) out.device = reply.device;
  if (reply.volumeName !== undefined) out.volumeName = reply.volumeName;
  if (reply.attached !== undefined) out.attached = reply.attached;
  if (reply.capabilities !== undefined) out.capabilities = reply.capabilities;
  if (reply.volumeNewSize !== undefined) out.volumeNewSize = reply.volumeNewSize;
  return `${JSON.stringify(out)}\n`;
}

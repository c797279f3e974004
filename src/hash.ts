// Hashes for names, without node:crypto: loading it costs a driver call 2.5 ms of CPU (a tenth of a node start-up),
// and every attach and isattached names its ticket.
import { sha256 } from '@noble/hashes/sha2.js';
import { bytesToHex } from '@noble/hashes/utils.js';

/**
 * Hex sha256 of a short string, with the audited pure-JS sha256 (0.1 ms). The text's UTF-8 bytes from Buffer.from,
 * which the call's reply uses anyway, rather than TextEncoder (two more of Node's functions to compile).
 */
export function sha256Hex(text: string): string {
  return bytesToHex(sha256(Buffer.from(text, 'utf8')));
}

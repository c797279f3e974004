// Hashes and random tags for names, without node:crypto: loading it costs a driver call 2.5 ms of CPU (a tenth of a
// node start-up), and every attach and isattached names its ticket, every ledger write its temp file
// (atomic-file.ts names every other temp file with the same tag).
import { sha256 } from '@noble/hashes/sha2.js';
import { bytesToHex } from '@noble/hashes/utils.js';

/**
 * Hex sha256 of a short string, with the audited pure-JS sha256 (0.1 ms). The text's UTF-8 bytes from Buffer.from,
 * which the call's reply uses anyway, rather than TextEncoder (two more of Node's functions to compile).
 */
export function sha256Hex(text: string): string {
  return bytesToHex(sha256(Buffer.from(text, 'utf8')));
}

/**
 * Eight random hex digits that keep one process's temp file names apart from another's with the same pid (a pid
 * namespace, a recycled pid). Not a secret and not a lock: every such name is created exclusively, so a clash
 * fails the create, it never shares a file.
 */
export function tempTag(): string {
  return Math.floor(Math.random() * 0x1_0000_0000)
    .toString(16)
    .padStart(8, '0');
}

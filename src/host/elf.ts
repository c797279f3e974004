// The two strings of an ELF executable that say where its loader and its libraries are: the interpreter (PT_INTERP)
// and the RPATH. The self-contained build leaves room in both (build.mjs pads them), and `latch install` rewrites
// them in the copy it installs, so that the driver runs with the runtime installed beside it and nothing else.
// Only what that needs is read: 64-bit little-endian ELF, program headers, the dynamic section.
import { open, type FileHandle } from 'node:fs/promises';
import { LatchError } from '../errors.js';

/** Where a NUL-terminated string lives in the file, and how many bytes it may take (its NUL included). */
export interface StringSlot {
  offset: number;
  size: number;
  /** The string there now, without the padding build.mjs put before it. */
  value: string;
}

export interface RuntimeSlots {
  interpreter: StringSlot;
  rpath: StringSlot;
}

const PT_LOAD = 1;
const PT_DYNAMIC = 2;
const PT_INTERP = 3;
const DT_NULL = 0;
const DT_STRTAB = 5;
const DT_RPATH = 15;
const DT_RUNPATH = 29;

/** The interpreter and RPATH slots of an executable; undefined when it is not a 64-bit ELF with both. */
export async function readRuntimeSlots(file: string): Promise<RuntimeSlots | undefined> {
  const handle = await open(file, 'r');
  try {
    const header = await readAt(handle, 0, 64);
    // \x7fELF, 64-bit, little-endian
    if (header.length < 64 || header.readUInt32BE(0) !== 0x7f454c46 || header[4] !== 2 || header[5] !== 1) return undefined;
    const phoff = Number(header.readBigUInt64LE(0x20));
    const phentsize = header.readUInt16LE(0x36);
    const phnum = header.readUInt16LE(0x38);
    const headers = await readAt(handle, phoff, phentsize * phnum);
    const loads: { vaddr: number; offset: number; filesz: number }[] = [];
    let interp: { offset: number; size: number } | undefined;
    let dynamic: { offset: number; size: number } | undefined;
    for (let i = 0; i < phnum; i++) {
      const at = i * phentsize;
      const type = headers.readUInt32LE(at);
      const offset = Number(headers.readBigUInt64LE(at + 8));
      const vaddr = Number(headers.readBigUInt64LE(at + 16));
      const filesz = Number(headers.readBigUInt64LE(at + 32));
      if (type === PT_LOAD) loads.push({ vaddr, offset, filesz });
      else if (type === PT_INTERP) interp = { offset, size: filesz };
      else if (type === PT_DYNAMIC) dynamic = { offset, size: filesz };
    }
    if (!interp || !dynamic) return undefined;
    const entries = await readAt(handle, dynamic.offset, dynamic.size);
    let strtab: number | undefined;
    let rpath: number | undefined;
    for (let at = 0; at + 16 <= entries.length; at += 16) {
      const tag = Number(entries.readBigInt64LE(at));
      const value = Number(entries.readBigUInt64LE(at + 8));
      if (tag === DT_NULL) break;
      if (tag === DT_STRTAB) strtab = value;
      else if (tag === DT_RPATH || tag === DT_RUNPATH) rpath = value;
    }
    if (strtab === undefined || rpath === undefined) return undefined;
    const strtabAddress = strtab;
    const load = loads.find((l) => l.vaddr <= strtabAddress && strtabAddress < l.vaddr + l.filesz);
    if (!load) return undefined;
    const rpathOffset = strtab - load.vaddr + load.offset + rpath;
    // The slot is the string as it is now: build.mjs made it long; a rewrite pads with NULs after the path.
    const rpathBytes = await readAt(handle, rpathOffset, 4096);
    const rpathEnd = rpathBytes.indexOf(0);
    if (rpathEnd < 0) return undefined;
    const interpBytes = await readAt(handle, interp.offset, interp.size);
    return {
      interpreter: { offset: interp.offset, size: interp.size, value: slotValue(interpBytes) },
      rpath: { offset: rpathOffset, size: rewrittenSize(rpathBytes, rpathEnd), value: slotValue(rpathBytes.subarray(0, rpathEnd)) },
    };
  } finally {
    await handle.close();
  }
}

/**
 * How many bytes a rewrite may use at the RPATH: the string with its NUL, plus the NULs a previous rewrite left
 * after it, which is known only up to the slot size build.mjs uses: a shorter string followed by NULs was longer.
 */
function rewrittenSize(bytes: Buffer, end: number): number {
  let size = end + 1;
  while (size < bytes.length && size < SLOT_SIZE && bytes[size] === 0) size++;
  return size;
}

/** The size build.mjs gives both slots (RUNTIME_SLOT there). */
const SLOT_SIZE = 1024;

/** The path in a slot: up to its NUL, with build.mjs's leading slashes folded into one. */
function slotValue(bytes: Buffer): string {
  const end = bytes.indexOf(0);
  return bytes
    .subarray(0, end < 0 ? bytes.length : end)
    .toString('utf8')
    .replace(/^\/+/, '/');
}

async function readAt(handle: FileHandle, position: number, length: number): Promise<Buffer> {
  const buffer = Buffer.alloc(length);
  const { bytesRead } = await handle.read(buffer, 0, length, position);
  return buffer.subarray(0, bytesRead);
}

/** A change to a file's bytes at an offset, applied while it is copied or hashed. */
export interface ByteEdit {
  offset: number;
  bytes: Buffer;
}

/** The bytes that put `path` in `slot`: the path, then NULs up to the slot's size. */
export function slotEdit(slot: StringSlot, path: string, what: string): ByteEdit {
  const encoded = Buffer.from(path, 'utf8');
  if (encoded.length >= slot.size || path.includes('\0')) {
    throw new LatchError(`the ${what} path ${path} does not fit the executable's ${slot.size - 1}-byte slot`);
  }
  const bytes = Buffer.alloc(slot.size);
  encoded.copy(bytes);
  return { offset: slot.offset, bytes };
}

/** Applies the edits that fall into `chunk`, which holds the file's bytes from `position` on. */
export function applyEdits(chunk: Buffer, position: number, edits: readonly ByteEdit[]): void {
  for (const edit of edits) {
    const start = Math.max(edit.offset, position);
    const end = Math.min(edit.offset + edit.bytes.length, position + chunk.length);
    if (start < end) edit.bytes.copy(chunk, start - position, start - edit.offset, end - edit.offset);
  }
}

// How an executable sits in the page cache decides what each start of it costs (docs/performance.md, "The driver's
// page cache"). A file whose pages came in by a process faulting on its mapping (the kernel's read-around, after a
// reboot or after memory pressure evicted it) is cached in 4 KiB folios, and every start of it takes a page fault per
// 4 KiB of the code it runs. Read from start to end in pieces no larger than the readahead window, the same file comes
// in through readahead in large folios (up to 2 MiB, where the filesystem supports them: ext4 since Linux 6.16, xfs),
// which a start maps with far fewer faults. Measured here: a driver call took 1,630 page faults instead of 1,990, and
// 0.85-0.88 of a bare `node -e 0` instead of 1.00-1.13.
//
// The cached pages must go first: readahead skips what is already cached, in whatever folios it is in. Node has no
// posix_fadvise, so `dd iflag=nocache count=0` drops them (POSIX_FADV_DONTNEED over the whole file). The kernel keeps
// every page that a process has mapped (a call running right now), so a reload never disturbs a running executable;
// those pages just stay as they are.
import { open } from 'node:fs/promises';
import { errorMessage } from '../errors.js';
import { run } from './run.js';

/**
 * The size of each read: sequential reads of up to the readahead window (128 KiB is the smallest usual one) let
 * readahead grow its folios as it goes; a read of 8 MiB at once is read ahead in small folios (measured: 1,840 faults
 * a call against 1,630).
 */
const READ_BYTES = 128 * 1024;

/** Whether the files were reloaded, or why not. */
export type PageCacheReload = { reloaded: true } | { reloaded: false; reason: string };

/**
 * Drops each file's cached pages that no process maps and reads the file back from start to end, so that the kernel
 * caches it in large folios. Never throws: the files are left as they are, only slower to start, if it cannot.
 */
export async function reloadPageCache(paths: readonly string[]): Promise<PageCacheReload> {
  try {
    for (const path of paths) {
      // Reads nothing (count=0): only the advice, so a minute is plenty.
      await run('dd', [`if=${path}`, 'iflag=nocache', 'count=0', 'status=none'], { timeoutMs: 60_000 });
      await readThrough(path);
    }
    return { reloaded: true };
  } catch (err) {
    return { reloaded: false, reason: errorMessage(err) };
  }
}

async function readThrough(path: string): Promise<void> {
  const handle = await open(path, 'r');
  try {
    const buffer = Buffer.allocUnsafe(READ_BYTES);
    while ((await handle.read(buffer, 0, READ_BYTES, null)).bytesRead > 0);
  } finally {
    await handle.close();
  }
}

// Small file-system steps that several parts need to do the same careful way.
import { open } from 'node:fs/promises';

/** fsyncs a directory, so that a rename or link inside it survives a power loss. */
export async function syncDir(dir: string): Promise<void> {
  const handle = await open(dir, 'r');
  try {
    await handle.sync();
  } finally {
    await handle.close();
  }
}

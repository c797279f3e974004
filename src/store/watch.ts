// A change signal: writers call notify() (often, cheaply); one reader iterates and wakes once per burst of changes.
// Changes are coalesced, never queued: the reader is told "something may have changed, read again", not what.

/** Yields once after each burst of notify() calls; ends when `signal` aborts. */
export class ChangeSignal implements AsyncIterable<void> {
  private pending = false;
  private wake: (() => void) | undefined;

  constructor(private readonly signal: AbortSignal) {
    signal.addEventListener('abort', () => this.wake?.(), { once: true });
  }

  notify(): void {
    this.pending = true;
    this.wake?.();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<void> {
    while (!this.signal.aborted) {
      if (!this.pending) {
        await new Promise<void>((resolve) => (this.wake = resolve));
        this.wake = undefined;
        continue;
      }
      this.pending = false;
      yield;
    }
  }
}

// The data plane on one node: where a volume's bytes live and how it becomes a block device.
// The ledger never calls this; the ops do, after the ledger says this node may.

export interface Backend {
  /** Where this backend keeps volumes' bytes, for messages: "the pool (/var/lib/latch/pool)", "the rbd pool latch". */
  readonly storage: string;
  /** Creates the volume's storage of `sizeBytes`; Success if it already exists with at least that size. Refuses above maxSize or the pool's free space. */
  create(volume: string, sizeBytes: number): Promise<void>;
  /** Removes the volume's storage; refuses while a device is set up for it. Missing volume: no-op. */
  delete(volume: string): Promise<void>;
  /** Size in bytes, or undefined if the volume has no storage here. */
  size(volume: string): Promise<number | undefined>;
  /** Sets up (or finds the already set up) block device of the volume and returns its path, e.g. /dev/loop3. Never two devices for one volume. */
  attach(volume: string): Promise<string>;
  /** The device currently set up for the volume, if any. Reads the kernel's state, spawns nothing. */
  findDevice(volume: string): Promise<string | undefined>;
  /** Which volume a device belongs to (undefined when it is not one of ours). */
  volumeOfDevice(device: string): Promise<string | undefined>;
  /** Tears down the volume's device if it has one. Idempotent. Only ever touches devices backed by this pool. */
  release(volume: string): Promise<void>;
  /** Grows the storage to `sizeBytes` and refreshes the device's capacity if one is set up. Refuses to shrink. */
  grow(volume: string, sizeBytes: number): Promise<void>;
}

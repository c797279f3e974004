// How an RBD image becomes a block device on this node: the rbd backend's data plane, one strategy per client. The
// configuration's `backend.client` says which one a node uses.
//
// Each finds its existing mapping from kernel state, so every call stays idempotent and crash-safe as with the loop
// backend:
//  - rbd-fuse + loop (RbdFuseLoopClient in rbd-fuse-loop.ts): what backend.client "auto" is without the rbd module
//    (client-choice.ts), and the one that runs where latch is tested (no rbd or nbd module). One `rbd-fuse -r IMAGE`
//    per volume at <mountDir>/<volume>, a loop device over <mountDir>/<volume>/<image>.
//  - krbd (KernelRbdClient in krbd.ts), where the rbd module is loaded: `rbd device map -o noshare` (and `exclusive`
//    for a read-write mapping of an image with the exclusive-lock feature) / `unmap`, device
//    /dev/rbdID, found in /sys/bus/rbd/devices/ID/{pool,pool_ns,name,current_snap} ('-' for the head); `client_addr`
//    there is exactly the blocklist entry that fences it. The key goes to the kernel keyring.
//  - rbd-nbd, where the nbd module is (designed, not implemented): `rbd-nbd map` is a daemon like rbd-fuse;
//    /sys/block/nbdN/pid names it, and its /proc/PID/cmdline says pool, namespace, image and snapshot (what
//    `rbd-nbd list-mapped` reads). Its address would come from its own log, as for rbd-fuse.
//
// Each client says which client instance (IP:PORT/NONCE) serves a mapping, from the client's own report: krbd's
// sysfs, rbd-fuse's log of its sessions' global ids matched against the image's watchers. Never a diff of watchers
// before and after: another client opening the image meanwhile would be taken for this node's.

/** One way of making an RBD image a block device on this node. Every method reads its state from the kernel. */
export interface NodeClient {
  /** Which client this is, for messages and doctor. */
  readonly kind: string;
  /**
   * Maps the image (or finds its mapping) and returns the block device. Never two mappings for one image. `readOnly`:
   * the ledger granted this node the volume read-only (krbd then takes no exclusive lock).
   */
  map(image: string, mode: { readOnly: boolean }): Promise<string>;
  /** The image's block device on this node, from sysfs and mountinfo only. */
  deviceOf(image: string): Promise<string | undefined>;
  /** The image a block device maps, if it is one of this client's. */
  imageOf(device: string): Promise<string | undefined>;
  /** Whether anything of the image's mapping is left (a device, a mount, a process). */
  isMapped(image: string): Promise<boolean>;
  /** Removes every trace of the image's mapping, also of a dead or hung one. Idempotent. */
  unmap(image: string): Promise<void>;
  /** The storage refuses this client: every wait on it fails at once from now on (the mapping stays for unmap). */
  abort(image: string): Promise<void>;
  /** Makes the device show the image's new size `sizeBytes`. */
  refreshSize(image: string, sizeBytes: number): Promise<void>;
  /**
   * The client instance (IP:PORT/NONCE) serving the image's mapping, as the client itself reports it; undefined when
   * it cannot be told (the backend then undoes the attach: a mapping whose client is unknown cannot be fenced).
   */
  clientAddress(image: string): Promise<string | undefined>;
}

// Which MDS sessions a fence of a shared volume cuts off (backend/cephfs-fencer.ts), pure for the tests.
//
// A node records for a shared volume (status.nodes.<node>.client) its cephx entity, with its client instance where its
// client names one: `entity:ID@IP:PORT/NONCE` (ceph-fuse, from its admin socket) or `entity:ID` (the kernel client,
// which has no admin socket). Ledgers written before hold a bare `IP:PORT/NONCE`. The fence takes the node's recorded
// instances and every MDS session on the volume's directory (client_metadata.root), except the sessions of the
// volume's other holders: those whose entity one of them recorded, or whose instance one of them recorded. So a
// session of the node that nobody recorded (a second mount, a ceph-fuse restarted by hand, a record lost in a crash)
// is cut off too, and a kernel-client node is fenceable at all. Where the node shares its entity with another holder
// its sessions cannot be told apart from that holder's: the fence refuses (fails closed) rather than guess.
//
// Every recorded form comes from the ledger, which another node writes: each is checked strictly, and one that does
// not parse fails the fence (its hold stays), naming it.
import { LatchError } from '../errors.js';
import type { MdsSession } from '../sys/cephfs.js';
import { isClientInstance } from '../sys/rbd.js';

/** A cephx id as Ceph and latch's configuration spell it (without "client."). */
const ENTITY = /^[A-Za-z0-9_.-]{1,260}$/;

export interface SharedClientRecord {
  /** The cephx id the node's client authenticates as. */
  entity: string | undefined;
  /** Its client instance (IP:PORT/NONCE), where the client names one. */
  address: string | undefined;
}

/**
 * What a node records for its client of a shared volume: `entity:ID`, with `@IP:PORT/NONCE` when the client named its
 * instance. undefined when `entity` is no cephx id (the configuration checks it, so never in practice).
 */
export function sharedClientRecord(entity: string, address: string | undefined): string | undefined {
  if (!ENTITY.test(entity)) return address !== undefined && isClientInstance(address) ? address : undefined;
  return address !== undefined && isClientInstance(address) ? `entity:${entity}@${address}` : `entity:${entity}`;
}

/** A recorded client of a shared volume, checked: `entity:ID`, `entity:ID@IP:PORT/NONCE` or `IP:PORT/NONCE`. Throws otherwise. */
export function parseSharedClient(volume: string, text: string): SharedClientRecord {
  const refuse = () =>
    new LatchError(
      `volume ${volume}: the ledger records the client ${JSON.stringify(String(text).slice(0, 120))}, which is neither entity:ID, ` +
        'entity:ID@IP:PORT/NONCE nor a single Ceph client instance (IP:PORT/NONCE): a client that cannot be named cannot be ' +
        'told apart or cut off, so the hold stays',
    );
  if (typeof text !== 'string' || text.length > 400) throw refuse();
  if (!text.startsWith('entity:')) {
    if (!isClientInstance(text)) throw refuse();
    return { entity: undefined, address: text };
  }
  const rest = text.slice('entity:'.length);
  const at = rest.indexOf('@');
  const entity = at < 0 ? rest : rest.slice(0, at);
  const address = at < 0 ? undefined : rest.slice(at + 1);
  if (!ENTITY.test(entity) || (address !== undefined && !isClientInstance(address))) throw refuse();
  return { entity, address };
}

/** Whether an MDS session mounts the volume's directory, `/volumes/GROUP/VOLUME` (its subvolume, of any incarnation) or below. */
function isOnVolume(session: Pick<MdsSession, 'root'>, group: string, volume: string): boolean {
  const dir = `/volumes/${group}/${volume}`;
  return session.root === dir || session.root.startsWith(`${dir}/`);
}

/**
 * The client instances to cut off (blocklist, and evict their sessions): `known` (the node's recorded clients and
 * those fenced off it before) and every session on the volume's directory that no other holder recorded (`spare`,
 * by entity or by instance). Throws (fails closed) on a
 * recorded form that does not parse, a client recorded both for the node and for another holder, a node that shares
 * its entity with another holder, and a session to cut off whose instance cannot be named.
 */
export function selectFenceTargets(volume: string, group: string, sessions: MdsSession[], known: string[], spare: string[]): string[] {
  const mine = known.map((k) => parseSharedClient(volume, k));
  const theirs = spare.map((s) => parseSharedClient(volume, s));
  const spareAddresses = new Set(theirs.flatMap((r) => (r.address === undefined ? [] : [r.address])));
  const knownAddresses = new Set(mine.flatMap((r) => (r.address === undefined ? [] : [r.address])));
  const both = [...knownAddresses].filter((a) => spareAddresses.has(a));
  if (both.length > 0) {
    throw new LatchError(
      `volume ${volume}: the ledger records client ${both.join(', ')} both for the node to fence and for another holder: ` +
        'the ledger is inconsistent, and fencing it would cut off a legitimate holder, so the hold stays',
    );
  }
  // Each side's entities: recorded, or shown by the MDS for an instance it recorded.
  const entityOf = (address: string) => sessions.find((s) => s.address === address && s.entity !== '')?.entity;
  const entitiesOf = (records: SharedClientRecord[]) =>
    new Set(records.flatMap((r) => [r.entity, r.address === undefined ? undefined : entityOf(r.address)]).filter((e) => e !== undefined));
  const spareEntities = entitiesOf(theirs);
  const shared = [...entitiesOf(mine)].filter((e) => spareEntities.has(e));
  if (shared.length > 0) {
    throw new LatchError(
      `volume ${volume}: the node to fence shares its cephx identity (client.${shared.join(', client.')}) with another holder ` +
        "of the volume, so the MDS cannot tell its sessions from that holder's; the hold stays. Give each node its own " +
        'identity (backend.clientId, docs/operations.md)',
    );
  }
  const onVolume = sessions.filter((s) => isOnVolume(s, group, volume));
  const taken = onVolume.filter((s) => !spareAddresses.has(s.address) && !(s.entity !== '' && spareEntities.has(s.entity)));
  const unnamed = taken.filter((s) => !isClientInstance(s.address));
  if (unnamed.length > 0) {
    throw new LatchError(
      `volume ${volume}: MDS session(s) ${unnamed.map((s) => `${s.id} on mds.${s.mds}`).join(', ')} of the volume are not ` +
        "another holder's, and name no single client instance (IPv4 IP:PORT/NONCE) to blocklist; the hold stays",
    );
  }
  return [...new Set([...knownAddresses, ...taken.map((s) => s.address)])].sort();
}

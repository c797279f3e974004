// latch volume unlink: removes a PV name's alias, the one way an alias changes (latch never redirects one: docs/
// operations.md, "Tenancy"). For an admin who points a PV at another volume: unlink, then change the PV's options.
import { checkPvName } from '../../names.js';
import { configOf, type CommandIO } from '../io.js';

export async function volumeUnlink(options: { pv: string }, io: CommandIO): Promise<void> {
  const pv = checkPvName(options.pv);
  const volume = await io.context(configOf(io)).ledger.unlinkPv(pv);
  io.out(volume === undefined ? `PV name ${pv} has no alias\n` : `PV name ${pv} no longer leads to volume ${volume}\n`);
}

// The ledger's key layout in a Store: `volumes/<volume>` holds a volume document, `pvs/<pv name>` the volume a PV
// name stands for when the two differ (the `volume` option).

/** The kinds of key the ledger keeps (a migration copies exactly these). */
export const LEDGER_KINDS = ['volumes', 'pvs'] as const;

export const volumeKey = (name: string): string => `volumes/${name}`;
export const pvKey = (pvName: string): string => `pvs/${pvName}`;

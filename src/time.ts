// Timestamps as latch writes them (the log, the ledger): ISO 8601 in UTC, to the millisecond.

/**
 * `date.toISOString()` (for years 0 to 9999), from the UTC fields: toISOString makes V8 load the local time zone (it
 * reads /etc/localtime through ICU, about 0.2 ms of every call that writes a time), which a UTC time does not need.
 */
export function isoTime(date: Date): string {
  const two = (n: number): string => String(n).padStart(2, '0');
  return (
    `${date.getUTCFullYear()}-${two(date.getUTCMonth() + 1)}-${two(date.getUTCDate())}T` +
    `${two(date.getUTCHours())}:${two(date.getUTCMinutes())}:${two(date.getUTCSeconds())}.` +
    `${String(date.getUTCMilliseconds()).padStart(3, '0')}Z`
  );
}

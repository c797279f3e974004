// Replaced at build time by build.mjs; "dev" when run from source (tests).
declare const LATCH_VERSION: string | undefined;
export const VERSION: string = typeof LATCH_VERSION === 'string' ? LATCH_VERSION : 'dev';

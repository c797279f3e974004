// A placeholder until the clone handler lands (it is written on another branch): the job fails saying so.
import { NotSupportedError } from '../../errors.js';
import type { JobHandler } from './types.js';

export const cloneJob: JobHandler<'clone'> = {
  kind: 'clone',
  run() {
    return Promise.reject(new NotSupportedError('clone jobs are not built into this latch yet'));
  },
};

// A placeholder until the restore handler lands (it is written on another branch): the job fails saying so.
import { NotSupportedError } from '../../errors.js';
import type { JobHandler } from './types.js';

export const restoreJob: JobHandler<'restore'> = {
  kind: 'restore',
  run() {
    return Promise.reject(new NotSupportedError('restore jobs are not built into this latch yet'));
  },
};

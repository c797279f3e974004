// A placeholder until the attach handler lands (it is written on another branch): the job fails saying so.
import { NotSupportedError } from '../../errors.js';
import type { JobHandler } from './types.js';

export const attachJob: JobHandler<'attach'> = {
  kind: 'attach',
  run() {
    return Promise.reject(new NotSupportedError('attach jobs are not built into this latch yet'));
  },
};

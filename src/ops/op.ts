// What a FlexVolume op is: its positional arguments, named and typed by kind (in the order of docs/protocol.md, "The calls"), whether it
// only exists in attach mode, and the function that serves it with the call's context and the parsed arguments.
import type { ArgKind } from '../contract/args.js';
import type { Reply } from '../contract/reply.js';
import type { Context } from '../context.js';

export type ArgKinds = Record<string, ArgKind<unknown>>;

/** The parsed values of an op's arguments, by name. */
export type ArgValues<A extends ArgKinds> = { [K in keyof A]: A[K] extends ArgKind<infer T> ? T : never };

export interface OpDefinition<A extends ArgKinds = ArgKinds> {
  /** Positional arguments after the op, in order. */
  readonly args: A;
  /** Only used in attach mode: with `attach: false` in the config the op answers Not supported. */
  readonly attachModeOnly?: boolean;
  /**
   * A call on the node (kubelet's): first settles the holds an earlier call on this node left marked (usually none:
   * one readdir), releasing those the kernel proves free (node/self-release.ts).
   */
  readonly releasesMarkedHolds?: boolean;
  run(ctx: Context, args: ArgValues<A>): Promise<Reply>;
}

export function defineOp<A extends ArgKinds>(definition: OpDefinition<A>): OpDefinition<A> {
  if (!definition.releasesMarkedHolds) return definition;
  return {
    ...definition,
    async run(ctx, args) {
      // Loaded here, not at the top: init, getvolumename and the controller's ops never pay for it.
      const { releaseMarkedHolds } = await import('../node/self-release.js');
      await releaseMarkedHolds(ctx);
      return definition.run(ctx, args);
    },
  };
}

// The one place that spawns child processes. Every child gets an argument array (never a shell), its own process
// group, captured stdout/stderr (the driver's stdout carries only its JSON reply) and a deadline after which the
// whole group is killed: kubelet gives most FlexVolume calls no timeout, so a hung mkfs would hang a volume forever.
// Each mechanism has its file in run/; this module is the one name the rest of latch imports them by.
export { run, type ChildDeadline, type RunOptions, type RunResult } from './run/run.js';
export { CommandError } from './run/command-error.js';
export { killAllChildren, runningChildren } from './run/process-groups.js';
export { startDaemon, daemonCommand } from './run/daemon.js';
export { toolSearchPath, findTool } from './run/search-path.js';
export { runStreaming, type StreamingChild } from './run/streaming.js';

// Where an image file holds data, so that a backup records the chunks in its holes without reading them: a 1 GiB
// volume 16% full is mostly holes, and reading and checking them for zeros cost more than the data itself. Node has
// no lseek(SEEK_DATA/SEEK_HOLE), so `xfs_io -r -c 'seek -a -r 0'` (xfsprogs, which latch needs for xfs anyway) asks
// the kernel for the map in one call; it works on any filesystem that supports SEEK_DATA (ext4, xfs, btrfs, tmpfs),
// counts dirty page-cache data as data, and is what `cp --sparse` relies on. A block device has no holes to ask
// about, and when xfs_io is missing or fails, the backup reads every byte as before: the map only saves reads,
// never decides what a chunk holds (a chunk with any data in it is read and checked like before).
import { run } from '../sys/run.js';

export interface ByteRange {
  offset: number;
  length: number;
}

/** The data ranges of the regular file at `path` (of `sizeBytes`), in order; undefined when they cannot be known. */
export async function dataRanges(path: string, sizeBytes: number): Promise<ByteRange[] | undefined> {
  let stdout: string;
  try {
    ({ stdout } = await run('xfs_io', ['-r', '-c', 'seek -a -r 0', '--', path], { timeoutMs: 60_000 }));
  } catch {
    return undefined;
  }
  return parseSeekMap(stdout, sizeBytes);
}

/**
 * Parses xfs_io's `seek -a -r` output: a header, then `DATA <offset>` and `HOLE <offset>` lines, each region running
 * to the next line's offset (the last to the end of the file). Anything unexpected gives undefined (read everything).
 */
export function parseSeekMap(output: string, sizeBytes: number): ByteRange[] | undefined {
  const lines = output.split('\n').filter((line) => line.trim() !== '');
  if (lines[0]?.trim().split(/\s+/).join(' ') !== 'Whence Result') return undefined;
  const marks: { data: boolean; offset: number }[] = [];
  for (const line of lines.slice(1)) {
    const match = /^(DATA|HOLE)\s+(\d+)$/.exec(line.trim());
    if (!match) return undefined;
    const offset = Number(match[2]);
    if (!Number.isSafeInteger(offset) || offset > sizeBytes || (marks.length > 0 && offset <= (marks.at(-1)?.offset ?? 0))) {
      return undefined;
    }
    marks.push({ data: match[1] === 'DATA', offset });
  }
  // An empty map from a non-empty file is not believable (xfs_io prints at least one region for it).
  if (marks.length === 0) return sizeBytes === 0 ? [] : undefined;
  if (marks[0]?.offset !== 0) return undefined;
  const ranges: ByteRange[] = [];
  for (const [i, mark] of marks.entries()) {
    const end = marks[i + 1]?.offset ?? sizeBytes;
    if (mark.data && end > mark.offset) ranges.push({ offset: mark.offset, length: end - mark.offset });
  }
  return ranges;
}

/** Whether any of the (ordered) ranges overlaps [offset, offset + length). */
export function overlapsData(ranges: ByteRange[], offset: number, length: number): boolean {
  // Binary search for the first range that ends after `offset`.
  let low = 0;
  let high = ranges.length;
  while (low < high) {
    const mid = (low + high) >>> 1;
    const range = ranges[mid];
    if (range !== undefined && range.offset + range.length <= offset) low = mid + 1;
    else high = mid;
  }
  const first = ranges[low];
  return first !== undefined && first.offset < offset + length;
}

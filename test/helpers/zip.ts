import { inflateRawSync } from 'node:zlib';

/**
 * Reads a zip archive (stored or deflated entries, no zip64) into path → content, through its
 * central directory, as an unzip tool does: enough to compare a downloaded archive with other files.
 */
export function readZip(archive: Buffer): Map<string, Buffer> {
  const END = 0x06054b50;
  let end = archive.length - 22;
  while (end >= 0 && archive.readUInt32LE(end) !== END) end--;
  if (end < 0) throw new Error('not a zip archive: no end of central directory');
  const count = archive.readUInt16LE(end + 10);
  let at = archive.readUInt32LE(end + 16);
  const files = new Map<string, Buffer>();
  for (let i = 0; i < count; i++) {
    if (archive.readUInt32LE(at) !== 0x02014b50) throw new Error(`bad central directory entry ${i}`);
    const method = archive.readUInt16LE(at + 10);
    const compressed = archive.readUInt32LE(at + 20);
    const nameLength = archive.readUInt16LE(at + 28);
    const extraLength = archive.readUInt16LE(at + 30);
    const commentLength = archive.readUInt16LE(at + 32);
    const local = archive.readUInt32LE(at + 42);
    const name = archive.subarray(at + 46, at + 46 + nameLength).toString('utf8');
    // The local header repeats the name and has its own extra field before the data.
    const data = local + 30 + archive.readUInt16LE(local + 26) + archive.readUInt16LE(local + 28);
    const raw = archive.subarray(data, data + compressed);
    if (method !== 0 && method !== 8) throw new Error(`${name}: compression method ${method}`);
    if (!name.endsWith('/')) files.set(name, method === 8 ? inflateRawSync(raw) : Buffer.from(raw));
    at += 46 + nameLength + extraLength + commentLength;
  }
  return files;
}

/**
 * Patches a GGUF file's metadata in place. Reading is left to the real readers (node-llama-cpp's
 * `readGgufFileInfo` in the server, ggml's `gguf_*` API in the trainer); neither writes into an existing file,
 * which restoring a fine-tuned model's context length needs.
 */
import fsp from "node:fs/promises";

/** Byte sizes of GGUF scalar value types (8 = string and 9 = array are variable). */
const scalarSize: Record<number, number> = {
  0: 1,
  1: 1,
  2: 2,
  3: 2,
  4: 4,
  5: 4,
  6: 4,
  7: 1,
  10: 8,
  11: 8,
  12: 8,
};
const UINT32 = 4;
const STRING = 8;

/** A cursor over the start of a GGUF file; throws a RangeError when the window ends before the header. */
class HeaderCursor {
  offset = 8;
  constructor(private readonly data: Buffer) {
    if (data.toString("latin1", 0, 4) !== "GGUF") throw new Error("not a GGUF file");
  }
  private need(n: number): void {
    if (this.offset + n > this.data.length) throw new RangeError("window");
  }
  u32(): number {
    this.need(4);
    const value = this.data.readUInt32LE(this.offset);
    this.offset += 4;
    return value;
  }
  u64(): number {
    this.need(8);
    const value = Number(this.data.readBigUInt64LE(this.offset));
    this.offset += 8;
    return value;
  }
  string(): string {
    const length = this.u64();
    this.need(length);
    const text = this.data.toString("utf8", this.offset, this.offset + length);
    this.offset += length;
    return text;
  }
  skipValue(type: number): void {
    if (type === STRING) this.string();
    else if (type === 9) {
      const itemType = this.u32();
      const count = this.u64();
      const size = scalarSize[itemType];
      if (size !== undefined) {
        this.need(count * size);
        this.offset += count * size;
      } else for (let i = 0; i < count; i++) this.skipValue(itemType);
    } else {
      const size = scalarSize[type];
      if (size === undefined) throw new Error(`unknown GGUF value type ${type}`);
      this.need(size);
      this.offset += size;
    }
  }
}

/**
 * Runs `parse` over the start of the file, growing the window until the part it reads (the header lies
 * before the tensor data, which is never read) fits.
 */
async function parseHeader<T>(file: fsp.FileHandle, parse: (cursor: HeaderCursor) => T): Promise<T> {
  for (let windowSize = 1 << 20; ; windowSize *= 4) {
    const buffer = Buffer.alloc(windowSize);
    const { bytesRead } = await file.read(buffer, 0, windowSize, 0);
    try {
      return parse(new HeaderCursor(buffer.subarray(0, bytesRead)));
    } catch (error) {
      if (error instanceof RangeError && bytesRead === windowSize) continue;
      throw error;
    }
  }
}

/** Where a metadata key's value sits in a GGUF file and its type, or undefined if the key is absent. */
function findValue(file: fsp.FileHandle, key: string): Promise<{ offset: number; type: number } | undefined> {
  return parseHeader(file, (cursor) => {
    cursor.u64(); // tensor count
    const kvCount = cursor.u64();
    for (let i = 0; i < kvCount; i++) {
      const name = cursor.string();
      const type = cursor.u32();
      if (name === key) return { offset: cursor.offset, type };
      cursor.skipValue(type);
    }
    return undefined;
  });
}

async function findUint32(file: fsp.FileHandle, key: string): Promise<number | undefined> {
  const found = await findValue(file, key);
  return found?.type === UINT32 ? found.offset : undefined;
}

/** Overwrites a uint32 metadata value in place (same size, so nothing else moves). Returns false if absent. */
export async function writeGgufUint32(path: string, key: string, value: number): Promise<boolean> {
  const file = await fsp.open(path, "r+");
  try {
    const offset = await findUint32(file, key);
    if (offset === undefined) return false;
    const buffer = Buffer.alloc(4);
    buffer.writeUInt32LE(value, 0);
    await file.write(buffer, 0, 4, offset);
    await file.sync();
    return true;
  } finally {
    await file.close();
  }
}
